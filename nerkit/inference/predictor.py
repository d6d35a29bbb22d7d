"""What every way of running a trained model shares, without torch: `Predictor` turns texts into spans
with offsets (windows, featurisation, batches, stitching, the whitespace rule) and scores gold
corpora (the one evaluation path: training's dev F1, `nerkit eval`, the Python API and `nerkit
bench`); a subclass only decodes a list of examples into tag ids: `Pipeline` (nerkit.inference.pipeline)
with torch, `OnnxPipeline` (nerkit.inference.onnx_runtime) with ONNX Runtime. `read_model_dir` reads
what both find in a model directory beside the weights: nerkit.json, config.yaml, vocab.json, lexicon.txt."""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from nerkit.config import Config, HeadTraits, build_config, head_traits, memory_segment
from nerkit.data.corpus import refuse_partial
from nerkit.data.records import Sentence
from nerkit.data.splits import read_gold
from nerkit.data.tags import SCORE_DIGITS, Span, spans_to_tags, split_tag, tags_to_spans
from nerkit.errors import ModelDirError, UserError
from nerkit.features.featurizer import Example, Featurizer
from nerkit.inference.evaluate import by_length, calibration, errors, nesting_errors, score
from nerkit.inference.model_dir import (
    CONFIG_FILE,
    LEXICON_FILE,
    MODEL_FILES,
    VOCAB_FILE,
    ModelDir,
    _read_json,
    check_model_dir,
)
from nerkit.inference.windows import check_window, stitch, text_windows

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """A model's predictions on gold sentences and their scores; `seconds`: prediction alone."""

    sentences: list[Sentence]
    predicted: list[list[Span]]
    metrics: dict  # precision, recall, f1, per_type (and errors, when asked for)
    seconds: float
    scheme: str  # the gold file's tag scheme (the model's, for sentences given in memory)


