"""nerkit: a Chinese named-entity recognition toolkit (BiLSTM, Transformer, TENER, FLAT + CRF).

`nerkit.load(DIR)` returns a pipeline with `predict(texts)` and `evaluate(path)`.
"""

from nerkit import cores
from nerkit.version import __version__  # noqa: F401 (the package's version, re-exported)

# OpenMP's wait policy is read once, when torch is first imported: it is chosen here, before any
# nerkit module imports torch, from how busy the cores are (nerkit/cores.py). A value the user set wins.
cores.configure()


def load(directory, device: str = "cpu"):
    """Load a model directory written by `nerkit train`, or one exported by `nerkit export` (which
    runs on ONNX Runtime, without torch)."""
    from nerkit.inference.loading import load_pipeline

    return load_pipeline(directory, device=device)
