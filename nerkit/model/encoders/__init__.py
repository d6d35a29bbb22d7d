"""The encoders, by config name: `ENCODERS` gives each name of `nerkit.config.ENCODER_OPTIONS` (the
one list of names) the module that its options build; a name that is another's alias with other
defaults (`tener`, a `transformer`) builds that one's module. Each follows `base.Encoder`."""

from nerkit.config import ENCODER_ALIASES, ENCODER_OPTIONS
from nerkit.model.encoders.base import Encoder, LatticeWords
from nerkit.model.encoders.bilstm import BiLSTM
from nerkit.model.encoders.flat import FLAT
from nerkit.model.encoders.none import NoEncoder
from nerkit.model.encoders.transformer import Transformer

_MODULES = {
    "bilstm": BiLSTM,
    "transformer": Transformer,  # any attention, absolute or relative
    "flat": FLAT,
    "none": NoEncoder,  # embeddings straight to the CRF (LM + CRF)
}

ENCODERS = {name: _MODULES[ENCODER_ALIASES.get(name, name)] for name in ENCODER_OPTIONS}


__all__ = ["ENCODERS", "Encoder", "LatticeWords"]
