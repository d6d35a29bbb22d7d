"""Applying a trained model: what every runtime shares, prediction and the one evaluation path
(`predictor`, scoring in `evaluate`), the torch pipeline that `nerkit.load` returns (`pipeline`), an
exported model on ONNX Runtime without torch (`onnx_runtime`), the choice between them (`loading`),
the model directory (`model_dir`), the span head's threshold chosen on a dev set (`span_threshold`), long texts in windows stitched into one valid tag sequence
(`windows`), streaming prediction over files (`stream`) with worker processes (`workers`), the output
formats (`formats`, `html`), and the web service of `nerkit serve` (`server`, with its micro-batching
in `batcher` and its shutdown that loses no kept-alive request in `draining`). Never imports training."""
