"""The folds of an audit: the training corpus's sentences dealt into K seeded folds (written to
DIR/folds.json, so that a resumed audit deals them exactly as before), and for each fold a model
trained on the other K-1 through the ordinary training machinery: a training file of those
sentences (DIR/data/fold-K.jsonl, unknown regions kept, so partial labels train as `nerkit train`
trains on them), the config's own limits, overrides and threads, dev the config's dev set or the
slice it carves from those sentences (never the held-out fold), no test set (a fold model only
judges its fold). Each model is a run directory, DIR/folds/K: a finished one is kept on a resume and
an interrupted one continues from its checkpoint."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, replace
from pathlib import Path

from nerkit.config import Config
from nerkit.data.records import Sentence
from nerkit.errors import UserError
from nerkit.files import CHECKPOINT, atomic_write_text

log = logging.getLogger(__name__)

FOLDS_FILE = "folds.json"


@dataclass
class Corpus:
    """The sentences an audit judges: the config's data.train as training reads it (data.limit,
    empty texts left out), each with its index among the file's sentences."""

    path: str
    scheme: str
    sentences: list[Sentence]
    indices: list[int]
    sha256: str


def read_training(config: Config) -> Corpus:
    from nerkit.data.splits import TRAIN_REPAIR_OPTION, check_data_files, read_gold
    from nerkit.data.stats import sha256_file

    dc = config.data
    check_data_files(config, ("train", "dev"))
    corpus = read_gold(dc.train, dc.repair, TRAIN_REPAIR_OPTION, limit=dc.limit)
    kept = [(i, s) for i, s in enumerate(corpus.sentences) if len(s)]
    if dc.limit:
        kept = kept[:dc.limit]
    return Corpus(dc.train, corpus.scheme, [s for _, s in kept], [i for i, _ in kept], sha256_file(dc.train))


def deal(count: int, folds: int, seed: int) -> list[int]:
    """Each sentence's fold: a seeded shuffle dealt round the folds, so their sizes differ by one."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    fold = [0] * count
    for place, i in enumerate(order):
        fold[i] = place % folds
    return fold


def fold_assignment(out: Path, corpus: Corpus, folds: int, seed: int, resume: bool) -> list[int]:
    """The folds, dealt and written to OUT/folds.json; on a resume, read back after checking they
    were dealt from the same corpus with the same --folds and --seed."""
    path = out / FOLDS_FILE
    what = {"train": corpus.path, "sha256": corpus.sha256, "sentences": len(corpus.sentences), "folds": folds,
            "seed": seed}
    if resume and path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        changed = [key for key in what if key != "train" and saved.get(key) != what[key]]
        if changed:
            raise UserError(f"the audit in {out} was dealt with other {', '.join(changed)} "
                            f"({', '.join(f'{k}: {saved.get(k)}' for k in changed)})", where=str(path),
                            fix="resume with the same corpus, --folds and --seed, or start again with --force")
        return saved["fold"]
    fold = deal(len(corpus.sentences), folds, seed)
    atomic_write_text(path, json.dumps({**what, "index": corpus.indices, "fold": fold}) + "\n")
    return fold


def fold_config(config: Config, train_file: Path, scheme: str) -> Config:
    """The config a fold model trains with: data.train its K-1 folds (already limited), the corpus's
    own tag scheme where the config says auto (the fold file is JSON lines, which has none), no test."""
    dc = config.data
    data = replace(dc, train=str(train_file), limit=0, test=None,
                   scheme=dc.scheme if dc.scheme != "auto" else scheme)
    return replace(config, data=data)


def train_folds(config: Config, out: Path, corpus: Corpus, fold: list[int], folds: int) -> list[Path]:
    """Each fold's model (see the module's docstring); returns their run directories."""
    from nerkit.data.corpus import write_corpus
    from nerkit.training.loop import finished, train_or_continue

    runs = []
    for k in range(folds):
        run_dir = out / "folds" / str(k)
        runs.append(run_dir)
        if finished(run_dir):
            log.info(f"fold {k}: finished earlier, kept ({run_dir})")
            continue
        train_file = out / "data" / f"fold-{k}.jsonl"
        if not train_file.is_file():
            train_file.parent.mkdir(parents=True, exist_ok=True)
            write_corpus(train_file, [s for s, f in zip(corpus.sentences, fold) if f != k], "jsonl")
        resume = (run_dir / CHECKPOINT / "state.json").is_file()
        held_out = sum(f == k for f in fold)
        log.info(f"fold {k + 1} of {folds}: {'resuming' if resume else 'training'} on {len(fold) - held_out:,} "
                 f"sentences, {held_out:,} held out ({run_dir})")
        train_or_continue(fold_config(config, train_file, corpus.scheme), run_dir)
    return runs
