"""Corpus statistics for `nerkit data stats`: texts, characters, entities by type, lengths, the texts
longer than `data.max_len`, nesting, partial annotation, and the checksums of the known benchmark files."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nerkit.config import DataConfig
from nerkit.data.corpus import read_corpus, scheme_label
from nerkit.data.nesting import Nesting, describe, nesting
from nerkit.data.records import UNKNOWN_KEY, Sentence
from nerkit.data.tags import UNKNOWN_TAG
from nerkit.errors import CorpusError

# ---------------------------------------------------------------------------------------------
# Statistics


# The standard files, by sha256: many versions of these benchmarks circulate, and results are only
# comparable on the same one.
KNOWN_FILES = {
    "98a5c331fa6e3e51858a3b9f98ae618b253947aaf7f39f9f51a3a8caa171431e": "MSRA train (SIGHAN 2006, BMES, 46,364 sentences)",
    "9cebc5ce1ea06477d1230d17be90daafa670e78f07eb628c27103af4a6e6dc3b": "MSRA test (SIGHAN 2006, BMES, as used by Lattice LSTM/FLAT)",
    "fbacf4110b131354270b7ff470c88eb84645f0ed8df30c3e409dde437cb45e70": "People's Daily 1998 train (zjy-ucas/ChineseNER example.train)",
    "7d8e6fcd1745e6adcb99d90307d84c3a0f9f8ff5ee6fe62ca27646cb765fc38a": "People's Daily 1998 dev (zjy-ucas/ChineseNER example.dev)",
    "233299005f941a4b055e38aadcf3ee853e44bc1f88166078d3b52b26b77ea362": "People's Daily 1998 test (zjy-ucas/ChineseNER example.test)",
}


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


# What a text longer than data.max_len becomes, as the stats and `nerkit data validate` say it.
MAX_LEN_NOTE = "which training cuts into pieces, never inside an entity"


def longer_than(lengths, max_len: int) -> int:
    """How many of the texts of these `lengths` are longer than `max_len` (0: no limit, none)."""
    return sum(n > max_len for n in lengths) if max_len > 0 else 0


def partial_counts(sentences: list[Sentence]) -> tuple[int, int]:
    """How many of `sentences` are partial (`Sentence.unknown`), and their characters nobody annotated."""
    partial = [s for s in sentences if s.partial]
    return len(partial), sum(end - start for s in partial for start, end in s.unknown)


def describe_partial(partial: int, unknown: int, texts: int) -> str:
    """`partial_counts` as `nerkit data stats` and `validate` say them."""
    return f'{unknown:,} characters nobody annotated ({UNKNOWN_TAG} / "{UNKNOWN_KEY}") in {partial:,} of {texts:,} texts'


def corpus_stats(path: str | Path, max_len: int = DataConfig.max_len) -> dict:
    """The statistics of one corpus file, its texts measured against `max_len` (data.max_len's
    default unless given). Its JSON keeps the key `sentences` for the texts."""
    corpus = read_corpus(path, strict=False)
    lengths = sorted(len(s) for s in corpus.sentences)
    per_type: dict[str, int] = {}
    for sent in corpus.sentences:
        for span in sent.spans():
            per_type[span.type] = per_type.get(span.type, 0) + 1
    digest = sha256_file(path)
    partial, unknown = partial_counts(corpus.sentences)
    return {
        "file": str(path),
        "sentences": len(corpus.sentences),
        "characters": sum(lengths),
        "entities": dict(sorted(per_type.items())),
        "entities_total": sum(per_type.values()),
        "scheme": corpus.labels,
        "length": {"p50": _percentile(lengths, 50), "p90": _percentile(lengths, 90),
                   "p95": _percentile(lengths, 95), "p99": _percentile(lengths, 99), "max": lengths[-1]},
        "max_len": max_len,
        "longer_than_max_len": longer_than(lengths, max_len),
        "invalid_transitions": corpus.invalid_transitions,
        "nesting": nesting(s.spans() for s in corpus.sentences).to_dict(),
        "partial_sentences": partial,
        "unknown_characters": unknown,
        "sha256": digest,
        "known_as": KNOWN_FILES.get(digest),
    }


def files_stats(paths: list[str | Path], max_len: int = DataConfig.max_len) -> tuple[list[dict], list[CorpusError]]:
    """`corpus_stats` of every file that reads, and the error of each one that does not."""
    stats, failures = [], []
    for path in paths:
        try:
            stats.append(corpus_stats(path, max_len))
        except CorpusError as e:
            failures.append(e)
    return stats, failures


def format_stats(stats: dict) -> str:
    lines = [f"{stats['file']}"]
    if stats["known_as"]:
        lines.append(f"  known file    {stats['known_as']}")
    lines += [
        f"  sha256        {stats['sha256']}",
        f"  scheme        {scheme_label(stats['scheme'])}",
        f"  texts         {stats['sentences']:,}",
        f"  characters    {stats['characters']:,}",
        f"  entities      {stats['entities_total']:,}  ("
        + ", ".join(f"{t} {n:,}" for t, n in stats["entities"].items()) + ")",
        "  length        " + ", ".join(f"{k} {v}" for k, v in stats["length"].items()),
        *([f"  over max_len  {stats['longer_than_max_len']:,} of {stats['sentences']:,} texts longer than "
           f"{stats['max_len']:,} characters (data.max_len), {MAX_LEN_NOTE}"] if stats["max_len"] > 0 else []),
        f"  invalid transitions  {stats['invalid_transitions']}",
    ]
    found = Nesting(**stats["nesting"])
    if found.is_nested:  # a flat corpus's report is as it was
        lines.append(f"  nesting       {describe(found)}")
    if stats["partial_sentences"]:  # and a completely annotated one's
        lines.append("  partial       " + describe_partial(stats["partial_sentences"], stats["unknown_characters"],
                                                          stats["sentences"]))
    return "\n".join(lines)
