"""How much of each entity type of a gold corpus a model's lexicon covers: the share of entities
that are a lexicon word themselves, and the share that contain one (a word of two or more
characters inside the entity, the entity itself included).

    python scripts/lexicon_coverage.py MODEL_DIR CORPUS

MODEL_DIR is a FLAT model directory (the lexicon.txt it was trained with).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from nerkit.data.corpus import read_corpus
from nerkit.features.lexicon import Lexicon


def coverage(words: Lexicon, corpus: str) -> dict[str, dict[str, float]]:
    total, exact, inner, chars = Counter(), Counter(), Counter(), Counter()
    for sentence in read_corpus(corpus).sentences:
        text = "".join(sentence.tokens)
        for span in sentence.spans():
            entity = text[span.start:span.end]
            total[span.type] += 1
            chars[span.type] += len(entity)
            exact[span.type] += entity in words
            inner[span.type] += bool(words.match(entity))  # what the lattice matches in the entity alone
    return {t: {"entities": total[t], "mean_length": chars[t] / total[t], "is_a_word": exact[t] / total[t],
                "contains_a_word": inner[t] / total[t]} for t in sorted(total)}


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    lexicon = Path(sys.argv[1]) / "lexicon.txt"
    words = Lexicon.load(lexicon)
    print(f"{lexicon}: {len(words):,} words")
    for type_, c in coverage(words, sys.argv[2]).items():
        print(f"{type_}: {c['entities']:,} entities, mean length {c['mean_length']:.1f}, "
              f"a word {100 * c['is_a_word']:.1f}%, containing a word {100 * c['contains_a_word']:.1f}%")


if __name__ == "__main__":
    main()
