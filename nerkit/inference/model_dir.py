"""A model directory: the names of its files, what it must hold before anything in it is read (its
files, no pickle-capable files, no links out of it), and what it says it is (`ModelDir`, its
nerkit.json read once: the runtime it asks for, the format version, what calibration fitted)."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
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
METRICS_FILE = "metrics.json"  # what training measured: the best epoch's dev scores, then the final ones


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


# Files that could carry pickled code: a model directory holding one is refused outright.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy", ".npz")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelDirError("not valid JSON", where=str(path), fix="the model directory is damaged; retrain") from None


def read_metrics(directory: Path) -> dict:
    """The run in `directory`'s metrics.json (a model directory's, or a run's stopped midway)."""
    return json.loads((Path(directory) / METRICS_FILE).read_text(encoding="utf-8"))


def write_meta_file(directory: Path, meta: dict) -> Path:
    """DIRECTORY/nerkit.json written as `meta` (UTF-8 text, indented), replaced atomically; its path."""
    path = directory / META_FILE
    atomic_write_text(path, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    return path


def update_meta(directory: Path, values: dict) -> Path:
    """Set keys of DIRECTORY/nerkit.json (what `nerkit calibrate` fits: `score_temperature`, or
    `span_threshold` with `span_score_map`; what a distilled student learnt from: `distilled_from`),
    the file replaced atomically, all of them at once; its path."""
    meta = _read_json(directory / META_FILE)  # there already: a directory without one is no model's
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


@dataclass(frozen=True)
class ModelDir:
    """What a model directory says it is, its nerkit.json read once (`ModelDir.read`) and each value
    checked as it is asked for: prediction, serving, export, calibration and distillation ask this,
    never the file. A directory without nerkit.json reads as an empty one (loading then says what is
    missing)."""

    path: Path
    meta: dict  # nerkit.json as written ({} when there is none)

    @classmethod
    def read(cls, directory: str | Path) -> "ModelDir":
        path = Path(directory)
        meta_path = path / META_FILE
        return cls(path, _read_json(meta_path) if meta_path.is_file() else {})

    @property
    def runtime(self) -> str:
        """What runs it: `torch` (as `nerkit train` wrote it) or `onnx` (as `nerkit export` did); for
        a directory without nerkit.json, what its files say (a graph and no weights: `onnx`)."""
        if not self.meta and (self.path / ONNX_FILE).is_file() and not (self.path / WEIGHTS_FILE).is_file():
            return "onnx"
        return self.meta.get("runtime", "torch")

    @property
    def is_export(self) -> bool:
        return self.runtime == "onnx"

    @property
    def weights(self) -> Path:
        """The file of its network: the weights, or an export's graph."""
        return self.path / (ONNX_FILE if self.is_export else WEIGHTS_FILE)

    @property
    def where(self) -> str:
        return str(self.path / META_FILE)

    def check_format(self) -> None:
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise ModelDirError(f"model format version {self.meta.get('format_version')!r}, but this nerkit reads "
                                f"version {FORMAT_VERSION}", where=self.where,
                                fix="retrain the model with this nerkit version")

    @property
    def score_temperature(self) -> float:
        """`score_temperature` (written by `nerkit calibrate`), 1 when absent."""
        found = self.meta.get(SCORE_TEMPERATURE, 1.0)
        if isinstance(found, bool) or not isinstance(found, (int, float)) or not 0 < found < float("inf"):
            raise ModelDirError(f"{SCORE_TEMPERATURE} is {found!r}, not a positive number", where=self.where,
                                fix="run `nerkit calibrate` again, or remove the key to score at temperature 1")
        return float(found)

    @property
    def span_threshold(self) -> float | None:
        """`span_threshold` (written by `nerkit calibrate` or training), None when absent."""
        found = self.meta.get(SPAN_THRESHOLD)
        if found is not None and (isinstance(found, bool) or not isinstance(found, (int, float)) or not 0 < found < 1):
            raise ModelDirError(f"{SPAN_THRESHOLD} is {found!r}, not a probability between 0 and 1", where=self.where,
                                fix="run `nerkit calibrate` again, or remove the key to predict at config.yaml's "
                                    "span.threshold")
        return None if found is None else float(found)

    @property
    def span_score_map(self) -> tuple[float, float] | None:
        """`span_score_map` (written by `nerkit calibrate` or training) as (scale, shift), None when absent."""
        found = self.meta.get(SPAN_SCORE_MAP)
        if found is None:
            return None
        numbers = [found.get(k) for k in SCORE_MAP_KEYS] if isinstance(found, dict) else []
        if (len(numbers) != 2 or any(isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n)
                                     for n in numbers) or not numbers[0] > 0):
            raise ModelDirError(f"{SPAN_SCORE_MAP} is {found!r}, not {{\"scale\": a positive number, \"shift\": a "
                                f"number}}", where=self.where, fix="run `nerkit calibrate` again, or remove the key "
                                                                   "to score spans by the head's own probabilities")
        return float(numbers[0]), float(numbers[1])

    @property
    def train_max_len(self) -> int | None:
        """The longest training sentence; None when absent (a directory written before nerkit saved
        it: its window stays data.max_len)."""
        found = self.meta.get("train_max_len")
        if found is None:
            return None
        if isinstance(found, bool) or not isinstance(found, int) or found < 1:
            raise ModelDirError(f"train_max_len is {found!r}, not a length in characters", where=self.where,
                                fix="the model directory is damaged; remove the key to predict in windows of "
                                    "data.max_len")
        return found

    def check_vocab(self, vocab: dict) -> None:
        """vocab.json is the one the model was written with, when nerkit.json records its checksum
        (`vocab_sha256`, which `nerkit train` and `nerkit export` write): a vocabulary of another model
        would feed the weights ids they were never trained on, or ids past their tables. A directory
        without the checksum is checked by shapes instead (Pipeline.load, OnnxPipeline.load)."""
        recorded = self.meta.get("vocab_sha256")
        if recorded is not None and vocab_fingerprint(vocab) != recorded:
            raise ModelDirError("vocab.json is not the vocabulary this model was written with (its checksum "
                                "differs from nerkit.json's vocab_sha256)", where=str(self.path / VOCAB_FILE),
                                fix=ONE_RUN_FIX)
