"""nerkit: a Chinese named-entity recognition toolkit (BiLSTM, Transformer, TENER, FLAT + CRF).

`nerkit.load(DIR)` returns a pipeline with `predict(texts)` and `evaluate(path)`.
"""

import os

from nerkit.version import __version__  # noqa: F401 (the package's version, re-exported)

# OpenMP threads that finish their share of an operator spin, waiting for the next one, unless the
# wait policy is passive. Alone, spinning made a BiLSTM step about 1.5x faster; beside another busy
# process on the same cores the spinning threads take each other's time, and two runs did 4.7x less
# work than passive ones (docs/BENCHMARKS.md, "Shared cores"). torch's OpenMP reads the policy once,
# when torch is first imported, so it is set here, before any nerkit module imports torch; a value
# the user set (OMP_WAIT_POLICY=ACTIVE for a machine of one's own) is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def load(directory, device: str = "cpu"):
    """Load a model directory written by `nerkit train`."""
    from nerkit.inference.pipeline import Pipeline

    return Pipeline.load(directory, device=device)
