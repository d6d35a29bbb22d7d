"""Build the nerkit demo corpus from data/sample/source.txt.

The source file holds one sentence per line with entities marked inline as
``[文本]TYPE`` (for example ``[张三]PER在[北京]LOC工作。``); lines starting with
``#`` and blank lines are ignored.  This script validates the markup, shuffles
the sentences deterministically (``random.Random(7)``) and writes, next to the
source file:

* ``train.bio``, ``dev.bio``, ``test.bio``: one ``char tag`` pair per line
  (BIO tags such as ``B-PER``, ``I-PER``, ``O``), a blank line after every
  sentence, UTF-8 with LF line endings;
* ``texts.txt``: a few raw, unannotated sentences from the test split, used
  as input for ``nerkit predict`` in the demo.

Whitespace characters are dropped.  The output depends only on the source
file, so running the script twice gives byte-identical files.

Usage: python3 scripts/make_sample.py [SOURCE]
"""

from __future__ import annotations

import random
import re
import sys
from collections import Counter
from pathlib import Path

TYPES = ("PER", "LOC", "ORG")
SEED = 7
DEV_SIZE = 60
TEST_SIZE = 60
N_TEXTS = 8

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = ROOT / "data" / "sample" / "source.txt"

# An entity: "[" + text without brackets + "]" + an upper-case type name.
ENTITY = re.compile(r"\[([^\[\]]*)\]([A-Za-z]*)")

Sentence = list[tuple[str, str]]  # (character, BIO tag) pairs


class MarkupError(ValueError):
    """A line of the source file is not valid markup."""


def parse_line(line: str, lineno: int) -> Sentence:
    """Turn one marked-up line into (char, tag) pairs, skipping whitespace."""

    def fail(message: str) -> MarkupError:
        return MarkupError(f"line {lineno}: {message}: {line!r}")

    pairs: Sentence = []

    def add_plain(text: str) -> None:
        if "[" in text or "]" in text:
            raise fail("unbalanced bracket")
        pairs.extend((ch, "O") for ch in text if not ch.isspace())

    pos = 0
    for match in ENTITY.finditer(line):
        add_plain(line[pos:match.start()])
        text, label = match.group(1), match.group(2)
        if not label:
            raise fail(f"entity [{text}] has no type")
        if label not in TYPES:
            raise fail(f"unknown entity type {label!r} (expected one of {', '.join(TYPES)})")
        chars = [ch for ch in text if not ch.isspace()]
        if not chars:
            raise fail("empty entity")
        pairs.append((chars[0], f"B-{label}"))
        pairs.extend((ch, f"I-{label}") for ch in chars[1:])
        pos = match.end()
    add_plain(line[pos:])
    if not pairs:
        raise fail("no characters")
    return pairs


def read_source(path: Path) -> list[Sentence]:
    """Read and validate the source file; duplicate sentences are an error."""
    sentences: list[Sentence] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as handle:
        for lineno, raw in enumerate(handle, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            sentence = parse_line(line, lineno)
            text = raw_text(sentence)
            if text in seen:
                raise MarkupError(f"line {lineno}: duplicate of line {seen[text]}: {line!r}")
            seen[text] = lineno
            sentences.append(sentence)
    return sentences


def raw_text(sentence: Sentence) -> str:
    return "".join(ch for ch, _ in sentence)


def entity_counts(sentences: list[Sentence]) -> Counter[str]:
    return Counter(tag[2:] for sentence in sentences for _, tag in sentence if tag.startswith("B-"))


def write_bio(path: Path, sentences: list[Sentence]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for sentence in sentences:
            for ch, tag in sentence:
                handle.write(f"{ch} {tag}\n")
            handle.write("\n")


def write_texts(path: Path, sentences: list[Sentence]) -> None:
    # Prefer sentences that contain an entity, so the demo has something to find.
    with_entities = [s for s in sentences if any(tag != "O" for _, tag in s)]
    chosen = with_entities[:N_TEXTS]
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for sentence in chosen:
            handle.write(raw_text(sentence) + "\n")


def main(argv: list[str]) -> int:
    source = Path(argv[1]) if len(argv) > 1 else DEFAULT_SOURCE
    try:
        sentences = read_source(source)
    except MarkupError as exc:
        print(f"{source}: {exc}", file=sys.stderr)
        return 1
    if len(sentences) <= DEV_SIZE + TEST_SIZE:
        print(f"{source}: only {len(sentences)} sentences; need more than {DEV_SIZE + TEST_SIZE}",
              file=sys.stderr)
        return 1

    random.Random(SEED).shuffle(sentences)
    splits = {
        "train": sentences[DEV_SIZE + TEST_SIZE:],
        "dev": sentences[:DEV_SIZE],
        "test": sentences[DEV_SIZE:DEV_SIZE + TEST_SIZE],
    }

    out_dir = source.parent
    for name, split in splits.items():
        write_bio(out_dir / f"{name}.bio", split)
    write_texts(out_dir / "texts.txt", splits["test"])

    print(f"{'split':<6} {'sents':>6} {'chars':>6} " + " ".join(f"{t:>5}" for t in TYPES))
    for name, split in splits.items():
        counts = entity_counts(split)
        chars = sum(len(s) for s in split)
        print(f"{name:<6} {len(split):>6} {chars:>6} " + " ".join(f"{counts[t]:>5}" for t in TYPES))
    print(f"wrote {', '.join(f'{n}.bio' for n in splits)} and texts.txt to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
