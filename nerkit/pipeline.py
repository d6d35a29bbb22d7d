"""The pipeline: a trained model with its config and featuriser, ready to use. It predicts spans
with offsets into the original text, evaluates on a gold corpus (the one evaluation path: training's
dev F1, `nerkit eval`, the Python API and `nerkit bench`), and owns the model directory (save and
load, safetensors + JSON/YAML only, never pickle). Building one from training data is train.py's."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from nerkit import __version__
from nerkit.config import Config, build_config, config_to_yaml
from nerkit.corpus import Sentence, Span, invalid_transition, split_tag, tags_to_spans
from nerkit.device import resolve_device
from nerkit.errors import ModelDirError, UserError
from nerkit.evaluate import errors, score
from nerkit.features import Featurizer, bucketed_batches, collate
from nerkit.files import atomic_directory, atomic_write_bytes, atomic_write_text
from nerkit.model import Tagger
from nerkit.splits import read_gold

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL_FILES = ("nerkit.json", "config.yaml", "vocab.json", "model.safetensors")
# Files that could carry pickled code: a model directory holding one is refused outright.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy", ".npz")


@dataclass
class Evaluation:
    """A model's predictions on gold sentences and their scores; `seconds`: prediction alone."""

    sentences: list[Sentence]
    predicted: list[list[Span]]
    metrics: dict  # precision, recall, f1, per_type (and errors, when asked for)
    seconds: float
    scheme: str  # the gold file's tag scheme (the model's, for sentences given in memory)


