"""`nerkit data audit`: train the fold models (nerkit.tools.audit.folds), let each judge the sentences
it never saw (evidence.py, suspects.py), rank the corpus by the chosen suspicion score and write the
report (report.py). `audit` is the command's one function; it returns what the benchmark measures."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nerkit.data.records import Sentence
from nerkit.errors import UserError
from nerkit.tools.audit.folds import FOLDS_FILE
from nerkit.tools.audit.suspects import SCORES, THRESHOLD, Suspect

log = logging.getLogger(__name__)


@dataclass
class Judged:
    """One sentence of the corpus as its fold's model judged it."""

    index: int  # among the training file's sentences
    fold: int
    sentence: Sentence
    scores: dict[str, float]  # each of SCORES
    suspects: list[Suspect]
    labelled: list  # the labelled entities, each scored with the model's probability
    char_probabilities: np.ndarray | None = field(default=None, repr=False)  # (T, 1 + types), for cleanlab


@dataclass
class Audit:
    """What `audit` found: the judged sentences in corpus order, the ranking (positions into
    `judged`, worst first, by `score`), the corpus's path, the models' entity types and the
    per-class thresholds of the `entity` score."""

    judged: list[Judged]
    ranking: list[int]
    score: str
    train: str
    types: list[str]
    out: Path
    thresholds: dict[str, float] = field(default_factory=dict)  # the `entity` score's, per class (O and each type)


@dataclass(frozen=True)
class AuditOptions:
    folds: int = 5
    seed: int = 0
    score: str = SCORES[0]
    threshold: float = THRESHOLD
    missing_threshold: float | None = None  # None: `threshold`
    top: int = 200  # the sentences the HTML page shows


def is_audit_dir(directory: Path) -> bool:
    return (directory / FOLDS_FILE).is_file()


def check_options(options: AuditOptions) -> None:
    if options.folds < 2:
        raise UserError(f"--folds must be at least 2, not {options.folds}", fix="use e.g. --folds 5")
    if options.score not in SCORES:
        raise UserError(f"--score takes {', '.join(SCORES)}, not {options.score!r}")
    for name, value in (("--threshold", options.threshold), ("--missing-threshold", options.missing_threshold)):
        if value is not None and not 0 < value < 1:
            raise UserError(f"{name} is a probability between 0 and 1, not {value}", fix="use e.g. 0.5")


def audit(config_path: str | Path, overrides: list[str], out: str | Path, options: AuditOptions = AuditOptions(),
          resume: bool = False, force: bool = False) -> Audit:
    """Audit the config's training corpus into `out` (see nerkit.tools.audit): a new directory, one
    this command wrote (with `force`, replaced), or with `resume` one to go on with."""
    from nerkit.config import load_config
    from nerkit.device import set_threads
    from nerkit.files import check_output_directory
    from nerkit.tools.audit.folds import fold_assignment, read_training, train_folds
    from nerkit.tools.audit.report import write_report

    check_options(options)
    config = load_config(config_path, overrides)
    out = Path(out)
    if resume and not is_audit_dir(out):
        raise UserError(f"nothing to resume: no {FOLDS_FILE}", where=str(out), fix="drop --resume to start the audit")
    check_output_directory(out, force or resume, own=is_audit_dir,
                           inputs=[config_path, *(p for p in (config.data.train, config.data.dev) if p)],
                           what="an earlier audit")
    corpus = read_training(config)
    if len(corpus.sentences) < options.folds:
        raise UserError(f"{len(corpus.sentences)} training sentences cannot make {options.folds} folds",
                        where=corpus.path, fix="lower --folds")
    if force and not resume and out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    fold = fold_assignment(out, corpus, options.folds, options.seed, resume)
    runs = train_folds(config, out, corpus, fold, options.folds)
    set_threads(config.train.threads)
    judged, thresholds = judge_folds(runs, corpus, fold, config.train.eval_batch_size, config.train.device, options)
    ranking = rank(judged, options.score)
    result = Audit(judged, ranking, options.score, corpus.path, types_of(runs[0]), out, thresholds)
    write_report(result, options.top)
    return result


def rank(judged: list[Judged], score: str) -> list[int]:
    """Positions into `judged`, the most suspect first by `score`; a tie (two sentences whose
    strongest evidence is equally certain) broken by the other scores, then by corpus order."""
    others = [s for s in SCORES if s != score]
    return sorted(range(len(judged)), key=lambda j: (-judged[j].scores[score], *(-judged[j].scores[o] for o in others),
                                                     judged[j].index))


def types_of(run_dir: Path) -> list[str]:
    from nerkit.data.tags import split_tag
    from nerkit.inference.model_dir import ModelDir
    from nerkit.inference.predictor import read_model_dir

    vocab = read_model_dir(ModelDir.read(run_dir)).vocab
    return sorted({split_tag(t)[1] for t in vocab.get("tags", []) if t != "O"})


def judge_folds(runs: list[Path], corpus, fold: list[int], batch_size: int, device: str,
                options: AuditOptions) -> tuple[list[Judged], dict[str, float]]:
    """Each sentence judged by the model of its fold; the `entity` scores once every fold has been
    read, since confident learning's per-class thresholds (returned, by class) are over the whole
    corpus."""
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.audit.evidence import sentence_evidence
    from nerkit.tools.audit.suspects import class_thresholds, find_suspects, sentence_score

    judged: list[Judged | None] = [None] * len(corpus.sentences)
    confidences: list[list[tuple[int, float]]] = [[] for _ in corpus.sentences]
    types: list[str] = []
    for k, run_dir in enumerate(runs):
        pipe = Pipeline.load(run_dir, device=device)
        types = pipe.types
        held_out = [j for j, f in enumerate(fold) if f == k]
        evidence = sentence_evidence(pipe, [corpus.sentences[j] for j in held_out], batch_size)
        for j, found in zip(held_out, evidence):
            sentence = corpus.sentences[j]
            suspects, confidences[j] = find_suspects(found.labelled, found.cells, sentence.known(), options.threshold,
                                                     options.missing_threshold, found.char_probabilities, pipe.types)
            judged[j] = Judged(corpus.indices[j], k, sentence, {"path": found.path}, suspects,
                               found.labelled, found.char_probabilities)
        log.info(f"fold {k + 1}: judged {len(held_out):,} sentences, "
                 f"{sum(bool(judged[j].suspects) for j in held_out):,} with suspects")
    classes = ["O", *types]
    thresholds = class_thresholds(confidences, len(classes))
    log.info("per-class thresholds (mean self-confidence): "
             + ", ".join(f"{name} {t:.3f}" for name, t in zip(classes, thresholds)))
    for sentence, confidence in zip(judged, confidences):
        sentence.scores = {"entity": sentence_score(confidence, thresholds), **sentence.scores}
    return judged, dict(zip(classes, thresholds))
