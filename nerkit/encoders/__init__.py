"""The encoders, by config name. Each takes `(input_dim, config)`, plus `word_dim` when it `uses_lattice`,
exposes `output_dim`, and maps `forward(x (B, T, D), mask (B, T) bool, lattice=None) -> (B, T, output_dim)`;
`Config` is its dataclass."""

from nerkit.encoders.bilstm import BiLSTM
from nerkit.encoders.flat import FLAT
from nerkit.encoders.relative import RelativeTransformer
from nerkit.encoders.transformer import Transformer

ENCODERS = {
    "bilstm": BiLSTM,
    "transformer": Transformer,
    "tener": RelativeTransformer,
    "flat": FLAT,
}
