"""The encoders, by config name: `ENCODERS` is the one registry (their options are
`nerkit.config.ENCODER_OPTIONS`, under the same names). Each follows `base.Encoder`."""

from nerkit.model.encoders.base import Encoder, LatticeWords
from nerkit.model.encoders.bilstm import BiLSTM
from nerkit.model.encoders.flat import FLAT
from nerkit.model.encoders.none import NoEncoder
from nerkit.model.encoders.transformer import Transformer

ENCODERS = {
    "bilstm": BiLSTM,
    "transformer": Transformer,  # attention: absolute
    "tener": Transformer,  # attention: tener | xl | shaw
    "flat": FLAT,
    "none": NoEncoder,  # embeddings straight to the CRF (LM + CRF)
}


__all__ = ["ENCODERS", "Encoder", "LatticeWords"]
