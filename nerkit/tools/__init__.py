"""Tools around training and prediction: the HTML report (`report`), figures (`plot`), the benchmark
matrix (`bench/`) and training or exporting static vectors (`vectors`)."""
