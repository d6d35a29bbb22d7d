"""The network: the embedder and tagger (`tagger`), the constrained CRF (`crf`) and the encoders
(`encoders/`, one dict registry). Pure modules: tensors in, tensors out, no file I/O; a language model
arrives as an `nn.Module`."""
