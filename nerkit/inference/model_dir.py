"""What a model directory must hold before anything in it is read: its files, no pickle-capable files,
no links out of it, and the format version it was written with."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nerkit.errors import ModelDirError
from nerkit.files import atomic_write_text

FORMAT_VERSION = 1


# The names of a model directory's files, here and nowhere else.
META_FILE = "nerkit.json"  # the format version, runtime, tag set and what ties the files together
CONFIG_FILE = "config.yaml"  # the resolved config it was trained with
VOCAB_FILE = "vocab.json"  # the featuriser's vocabularies
WEIGHTS_FILE = "model.safetensors"  # the network's weights
LEXICON_FILE = "lexicon.txt"  # a lattice encoder's lexicon, when the model has one


MODEL_FILES = (META_FILE, CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE)


# A directory exported by `nerkit export` (nerkit.json's `runtime: onnx`) holds the graph instead of the weights.
ONNX_FILE = "model.onnx"


ONNX_MODEL_FILES = (META_FILE, CONFIG_FILE, VOCAB_FILE, ONNX_FILE)


# An export's CRF scores (start, transitions, end), for its entity scores in numpy (absent in exports
# written before nerkit scored entities: they predict without scores).
CRF_FILE = "crf.safetensors"


RUNTIMES = ("torch", "onnx")


# What `nerkit export` writes (a directory whose nerkit.json says `runtime: onnx`), and how it may
# store its weights (`--quantize`).
EXPORT_FORMATS = ("onnx",)


QUANTIZE = ("int8",)


# nerkit.json's key for the temperature that divides the CRF's scores when entities are scored
# (written by `nerkit calibrate`; absent: 1).
SCORE_TEMPERATURE = "score_temperature"


# nerkit.json's key for the span head's threshold that `nerkit calibrate` chose on a dev set, which
# replaces config.yaml's span.threshold when the model predicts (absent: span.threshold).
SPAN_THRESHOLD = "span_threshold"

# nerkit.json's key for the map of the span head's scores that `nerkit calibrate` fitted on a dev set
# (Platt's: a span of band logit x is scored sigmoid(scale * x + shift); absent: the head's own).
# The threshold beside it is on the mapped scale, so the same spans are predicted.
SPAN_SCORE_MAP = "span_score_map"
SCORE_MAP_KEYS = ("scale", "shift")  # its JSON object's keys, in the order of the (scale, shift) pair


def score_map_json(score_map: tuple[float, float]) -> dict:
    """A span score map (scale, shift) as nerkit.json, the server and records write it."""
    return dict(zip(SCORE_MAP_KEYS, score_map))


# What a model directory whose files disagree asks for, whichever file the disagreement is found in.
ONE_RUN_FIX = "use the files of one training run together"


def vocab_fingerprint(vocab: dict) -> str:
    """The sha256 of vocab.json's content (keys sorted, so that it does not depend on how the file is
    laid out): nerkit.json's `vocab_sha256`, which ties the vocabulary to the weights or graph written
    with it."""
    text = json.dumps(vocab, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def runtime(meta: dict) -> str:
    """What runs a model directory, from its nerkit.json: `torch` (as trained) or `onnx` (exported)."""
    return meta.get("runtime", "torch")


# Files that could carry pickled code: a model directory holding one is refused outright.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy", ".npz")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelDirError("not valid JSON", where=str(path), fix="the model directory is damaged; retrain") from None


def write_meta_file(directory: Path, meta: dict) -> Path:
    """DIRECTORY/nerkit.json written as `meta` (UTF-8 text, indented), replaced atomically; its path."""
    path = directory / META_FILE
    atomic_write_text(path, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return path


def update_meta(directory: Path, values: dict) -> Path:
    """Set keys of DIRECTORY/nerkit.json (what `nerkit calibrate` fits: `score_temperature`, or
    `span_threshold` with `span_score_map`; what a distilled student learnt from: `distilled_from`),
    the file replaced atomically, all of them at once; its path."""
    meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    meta.update(values)
    return write_meta_file(directory, meta)


def check_model_dir(directory: Path, files: tuple[str, ...] = MODEL_FILES) -> None:
    """`directory` exists, holds `files` (MODEL_FILES, or ONNX_MODEL_FILES for an export) and
    nothing pickle-capable, and none of them links out of it."""
    if not directory.exists():
        raise ModelDirError("model directory not found", where=str(directory),
                            fix="pass the --out directory of `nerkit train`")
    if not directory.is_dir():
        raise ModelDirError("not a directory", where=str(directory), fix="pass the model directory, not a file in it")
    lm_dir = directory / "lm"  # a language model's config and vocabulary, when the model has one
    stacked = [d for d in lm_dir.iterdir() if d.is_dir()] if lm_dir.is_dir() else []  # lm/0/, lm/1/, ...: a stack's
    unsafe = sorted(str(p.relative_to(directory)) for d in (directory, lm_dir, *stacked) if d.is_dir()
                    for p in d.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if unsafe:
        raise ModelDirError(f"refusing a model directory that holds pickle-capable files: {', '.join(unsafe)}",
                            where=str(directory), fix="nerkit models are safetensors + JSON/YAML; remove those files")
    root = directory.resolve()
    for name in files + (LEXICON_FILE,):  # every file the loader reads
        path = directory / name
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise ModelDirError(f"{name} is a link to {path.resolve()}, outside the model directory",
                                where=str(directory), fix="copy the file into the directory instead of linking to it")
    for name in files:
        if not (directory / name).is_file():
            raise ModelDirError(f"{name} is missing", where=str(directory),
                                fix="this is not a complete nerkit model directory (was training interrupted?)")