class Pipeline:
    def __init__(self, config: Config, featurizer: Featurizer, device: str | torch.device = "cpu", lm=None):
        """`lm`: the `nerkit.lm.CharFeatures` whose features join the embeddings (its vocabulary is the
        featuriser's `lm_vocab`), or None."""
        self.config = config
        self.featurizer = featurizer
        self.model = Tagger(config, **featurizer.sizes(), lm=lm)
        self.device = torch.device(device)
        self.model.to(self.device)

    @property
    def tags(self) -> list[str]:
        return self.featurizer.tags

    @property
    def scheme(self) -> str:
        return self.featurizer.scheme

    @property
    def types(self) -> list[str]:
        """The entity types the model predicts."""
        return sorted({split_tag(t)[1] for t in self.tags if t != "O"})

    # ------------------------------------------------------------------------------ prediction

    def predict_tokens(self, token_lists: list[list[str]], batch_size: int = 64) -> list[list[Span]]:
        """Spans for each token list. A list longer than `data.max_len` is read in overlapping
        windows of that length (`windows`) whose tag sequences are stitched into one (`stitch`), so
        that no entity is cut where a window ends. Whitespace never starts, ends or makes up an
        entity (`without_whitespace`): every prediction and evaluation passes here."""
        pieces: list[tuple[int, int, int]] = []  # (sentence index, window start, window end)
        for i, tokens in enumerate(token_lists):
            pieces.extend((i, a, b) for a, b in windows(len(tokens), self.config.data.max_len))
        examples = [self.featurizer.example(token_lists[i][a:b]) for i, a, b in pieces]
        decoded: list[list[str]] = [[] for _ in pieces]
        self.model.eval()
        with torch.inference_mode():
            for idx in bucketed_batches([len(e) for e in examples], batch_size):
                batch = collate([examples[j] for j in idx]).to(self.device)
                for j, tag_ids in zip(idx, self.model.decode(batch)):
                    decoded[j] = [self.tags[t] for t in tag_ids]
        by_sentence: list[list[tuple[int, list[str]]]] = [[] for _ in token_lists]  # (window start, tags)
        for (i, a, _), tags in zip(pieces, decoded):
            by_sentence[i].append((a, tags))
        return [without_whitespace(tokens, tags_to_spans(stitch(found, self.scheme))) if found else []
                for tokens, found in zip(token_lists, by_sentence)]

    def predict(self, texts: str | Iterable[str], batch_size: int = 64) -> list[list[dict]]:
        """Entities of each text: `{"start", "end", "type", "text"}`, offsets into the text, end
        exclusive. A single string is one text (its entities come back in a list of one)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"predict takes strings; text {i} is {type(text).__name__}: {text!r:.40}")
        spans = self.predict_tokens([list(t) for t in texts], batch_size)
        return [[{"start": s.start, "end": s.end, "type": s.type, "text": t[s.start:s.end]} for s in ss]
                for t, ss in zip(texts, spans)]

    # ------------------------------------------------------------------------------ evaluation


    def evaluation(self, data: str | Path | list[Sentence], batch_size: int = 128, repair: bool | None = None,
                   with_errors: bool = False) -> Evaluation:
        """Entity-level P/R/F1 of the model on a corpus file or on sentences already read; with
        `with_errors` the metrics also hold `errors` (see `nerkit.evaluate.errors`). A file is read
        as the model's training data was: `repair` None follows the model's `data.repair`, so a file
        the training repaired is repaired here too (and said so)."""
        if isinstance(data, list):
            sentences, scheme = data, self.scheme
        else:
            corpus = read_gold(data, self.config.data.repair if repair is None else repair,
                               "pass --repair (repair=True in Python)")
            sentences, scheme = corpus.sentences, corpus.scheme
            self.check_types(corpus.types, str(data))
        started = time.perf_counter()
        predicted = self.predict_tokens([s.tokens for s in sentences], batch_size)  # Python lists: GPU work done
        seconds = time.perf_counter() - started
        gold = [s.spans() for s in sentences]
        metrics = score(gold, predicted)
        if with_errors:
            metrics["errors"] = errors(gold, predicted)
        return Evaluation(sentences, predicted, metrics, seconds, scheme)

    def check_types(self, gold_types: list[str], where: str) -> None:
        """A gold file scored against a model of other entity types gives a table of zeros: an
        error when no type is shared, a warning naming the types that only one side has."""
        gold, model = set(gold_types), set(self.types)
        listed = f"the file's types: {', '.join(sorted(gold)) or 'none'}; the model's: {', '.join(sorted(model))}"
        if gold and not gold & model:
            raise UserError(f"the gold file shares no entity type with the model ({listed})", where=where,
                            fix="evaluate on a corpus labelled with the model's types "
                                "(renamed, if the file spells them otherwise)")
        if not gold:
            log.warning(f"{where}: the gold file has no entities: every prediction counts as spurious")
        elif gold != model:
            effects = []
            if gold - model:
                effects.append(f"{', '.join(sorted(gold - model))} can only be missed")
            if model - gold:
                effects.append(f"predicted {', '.join(sorted(model - gold))} can only be spurious")
            log.warning(f"{where}: the entity types differ ({listed}): {'; '.join(effects)}")

    def evaluate(self, data: str | Path | list[Sentence], batch_size: int = 128, repair: bool | None = None,
                 with_errors: bool = False) -> dict:
        """The metrics of `evaluation`: {"precision", "recall", "f1", "per_type"[, "errors"]}."""
        return self.evaluation(data, batch_size, repair, with_errors).metrics

    # ------------------------------------------------------------------------------ model directory

    def write_static_files(self, directory: Path) -> None:
        """Everything of a model directory but the weights and metrics."""
        lexicon = self.featurizer.lexicon
        atomic_write_text(directory / "nerkit.json", json.dumps(
            {"format_version": FORMAT_VERSION, "nerkit_version": __version__, "encoder": self.config.encoder.name,
             "lexicon_sha256": lexicon.fingerprint if lexicon is not None else None}, indent=2) + "\n")
        atomic_write_text(directory / "config.yaml", config_to_yaml(self.config))
        atomic_write_text(directory / "vocab.json", json.dumps(self.featurizer.to_json(), ensure_ascii=False) + "\n")
        if lexicon is not None:
            lexicon.save(directory / "lexicon.txt")
        if self.model.embedder.lm is not None:  # its config and vocabulary; the weights are in model.safetensors
            from nerkit.lm import save_lm

            save_lm(self.model.embedder.lm, directory, weights=False)

    def write_weights(self, directory: Path, metrics: dict | None = None) -> None:
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        # Serialised here and written by Python, so that a full disk is an OSError with its errno.
        data = safetensors_bytes(state, metadata={"format_version": str(FORMAT_VERSION)})
        atomic_write_bytes(directory / "model.safetensors", data)
        if metrics is not None:
            atomic_write_text(directory / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")

    def save(self, directory: str | Path, metrics: dict | None = None) -> Path:
        """Write a complete model directory atomically (a temporary directory, then one rename)."""
        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            self.write_static_files(tmp)
            self.write_weights(tmp, metrics or {})
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> "Pipeline":
        directory = Path(directory)
        check_model_dir(directory)
        meta = _read_json(directory / "nerkit.json")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ModelDirError(
                f"model format version {meta.get('format_version')!r}, but this nerkit reads version {FORMAT_VERSION}",
                where=str(directory / "nerkit.json"), fix="retrain the model with this nerkit version")
        import yaml

        try:
            raw = yaml.safe_load((directory / "config.yaml").read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            raise ModelDirError("config.yaml is not valid YAML", where=str(directory / "config.yaml")) from None
        if isinstance(raw, dict) and isinstance(raw.get("data") or {}, dict):
            # nerkit always writes data.normalize; a hand-edited file without it is read as the
            # models trained before it became true by default were.
            raw["data"] = {"normalize": False, **(raw.get("data") or {})}
        config = build_config(raw, str(directory / "config.yaml"))
        vocab = _read_json(directory / "vocab.json")
        lexicon = None
        if vocab.get("words") is not None:
            from nerkit.lexicon import Lexicon

            lexicon = Lexicon.load(directory / "lexicon.txt")
            if meta.get("lexicon_sha256") and lexicon.fingerprint != meta["lexicon_sha256"]:
                raise ModelDirError("lexicon.txt does not match the checksum the model was trained with",
                                    where=str(directory / "lexicon.txt"))
        lm = None
        if (directory / "lm").is_dir():
            from nerkit.lm import load_saved_lm

            lm = load_saved_lm(directory)
        featurizer = Featurizer.from_json(config, vocab, lexicon, where=str(directory / "vocab.json"),
                                          lm_vocab=lm.vocab if lm is not None else None)
        pipe = cls(config, featurizer, device=resolve_device(device), lm=lm)
        try:
            state = load_file(str(directory / "model.safetensors"), device="cpu")
        except Exception as e:  # safetensors raises its own error types for a broken header
            raise ModelDirError(f"model.safetensors cannot be read ({e})", where=str(directory / "model.safetensors"),
                                fix="the file is damaged or not a safetensors file; retrain or copy it again") from None
        expected = pipe.model.state_dict()
        problems = [k for k in expected if k not in state] + [k for k in state if k not in expected]
        problems += [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
                     if k in state and state[k].shape != v.shape]
        if problems:
            raise ModelDirError(f"model.safetensors does not match config.yaml and vocab.json: {', '.join(problems[:5])}",
                                where=str(directory / "model.safetensors"), fix="use the files of one training run together")
        pipe.model.load_state_dict(state)
        pipe.model.eval()
        return pipe


def without_whitespace(tokens: list[str], spans: list[Span]) -> list[Span]:
    """The decoding rule for whitespace: each entity without the whitespace tokens at its start and
    end, and none that is whitespace alone. A model that never saw a space in training (a
    char-per-line corpus has none) reads one as an unknown character, which may as well be part of
    a name; whatever it decides, a space is never the edge of an entity."""
    trimmed = []
    for span in spans:
        start, end = span.start, span.end
        while start < end and tokens[start].isspace():
            start += 1
        while end > start and tokens[end - 1].isspace():
            end -= 1
        if start < end:
            trimmed.append(Span(start, end, span.type))
    return trimmed


# ------------------------------------------------------------------------------ long texts
# A text longer than data.max_len is read in windows of max_len characters that overlap by half a
# window, so every character but those near the text's own ends has at least a quarter window of
# context on each side. Each pair of neighbouring windows hands over at a stitch point inside their
# overlap: the point nearest the overlap's middle (where a character is as central in one window as
# in the other) that is an entity boundary in both windows' tag sequences. Every entity then comes
# whole from one window, and the stitched sequence is valid because each window's is. Only when no
# point of the overlap is a boundary in both (an entity at least as long as the overlap) does the
# hand-over happen at the middle, where `_join` makes the two sequences meet validly.


def windows(length: int, max_len: int) -> list[tuple[int, int]]:
    """(start, end) of the windows over a text of `length` characters: one when it fits in
    `max_len` (or `max_len` is 0), else windows of exactly `max_len` characters, evenly spaced
    from the start to the end, each starting at most half a window after the previous one."""
    if length == 0:
        return []
    if max_len <= 0 or length <= max_len:
        return [(0, length)]
    stride = max_len - max_len // 2  # ceil(max_len / 2): overlaps of at least max_len // 2
    count = -(-(length - max_len) // stride) + 1
    starts = [k * (length - max_len) // (count - 1) for k in range(count)]
    return [(a, a + max_len) for a in starts]


def _is_boundary(tags: list[str], q: int) -> bool:
    """Whether no entity of the valid sequence `tags` crosses position `q` (between tags q-1 and q)."""
    return q <= 0 or q >= len(tags) or split_tag(tags[q])[0] not in ("I", "M", "E")


def stitch(found: list[tuple[int, list[str]]], scheme: str) -> list[str]:
    """One valid tag sequence from the tag sequences of overlapping windows, `(start, tags)` in
    order of their start as `windows` placed them: each window decides the characters between its
    stitch points with its neighbours (see the comment above)."""
    tags: list[str] = []
    joins = []  # stitch points where the two windows do not share a boundary
    taken = 0  # characters of the text decided so far
    for (a0, left), (a1, right) in zip(found, found[1:]):
        b0 = a0 + len(left)
        middle = a1 + b0  # twice the overlap's middle, in integers
        points = range(max(a1, taken), b0 + 1)
        shared = [p for p in points if _is_boundary(left, p - a0) and _is_boundary(right, p - a1)]
        if shared:
            point = min(shared, key=lambda p: (abs(2 * p - middle), p))
        else:
            point = min(max(middle // 2, points.start), points.stop - 1)
            joins.append(point)
        tags += left[taken - a0:point - a0]
        taken = point
    last_start, last = found[-1]
    tags += last[taken - last_start:]
    for point in joins:
        _join(tags, point, scheme)
    return tags


def _join(tags: list[str], point: int, scheme: str) -> None:
    """Make `tags[point - 1] -> tags[point]`, two windows' decisions, a valid transition, changing
    only those two tags and keeping each valid with its other neighbour. An entity that one window
    ends at the stitch point and the other continues across it becomes one entity; otherwise a
    continuation without its start starts there, and an entity left open is closed."""
    if point <= 0 or point >= len(tags) or not invalid_transition(tags[point - 1], tags[point], scheme):
        return
    (lp, lt), (rp, rt) = split_tag(tags[point - 1]), split_tag(tags[point])
    inside = "M" if scheme == "bmes" else "I"
    if rp in ("I", "M", "E") and lp in ("E", "S") and lt == rt:  # ended on the left, continued on the right
        tags[point - 1] = f"{inside}-{lt}" if lp == "E" else f"B-{lt}"
        return
    if rp in ("I", "M", "E"):  # a continuation that nothing on the left opens: it starts here
        tags[point] = f"B-{rt}" if rp != "E" else f"S-{rt}"
    if scheme != "bio" and lp in ("B", "I", "M"):  # an entity the left window leaves open: it ends here
        tags[point - 1] = f"S-{lt}" if lp == "B" else f"E-{lt}"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelDirError("not valid JSON", where=str(path), fix="the model directory is damaged; retrain") from None


def check_model_dir(directory: Path) -> None:
    if not directory.exists():
        raise ModelDirError("model directory not found", where=str(directory),
                            fix="pass the --out directory of `nerkit train`")
    if not directory.is_dir():
        raise ModelDirError("not a directory", where=str(directory), fix="pass the model directory, not a file in it")
    lm_dir = directory / "lm"  # a language model's config and vocabulary, when the model has one
    unsafe = sorted(str(p.relative_to(directory)) for d in (directory, lm_dir) if d.is_dir()
                    for p in d.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if unsafe:
        raise ModelDirError(f"refusing a model directory that holds pickle-capable files: {', '.join(unsafe)}",
                            where=str(directory), fix="nerkit models are safetensors + JSON/YAML; remove those files")
    root = directory.resolve()
    for name in MODEL_FILES + ("lexicon.txt",):  # every file the loader reads
        path = directory / name
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise ModelDirError(f"{name} is a link to {path.resolve()}, outside the model directory",
                                where=str(directory), fix="copy the file into the directory instead of linking to it")
    for name in MODEL_FILES:
        if not (directory / name).is_file():
            raise ModelDirError(f"{name} is missing", where=str(directory),
                                fix="this is not a complete nerkit model directory (was training interrupted?)")
