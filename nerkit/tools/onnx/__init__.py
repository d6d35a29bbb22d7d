"""A model as an ONNX graph with its decoding inside (`export`), and the graphs it writes node by node
where torch's exporter has no counterpart (`graphs`: the constrained Viterbi, FLAT's lattice scores)."""
