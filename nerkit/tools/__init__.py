"""Commands around training and prediction, a folder per concern: helping people annotate
(`annotation`: what to label next, scores made honest), the ONNX export (`onnx`), benchmarks
(`bench`), reports and figures (`reports`), the pretrained resources a model reads (`resources`:
lexicons mined from text, static vectors, a language model adapted to a domain), and distillation
(`distill`), which trains a student with the training loop."""
