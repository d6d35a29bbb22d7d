"""Training: the loop in named steps (`loop`), building a pipeline from data (`build`), the optimiser
and learning-rate schedule (`schedule`), the run directory (`run_dir`) and whether a resume continues the same run (`resume`), crash-safe checkpoints
(`checkpoint`), torchrun training (`distributed`), and the targets of two more sources of learning:
a teacher's on unlabelled text (`distill`, `distill_cache`) and a trained model's while it grows by
new entity types (`grow`)."""
