"""nerkit: a Chinese named-entity recognition toolkit (BiLSTM, Transformer, TENER, FLAT + CRF).

`nerkit.load(DIR)` returns a pipeline with `predict(texts)` and `evaluate(path)`.
"""

import os

__version__ = "0.1.0"

# OpenMP threads that finish their share of an operator spin, waiting for the next one, unless the
# wait policy is passive. Alone that saves microseconds; beside another busy process on the same
# cores the spinning threads take each other's time and training ran 10-20x slower (docs/BENCHMARKS.md,
# "Shared cores"). torch's OpenMP reads the policy once, when torch is first imported, so it is set
# here, before any nerkit module imports torch; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def load(directory, device: str = "cpu"):
    """Load a model directory written by `nerkit train`."""
    from nerkit.pipeline import Pipeline

    return Pipeline.load(directory, device=device)
