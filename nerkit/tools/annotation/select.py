"""`nerkit data select`: which texts of a pool to annotate next (active learning), each written as a
task with the model's pre-annotations and their scores.

`uncertainty` ranks the texts by the probability of the model's own best tag path, normalised by
length: the mean log-probability per character, (1/n) log P(best path) (the "maximum normalised
log-probability" that Shen et al., 2018, found as good as costlier measures for NER, and which needs
nothing but the CRF's forward pass). Unlike the lowest entity score it also ranks the texts where
the model finds nothing, which are where it misses entities; unlike the raw path probability it does
not simply pick the longest texts. `random` draws N texts with a seed: the baseline to measure
against. A text longer than the model's window is scored over its windows (their log-probabilities
summed, over its length). The tasks written say it as `confidence`, exp of that mean: the geometric
mean, per character, of the best path's probability. A span-head model (nested entities) is ranked
the same way by the probability of what it decides, every span above its threshold taken and every
other left out, under its independent per-span probabilities (`decision_log_probability`).

With `unit="span"` (`--unit span`) a task is a span of a text, not a text: the spans the model is
least sure of, each text's written as a partial annotation (nerkit.tools.annotation.spans).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Literal

from nerkit.errors import UserError

# The choices, for the CLI's options too (this module imports torch only where it runs a model).
STRATEGIES = ("uncertainty", "random")
Strategy = Literal[STRATEGIES]
# What a task asks: a whole sentence, or a span of one (nerkit.tools.annotation.spans), the rest unknown.
UNITS = ("sentence", "span")
Unit = Literal[UNITS]
SELECT_FORMATS = ("jsonl", "label-studio", "doccano")
SelectFormat = Literal[SELECT_FORMATS]


def path_confidence(pipe, texts: list[str], batch_size: int = 64, window: int | None = None) -> list[float]:
    """Per text, the mean log-probability per character of the model's best path (a span head: of its
    decided spans), 0 for an empty text."""
    totals = [0.0] * len(texts)
    for rows, log_probabilities in pipe.decision_log_probabilities(texts, batch_size, window):
        for (i, *_), lp in zip(rows, log_probabilities):
            totals[i] += lp
    return [total / len(text) if text else 0.0 for total, text in zip(totals, texts)]


def select(pipe, texts: list[str], n: int, strategy: str = "uncertainty", seed: int = 0,
           batch_size: int = 64, window: int | None = None) -> list[int]:
    """The indices of the `n` texts to annotate next, in the order to annotate them: the least sure
    first (`uncertainty`), or a seeded random draw (`random`). Empty texts are never chosen."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    candidates = [i for i, text in enumerate(texts) if text.strip()]
    if strategy == "random":
        return random.Random(seed).sample(candidates, min(n, len(candidates)))
    confidence = path_confidence(pipe, [texts[i] for i in candidates], batch_size, window)
    ranked = sorted(range(len(candidates)), key=lambda k: (confidence[k], candidates[k]))
    return [candidates[k] for k in ranked[:n]]


# ------------------------------------------------------------------------------ the command

POOL_FORMATS = ("auto", "text", "jsonl", "corpus")
PoolFormat = Literal[POOL_FORMATS]


def read_pool(path: str | Path, fmt: str = "auto") -> tuple[list[str], list[dict | None]]:
    """The pool's texts and each one's other keys: `text`, one text a line; `jsonl`, a JSON object a
    line with its text at "text" (its other keys kept, as `nerkit predict` keeps them); `corpus`, the
    sentences of a corpus nerkit reads (its labels, if any, ignored); `auto`, jsonl for a .jsonl or
    .json file, else text. Blank lines are no texts."""
    from nerkit.data.corpus import is_jsonl, read_corpus
    from nerkit.data.records import read_text, text_record
    from nerkit.files import check_input

    check_input(str(path), "--pool", "no such file")
    if fmt == "corpus":
        return [s.text for s in read_corpus(path, texts_only=True).sentences], None
    if fmt == "auto":
        fmt = "jsonl" if is_jsonl(path) else "text"
    texts, keys = [], []
    lines = read_text(path).split("\n")  # numbered, for a JSON line's errors
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if fmt == "jsonl":
            text, other = text_record(line, "text", f"{path}:{number}")
            texts.append(text)
            keys.append(other)
        else:
            texts.append(line.rstrip("\r"))
    return texts, keys if fmt == "jsonl" else None


