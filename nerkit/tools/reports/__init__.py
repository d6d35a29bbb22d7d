"""What a person reads about a model: the self-contained HTML report (`report`), figures (`plot`) and
the memory figure of a training run (`plot_memory`)."""