class Predictor:
    """A model with its config and featuriser; a subclass says how a batch of examples is decoded
    (`decode_examples`)."""

    def __init__(self, config: Config, featurizer: Featurizer):
        self.config = config
        self.featurizer = featurizer
        # The longest training sentence (a piece of at most data.max_len), in characters: set by
        # training, saved in nerkit.json; None for a model directory written before it was saved.
        self.train_max_len: int | None = None
        self.model_dir: ModelDir | None = None  # what the directory `load` read says it is (None: built in memory)
        # Divides the CRF's scores when entities are scored: 1, or what `nerkit calibrate` fitted on a dev set.
        self.score_temperature = 1.0
        # The span head's threshold that `nerkit calibrate` chose on a dev set (nerkit.json's
        # span_threshold), or None: config.yaml's span.threshold.
        self.span_threshold: float | None = None
        # The span head's fitted map of its band logits, (scale, shift), or None: the head's own
        # (nerkit.json's span_score_map, which `nerkit calibrate` writes).
        self.span_score_map: tuple[float, float] | None = None

    def read_settings(self, found: ModelDir) -> None:
        """What its nerkit.json sets beside the weights: the training lengths, what calibration fitted,
        and where it was read from."""
        self.train_max_len = found.train_max_len
        self.score_temperature = found.score_temperature
        self.span_threshold = found.span_threshold
        self.span_score_map = found.span_score_map
        self.model_dir = found

    def mapped_band(self, band):
        """The span head's band logits (numpy or torch, any shape) on the scale its scores and
        threshold are read on: `span_score_map` applied, or as they are."""
        if self.span_score_map is None:
            return band
        scale, shift = self.span_score_map
        return band * scale + shift

    @property
    def directory(self) -> Path | None:
        """Where `load` read it from (None: built in memory)."""
        return self.model_dir.path if self.model_dir is not None else None

    @property
    def head(self) -> HeadTraits:
        """What the model's head can do (`nerkit.config.HeadTraits`): what callers ask, never its name."""
        return head_traits(self.config)

    @property
    def tags(self) -> list[str]:
        return self.featurizer.tags

    @property
    def scheme(self) -> str:
        return self.featurizer.scheme

    @property
    def threshold(self) -> float:
        """The probability above which the span head predicts a span: the calibrated one, else span.threshold."""
        return self.config.span.threshold if self.span_threshold is None else self.span_threshold

    @property
    def types(self) -> list[str]:
        """The entity types the model predicts."""
        return sorted({split_tag(t)[1] for t in self.tags if t != "O"})

    # ------------------------------------------------------------------------------ prediction

    @property
    def window(self) -> int:
        """The default prediction window, in characters (0: a text is read whole): the longest
        sentence the model was trained on, never above `data.max_len` when that is set (0 there is
        no limit); `data.max_len` for a model directory that does not record training lengths; 0
        for a model with Transformer-XL memory (`encoder.memory`), which reads any length."""
        if memory_segment(self.config):  # it reads any length segment by segment
            return 0
        limit = self.config.data.max_len
        if self.train_max_len is None:
            return limit
        return min(self.train_max_len, limit) if limit > 0 else self.train_max_len

    def check_window(self, window: int | None) -> int:
        """The window to predict with: `window`, checked, or the model's default (`window` None). An
        encoder with learned positions reads at most `encoder.max_positions` characters at once
        (data.max_len is kept within them when the config loads)."""
        if window is None:
            return self.window
        check_window(window)
        options = self.config.encoder.options
        if getattr(options, "attention", None) == "learned" and not 0 < window <= options.max_positions:
            raise UserError(f"this model's encoder (attention: learned) reads at most encoder.max_positions = "
                            f"{options.max_positions} characters at once, not a window of {window} (0: a whole text)",
                            fix=f"use a window of 1 to {options.max_positions}")
        return window

    def decode_examples(self, examples: list[Example], batch_size: int, window: int,
                        scores: bool = False, trim: bool = False) -> list:
        """The entities of each example, whatever the head, in the one shape of nerkit.model.decoded:
        (start, end exclusive, type index, score or None), decoded in batches of at most `batch_size`
        padded to a few shapes (`nerkit.features.padding.padded_examples`, never past `window` unless
        an example is longer), so that native caches keyed by the shape stop growing with the input;
        with `trim`, each batch padded only to its longest example (a corpus scored once, whose
        shapes are as many as its batches). With `scores`, each entity carries its probability."""
        raise NotImplementedError

    def predict_tokens(self, token_lists: list[list[str]], batch_size: int = 64,
                       window: int | None = None, scores: bool = False, trim: bool = False) -> list[list[Span]]:
        """Spans for each token list (`trim`: as `decode_examples`). A list longer than the window (`window`, default the model's:
        `Predictor.window`) is read in overlapping windows of that length (`text_windows`) whose tag
        sequences are stitched into one (`stitch`), so that no entity is cut where a window ends.
        Whitespace never starts, ends or makes up an entity (`without_whitespace`): every
        prediction and evaluation passes here. With `scores`, each span carries its probability,
        from the window that decided it (`scored_spans`)."""
        window = self.check_window(window)
        pieces: list[tuple[int, int, int]] = []  # (sentence index, window start, window end)
        for i, tokens in enumerate(token_lists):
            pieces.extend((i, a, b) for a, b in text_windows(len(tokens), window))
        examples = [self.featurizer.example(token_lists[i][a:b]) for i, a, b in pieces]
        decoded = self.decode_examples(examples, batch_size, window, scores, trim) if examples else []
        stitched = self.stitched_tags if self.head.has_tags else self.stitched_spans
        return stitched(token_lists, pieces, decoded, scores)

    def stitched_tags(self, token_lists: list, pieces: list[tuple[int, int, int]], decoded: list,
                      scores: bool) -> list[list[Span]]:
        """A head with tags' `predict_tokens`: each text's windows' entities as the tag sequence they
        are (a head with tags decodes valid sequences only) stitched into one (`stitch`), and with
        `scores` each entity scored by the window that decided it (`scored_spans`)."""
        types = self.featurizer.types
        by_sentence: list[list[tuple[int, list[str]]]] = [[] for _ in token_lists]  # (window start, tags)
        window_spans: list[list[tuple[int, int, list[Span]]]] = [[] for _ in token_lists]  # (start, end, scored)
        for (i, a, b), result in zip(pieces, decoded):
            found = [Span(s, e, types[k], p) for s, e, k, p in result]
            by_sentence[i].append((a, spans_to_tags(b - a, found, self.scheme)))
            if scores:
                window_spans[i].append((a, b, found))
        spans = [tags_to_spans(stitch(found, self.scheme)) if found else [] for found in by_sentence]
        if scores:
            spans = [scored_spans(found, windows) for found, windows in zip(spans, window_spans)]
        return [without_whitespace(tokens, found) for tokens, found in zip(token_lists, spans)]

    def stitched_spans(self, token_lists: list, pieces: list[tuple[int, int, int]], decoded: list,
                       scores: bool, threshold: float | None = None) -> list[list[Span]]:
        """A span head's `predict_tokens`: each window's spans (start, end, type index, probability),
        a span kept from the window that holds it most centrally (`central_spans`, the rule that
        scores a CRF's stitched entities); with `span.flat`, the non-overlapping choice among the
        stitched spans (`flat_spans`) above `threshold` (the model's by default)."""
        types = self.featurizer.types
        by_text: list[list[tuple[int, int, list[Span]]]] = [[] for _ in token_lists]
        for (i, a, b), found in zip(pieces, decoded):
            by_text[i].append((a, b, [Span(s, e, types[k], p) for s, e, k, p in found]))
        spans = [central_spans(windows) for windows in by_text]
        if self.config.span.flat:
            spans = [flat_spans(found, self.threshold if threshold is None else threshold) for found in spans]
        if not scores:
            spans = [[Span(s.start, s.end, s.type) for s in found] for found in spans]
        return [without_whitespace(tokens, found) for tokens, found in zip(token_lists, spans)]

    def spans_of(self, tokens: Sequence[str], tag_ids: list[int]) -> list[Span]:
        """The spans of one text decoded whole (no windows to stitch), under the whitespace rule."""
        return without_whitespace(tokens, tags_to_spans([self.tags[t] for t in tag_ids]))

    def document_stream(self):
        """This model reading every text it is given as the next line of one stream (its memory
        running on); only a model with Transformer-XL memory has one."""
        raise UserError("reading a document as one stream needs a model with encoder.memory (Transformer-XL "
                        "memory); this one reads each line alone", fix="drop --document")

    def predict(self, texts: str | Iterable[str], batch_size: int = 64, window: int | None = None,
                scores: bool = False, min_score: float | None = None) -> list[list[dict]]:
        """Entities of each text: `{"start", "end", "type", "text"}`, offsets into the text, end
        exclusive, and with `scores` the entity's probability `"score"`; `min_score` (which implies
        `scores`) drops the entities below it. A single string is one text (its entities come back
        in a list of one). A text longer than `window` characters (default: the model's,
        `Predictor.window`) is read in overlapping windows."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"predict takes strings; text {i} is {type(text).__name__}: {text!r:.40}")
        check_min_score(min_score)
        scores = scores or min_score is not None
        spans = self.predict_tokens(texts, batch_size, window, scores)  # a string is its sequence of characters
        return [[s.to_dict(t) for s in above(ss, min_score)]
                for t, ss in zip(texts, spans)]

    # ------------------------------------------------------------------------------ evaluation

    def predict_and_score(self, data: str | Path | list[Sentence], batch_size: int = 128, repair: bool | None = None,
                   with_errors: bool = False, window: int | None = None, document: bool = False,
                   with_calibration: bool = False, with_by_length: bool = False, trim: bool = True,
                   types: list[str] | None = None) -> Evaluation:
        """The model's predictions on a corpus file or on sentences already read, with their entity-level
        P/R/F1 and the time they took (an `Evaluation`; `evaluate` gives the metrics alone); with
        `with_errors` the metrics also hold `errors` (see `nerkit.inference.evaluate.errors`). A file is read
        as the model's training data was: `repair` None follows the model's `data.repair`, so a file
        the training repaired is repaired here too (and said so). `window`: as for `predict`. With
        `document` (a model with memory), the sentences of each document (`Sentence.document`: a file
        without `-DOCSTART-` lines is one) are read in order as one stream. With `with_calibration`
        the predictions carry scores and the metrics hold `calibration` (`nerkit.inference.evaluate.calibration`);
        with `with_by_length`, `by_length` (`nerkit.inference.evaluate.by_length`). `trim`: the batches
        padded only to their longest sentence (`decode_examples`), as a corpus read once may be; False
        times prediction's own batch shapes (the benchmark's prediction speed). `types`: as `evaluate`'s."""
        window = self.check_window(window)  # before the file is read: a wrong value costs no wait
        reader = self.document_stream() if document else self  # a model without memory: refused now too
        if isinstance(data, list):
            sentences, scheme = data, self.scheme
        else:
            corpus = read_gold(data, self.config.data.repair if repair is None else repair,
                               "pass --repair (repair=True in Python)")
            refuse_partial(corpus)  # a score needs every gold entity: none may hide where nobody annotated
            sentences, scheme = corpus.sentences, corpus.scheme
            self.check_types(corpus.types, str(data))
        started = time.perf_counter()
        if document:  # each document of the file one stream, its sentences in order
            predicted = []
            for _, group in itertools.groupby(sentences, key=lambda s: s.document):
                reader.reset()
                predicted += reader.predict_tokens([s.tokens for s in group], batch_size, window, with_calibration)
        else:
            predicted = self.predict_tokens([s.tokens for s in sentences], batch_size, window,  # Python lists: GPU work done
                                            with_calibration, trim)
        seconds = time.perf_counter() - started
        if types is not None:
            predicted = [[s for s in spans if s.type in types] for spans in predicted]
        gold = [s.spans() for s in sentences]
        metrics = score(gold, predicted)
        if with_errors:
            metrics["errors"] = errors(gold, predicted)
            by_nesting = nesting_errors(gold, predicted)
            if by_nesting:  # nested gold only: a flat corpus's metrics are as they were
                metrics["errors_by_nesting"] = by_nesting
        if with_calibration:
            metrics["calibration"] = calibration(gold, predicted)
        if with_by_length:
            metrics["by_length"] = by_length(gold, predicted, [len(s) for s in sentences])
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
                 with_errors: bool = False, window: int | None = None, document: bool = False,
                 types: list[str] | None = None) -> dict:
        """The model's scores on `data`: {"precision", "recall", "f1", "per_type", "counts"[, "errors"]}
        (`predict_and_score` gives the predictions and the time beside them). `types`: score these
        alone, the model's entities of its other types left out (a gold set labelled for some of them)."""
        return self.predict_and_score(data, batch_size, repair, with_errors, window, document, types=types).metrics


