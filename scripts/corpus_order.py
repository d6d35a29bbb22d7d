"""Does a corpus file keep its sentences in the order of the articles they came from?

`data.context: document` reads consecutive sentences of a training file as one stream, which only
means something if the file keeps its source order. Two measures, each against a baseline:

- neighbours: the character-bigram overlap (Jaccard) of each sentence with the next one, with the
  one five sentences on, and with a random one. In source order neighbours share names and topic
  words, so the first is several times the last; in a shuffled file all three are equal.
- direction: sentences that open with 他 or 她 and name no person themselves refer back to someone.
  In forward order that person is named in the sentence before more often than in the one after;
  in a file whose articles run backwards, the other way round.

    python scripts/corpus_order.py $NERKIT_DATA/msra/train_dev.char.bmes $NERKIT_DATA/peopledaily/example.train
"""

from __future__ import annotations

import argparse
import random

from nerkit.data.corpus import read_corpus
from nerkit.data.records import Sentence


def bigrams(text: str) -> set[str]:
    return {text[i:i + 2] for i in range(len(text) - 1)}


def overlap(a: str, b: str) -> float:
    x, y = bigrams(a), bigrams(b)
    return len(x & y) / max(1, len(x | y))


def neighbours(texts: list[str], seed: int = 0) -> dict[str, float]:
    """Mean bigram Jaccard of a sentence with the next, the fifth on, and a random sentence."""
    rng = random.Random(seed)
    n = len(texts)

    def mean(pairs) -> float:
        pairs = list(pairs)
        return sum(overlap(texts[i], texts[j]) for i, j in pairs) / max(1, len(pairs))

    return {"next": mean((i, i + 1) for i in range(n - 1)),
            "fifth": mean((i, i + 5) for i in range(n - 5)),
            "random": mean((i, rng.randrange(n)) for i in range(n))}


def names_person(sentence: Sentence) -> bool:
    return any(span.type in ("PER", "NR") for span in sentence.spans())


def direction(sentences: list[Sentence]) -> dict[str, int]:
    """Of the sentences opening with 他/她 that name no person: how many have a person named in the
    sentence before, and how many in the sentence after."""
    idx = [i for i in range(1, len(sentences) - 1)
           if sentences[i].tokens[0] in ("他", "她") and not names_person(sentences[i])]
    return {"sentences": len(idx),
            "before": sum(names_person(sentences[i - 1]) for i in idx),
            "after": sum(names_person(sentences[i + 1]) for i in idx)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    print("| file | sentences | overlap with next | fifth on | random | 他/她 openers | person before | person after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in args.files:
        sentences = read_corpus(path, strict=False).sentences
        near = neighbours([s.text for s in sentences])
        way = direction(sentences)
        print(f"| {path} | {len(sentences):,} | {near['next']:.4f} | {near['fifth']:.4f} | {near['random']:.4f} "
              f"| {way['sentences']:,} | {way['before']:,} | {way['after']:,} |")


if __name__ == "__main__":
    main()
