"""Training: the loop in named steps (`loop`), building a pipeline from data (`build`), the optimiser
and learning-rate schedule (`schedule`), the run directory (`run_dir`) and whether a resume continues the same run (`resume`), crash-safe checkpoints
(`checkpoint`) and torchrun training (`distributed`)."""