# ------------------------------------------------------------------------------ model directory

@dataclass
class ModelFiles:
    """What a model directory holds beside its weights or graph, read and checked."""

    model_dir: ModelDir  # nerkit.json: what the directory is
    config: Config
    vocab: dict  # vocab.json
    lexicon: object | None  # nerkit.features.lexicon.Lexicon, for a lattice encoder


def read_model_dir(directory: str | Path | ModelDir, files: tuple[str, ...] = MODEL_FILES) -> ModelFiles:
    """nerkit.json (its format version), config.yaml, vocab.json and lexicon.txt (against the checksum
    the model was trained with), after `check_model_dir` has seen that `files` are there.
    `directory`: a path, or its `ModelDir` already read (nerkit.json is then not read again)."""
    found = directory if isinstance(directory, ModelDir) else ModelDir.read(directory)
    directory = found.path
    check_model_dir(directory, files)
    found.check_format()
    import yaml

    try:
        raw = yaml.safe_load((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)  # where the YAML breaks, when the parser knows
        raise ModelDirError("config.yaml is not valid YAML",
                            where=f"{directory / CONFIG_FILE}" + (f":{mark.line + 1}" if mark else ""),
                            fix="nerkit wrote it with the model, so the copy is damaged or was edited: undo the "
                                "edit, or copy the whole model directory again") from None
    if isinstance(raw, dict) and isinstance(raw.get("data") or {}, dict):
        # nerkit always writes data.normalize; a hand-edited file without it is read as the
        # models trained before it became true by default were.
        raw["data"] = {"normalize": False, **(raw.get("data") or {})}
    config = build_config(raw, str(directory / CONFIG_FILE))
    vocab = _read_json(directory / VOCAB_FILE)
    found.check_vocab(vocab)
    lexicon = None
    if vocab.get("words") is not None:
        from nerkit.features.lexicon import Lexicon

        lexicon = Lexicon.load(directory / LEXICON_FILE)
        if found.meta.get("lexicon_sha256") and lexicon.fingerprint != found.meta["lexicon_sha256"]:
            raise ModelDirError("lexicon.txt does not match the checksum the model was trained with",
                                where=str(directory / LEXICON_FILE))
    if not (directory / "lm").is_dir() and config.embeddings.lm_sources():
        raise ModelDirError("lm/ is missing: the model was trained with a language model, which lives in lm/",
                            where=str(directory), fix="copy the whole model directory, lm/ included")
    return ModelFiles(found, config, vocab, lexicon)


def check_min_score(min_score) -> None:
    """A threshold someone chose (`--min-score`, `min_score=`): a probability from 0 to 1, or None."""
    if min_score is not None and (isinstance(min_score, bool) or not isinstance(min_score, (int, float))
                                  or not 0 <= min_score <= 1):
        raise UserError(f"the minimum score is a probability from 0 to 1, not {min_score!r}",
                        fix="use a value such as 0.5")


def above(spans: list[Span], min_score: float | None) -> list[Span]:
    """The spans whose score, as written (SCORE_DIGITS), is at least `min_score` (all of them when it
    is None), so that a threshold read off written scores keeps the entity it was read from; a span
    that could not be scored (by an export written before nerkit scored entities) is kept."""
    if min_score is None:
        return spans
    return [s for s in spans if s.score is None or round(s.score, SCORE_DIGITS) >= min_score]


def scored_spans(spans: list[Span], windows: list[tuple[int, int, list[Span]]]) -> list[Span]:
    """Each of a text's stitched `spans` with the score it has in the window that holds it most
    centrally among those that found it whole (`windows`: (start, end, scored spans) of each window,
    the spans' offsets in the window). Where stitching joined an entity from two windows' parts (one
    longer than their overlap), no window found it whole: it takes the lowest score of the parts."""
    found: dict[tuple[int, int, str], tuple[int, float]] = {}  # span -> (margin in its window, score)
    parts: list[Span] = []
    for start, end, scored in windows:
        size = end - start
        for s in scored:
            key, margin = (start + s.start, start + s.end, s.type), min(s.start, size - s.end)
            if key not in found or margin > found[key][0]:
                found[key] = (margin, s.score)
            parts.append(Span(start + s.start, start + s.end, s.type, s.score))
    out = []
    for span in spans:
        key = (span.start, span.end, span.type)
        if key in found:
            score = found[key][1]
        else:
            score = min((p.score for p in parts if p.type == span.type and p.start < span.end and span.start < p.end
                         and p.score is not None), default=None)
        out.append(Span(span.start, span.end, span.type, score))
    return out


def central_spans(windows: list[tuple[int, int, list[Span]]]) -> list[Span]:
    """The spans of a text read in overlapping windows ((start, end, spans with offsets in the
    window) each, in order): a span is kept from the window that, of those holding it whole, holds
    it most centrally (the largest distance to its nearer edge; the earlier on a tie), so each part
    of the text is decided by the window that sees most context around it. Offsets into the text,
    ordered by start, end, type."""
    if len(windows) == 1:  # a text read whole: nothing to choose
        start, _, found = windows[0]
        return sorted((Span(start + s.start, start + s.end, s.type, s.score) for s in found),
                      key=lambda s: (s.start, s.end, s.type))
    kept = []
    for j, (start, _, found) in enumerate(windows):
        for s in found:
            a, b = start + s.start, start + s.end
            deciding = max((min(a - ws, we - b), -i) for i, (ws, we, _) in enumerate(windows) if ws <= a and b <= we)
            if -deciding[1] == j:
                kept.append(Span(a, b, s.type, s.score))
    return sorted(kept, key=lambda s: (s.start, s.end, s.type))


def flat_spans(spans: list[Span], threshold: float = 0.5) -> list[Span]:
    """The non-overlapping choice among scored spans with the largest sum of log-odds over the
    threshold's (nerkit.model.span_decode.flat_choice)."""
    from nerkit.model.span_decode import band_cut, flat_choice

    odds = [(s.start, s.end, k, math.log(s.score / (1 - s.score)) if 0 < s.score < 1 else
             math.copysign(50.0, s.score - 0.5)) for k, s in enumerate(spans)]
    chosen = flat_choice(odds, band_cut(threshold))
    return sorted((spans[k] for _, _, k, _ in chosen), key=lambda s: (s.start, s.end, s.type))


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
            trimmed.append(Span(start, end, span.type, span.score))
    return trimmed
