"""nerkit: a Chinese named-entity recognition toolkit (BiLSTM, Transformer, TENER, FLAT + CRF).

`nerkit.load(DIR)` returns a pipeline with `predict(texts)` and `evaluate(path)`.
"""

__version__ = "0.1.0"


def load(directory, device: str = "cpu"):
    """Load a model directory written by `nerkit train`."""
    from nerkit.pipeline import Pipeline

    return Pipeline.load(directory, device=device)