def select_tasks(model: str | Path, pool: str | Path, n: int, strategy: str = "uncertainty", seed: int = 0,
                 out: str | Path | None = None, fmt: str = "jsonl", pool_format: str = "auto",
                 exclude: list[str | Path] = (), batch_size: int = 64, window: int | None = None,
                 unit: str = "sentence") -> dict:
    """`nerkit data select`: the `n` texts of `pool` to annotate next (`select`), written to `out`
    (stdout when None) as `fmt` tasks with the model's scored pre-annotations, the least sure
    first; each keeps its pool keys and gains `confidence`, the measure it was chosen by. Texts
    that occur in an `exclude` corpus (already annotated) are never chosen. A pool with no text left to
    choose is refused before anything is written. Returns a summary.

    `unit="span"`: the `n` spans to annotate next (nerkit.tools.annotation.spans), a task per text
    that has any, the text's most uncertain first: its entities inside the spans, every region
    outside them `unknown`, and `confidence`, 1 - the highest uncertainty of its spans. What an
    `exclude` corpus annotated (the known regions of a partial one, all of a complete one) is never
    asked again."""
    from nerkit.data.corpus import read_corpus
    from nerkit.files import atomic_write_text, check_output
    from nerkit.inference.formats import model_version, output_frame
    from nerkit.inference.pipeline import Pipeline

    if n < 1:
        raise UserError(f"--n must be at least 1, not {n}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, not {unit!r}")
    if out is not None:
        check_output(out, pool, *exclude)
    texts, keys = read_pool(pool, pool_format)
    if not any(text.strip() for text in texts):
        raise UserError("the pool has no text to choose from", where=str(pool),
                        fix="give texts one a line, JSON lines with a \"text\" key, or a corpus with --pool-format corpus")
    known = annotated(read_corpus(path, texts_only=True).sentences for path in exclude)
    chosen_from = [i for i, text in enumerate(texts) if not is_done(text, known, unit)]
    if not any(texts[i].strip() for i in chosen_from):
        raise UserError(f"every text of the pool ({len(texts):,}) is already annotated in an --exclude corpus",
                        where=str(pool), fix="give a pool of texts not yet annotated")
    pipe = Pipeline.load(model)
    version = model_version(pipe)
    if unit == "span":
        records, selected = span_records(pipe, [texts[i] for i in chosen_from],
                                         [keys[i] if keys else {} for i in chosen_from], known, n, strategy, seed,
                                         fmt, version, batch_size, window)
    else:
        records = sentence_records(pipe, texts, keys, chosen_from, n, strategy, seed, fmt, version, batch_size, window)
        selected = len(records)
    start, separator, end = output_frame(fmt)
    written = start + separator.join(records) + end
    if out is None:
        import sys

        sys.stdout.write(written)
    else:
        atomic_write_text(out, written)
    return {"pool": len(texts), "excluded": len(texts) - len(chosen_from), "selected": selected,
            "texts": len(records), "unit": unit, "strategy": strategy, "out": str(out) if out else "stdout"}


def is_done(text: str, known: dict[str, list[bool]], unit: str) -> bool:
    """Whether `text` has nothing left to ask: a sentence that an `--exclude` corpus holds, even in
    part; for spans, one whose every character it annotated."""
    return text in known if unit == "sentence" else all(known.get(text, [False]))


def annotated(corpora) -> dict[str, list[bool]]:
    """What `--exclude` corpora annotated: per text, its characters annotated in any copy of it."""
    known: dict[str, list[bool]] = {}
    for sentences in corpora:
        for sentence in sentences:
            mask = sentence.known()
            before = known.get(sentence.text)
            known[sentence.text] = mask if before is None else [a or b for a, b in zip(before, mask)]
    return known


def sentence_records(pipe, texts: list[str], keys: list[dict] | None, chosen_from: list[int], n: int, strategy: str,
                     seed: int, fmt: str, version: str, batch_size: int, window: int | None) -> list[str]:
    """`--unit sentence`'s tasks: the chosen texts whole, with their scored entities and confidence."""
    from nerkit.inference.formats import format_record

    picked = select(pipe, [texts[i] for i in chosen_from], n, strategy, seed, batch_size, window)
    chosen = [chosen_from[k] for k in picked]
    chosen_texts = [texts[i] for i in chosen]
    confidence = path_confidence(pipe, chosen_texts, batch_size, window)
    spans = pipe.predict_tokens(chosen_texts, batch_size, window, scores=True)
    return [format_record(text, found, fmt, pipe.scheme, None, version,
                          {**(keys[i] if keys else {}), "confidence": round(math.exp(c), 6)})
            for i, text, found, c in zip(chosen, chosen_texts, spans, confidence)]


def span_records(pipe, texts: list[str], keys: list[dict], known: dict[str, list[bool]], n: int, strategy: str,
                 seed: int, fmt: str, version: str, batch_size: int, window: int | None) -> tuple[list[str], int]:
    """`--unit span`'s tasks (see `select_tasks`) and the number of spans they ask about."""
    from nerkit.data.annotation import doccano_record
    from nerkit.data.records import UNKNOWN_KEY
    from nerkit.data.tags import SCORE_DIGITS
    from nerkit.inference.formats import format_record, record
    from nerkit.tools.annotation.spans import select_spans, span_task

    chosen, entities = select_spans(pipe, texts, n, strategy, seed, batch_size, window,
                                    [known.get(text) for text in texts])
    by_text: dict[int, list] = {}
    for candidate in chosen:  # the most uncertain first: a text's place is that of its first span
        by_text.setdefault(candidate.text, []).append(candidate)
    records = []
    for i, candidates in by_text.items():
        spans = sorted((c.start, c.end) for c in candidates)
        inside, unknown = span_task(texts[i], entities[i], spans)
        extra = {**keys[i], "confidence": round(1.0 - max(c.uncertainty for c in candidates), SCORE_DIGITS)}
        regions = [[a, b] for a, b in unknown]
        if fmt == "jsonl":
            records.append(json.dumps({**extra, **record(texts[i], inside), UNKNOWN_KEY: regions},
                                      ensure_ascii=False) + "\n")
        elif fmt == "doccano":  # its offsets count UTF-16 units, the unknown regions' too
            records.append(json.dumps({**extra, **doccano_record(texts[i], inside, unknown)}, ensure_ascii=False) + "\n")
        else:  # Label Studio keeps the task's data as it is: data.unknown
            records.append(format_record(texts[i], inside, fmt, pipe.scheme, None, version,
                                         {**extra, UNKNOWN_KEY: regions}))
    return records, len(chosen)
