"""The network: the embedder and tagger (`tagger`), the encoders (`encoders/`) and the heads
(`heads/`: the constrained CRF of `crf`, the span head of `span`), each picked from one dict by its
config name. Pure modules: tensors in, tensors out, no file I/O; a language model arrives as an
`nn.Module`."""
