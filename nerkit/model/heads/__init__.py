"""The heads, by config name: `HEADS` gives each name of `nerkit.config.HEAD_TRAITS` (the one list of
names, with what each head can do, torch-free) the class that builds it. Each follows `base.Head`;
tests/test_heads.py checks every one alike."""

from nerkit.config import HEAD_TRAITS
from nerkit.model.heads.base import Head
from nerkit.model.heads.crf import CrfHead
from nerkit.model.heads.span import GlobalPointerHead

_CLASSES = {
    "crf": CrfHead,  # one tag per character, a constrained CRF
    "span": GlobalPointerHead,  # nested and overlapping spans (GlobalPointer)
}

HEADS = {name: _CLASSES[name] for name in HEAD_TRAITS}

__all__ = ["HEADS", "Head"]
