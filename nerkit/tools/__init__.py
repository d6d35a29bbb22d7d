"""Tools around training and prediction: the HTML report (`report`), figures (`plot`), the benchmark
matrix (`bench/`), training or exporting static vectors (`vectors`), and the ONNX export of a model
(`export`, with the graphs it writes node by node in `onnx_graphs`)."""
