"""nerkit: a Chinese named-entity recognition toolkit (BiLSTM, Transformer, TENER, FLAT + CRF)."""

__version__ = "0.1.0"
