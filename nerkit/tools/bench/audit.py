"""`nerkit bench audit`: how well `nerkit data audit` finds label errors, measured on errors planted by
the noise protocol (nerkit.tools.audit.noise) in the config's training corpus, side by side with
cleanlab and with random order, and what reviewing its top sentences buys.

1. The config's training sentences (data.limit applied) are written to OUT/clean.jsonl, and with
   errors planted to OUT/noisy.jsonl, every change to OUT/truth.jsonl.
2. The audit runs on the noisy corpus (OUT/audit), the same folds feeding every ranking.
3. Sentence level, a sentence being an error when any change touched it: each of nerkit's scores
   (nerkit.tools.audit.suspects.SCORES), cleanlab's `token_classification.rank.get_label_quality_scores`
   (the `audit` extra; the CRF head only) over the same fold models' per-character probabilities,
   its classes O and each entity type (B-, I-, E- and S- merged, as cleanlab's NER tutorial merges
   B- and I-: a boundary error moves a type's characters, a type error changes their class), and a
   seeded random order: precision in the top k, precision and recall at k = the number of noisy
   sentences, AUPRC. Omissions apart: the sentences whose only changes are deletions, ranked among
   the clean ones. Entity level (nerkit alone, whose suspects name entities): every suspect of the
   corpus by its evidence, a hit when it points at a change not found before (ranking.finds),
   against the number of changes; and per kind, the share of its changes found in the top N
   suspects, N the number of changes.
4. With a test set (data.test), the review: a model trained on the clean corpus, on the noisy one, on
   the noisy one with its top-k sentences by the audit's score (k: --review, default the number of
   noisy sentences) replaced by their clean labels, with k random ones replaced, and (with cleanlab)
   with cleanlab's top k; the test F1 of each, and the share of the F1 the noise cost that each
   review recovered.
The record (command, commit, machine, date, every figure) goes to OUT/results.jsonl, replacing an
earlier record of its name. `--resume` keeps the audit's finished folds and the review's finished runs.
"""

from __future__ import annotations

import json
import logging
import random
import time
from datetime import datetime, timezone
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from nerkit.errors import UserError
from nerkit.inference.model_dir import read_metrics
from nerkit.tools.audit.noise import NoiseRates

log = logging.getLogger(__name__)

KS = (10, 50, 100, 500)


@dataclass(frozen=True)
class AuditBenchOptions:
    folds: int = 5
    rates: NoiseRates = field(default_factory=NoiseRates)
    noise_seed: int = 1
    seed: int = 0  # the folds' and the random baselines'
    review: int = 0  # sentences reviewed (0: the number of noisy sentences); -1: no review trainings
    threshold: float = 0.5
    missing_threshold: float | None = None


def is_bench_audit_dir(directory: Path) -> bool:
    return (directory / "truth.jsonl").is_file()


def bench_audit(config_path: str | Path, overrides: list[str], out: str | Path,
                options: AuditBenchOptions = AuditBenchOptions(), resume: bool = False,
                name: str | None = None) -> tuple[str, dict]:
    """Run the benchmark (see the module's docstring); returns its table and record."""
    from nerkit.config import load_config
    from nerkit.data.corpus import write_corpus
    from nerkit.files import atomic_write_text, check_output_directory
    from nerkit.tools.audit.folds import read_training
    from nerkit.tools.audit.noise import corrupt
    from nerkit.tools.audit.run import AuditOptions, audit, is_audit_dir, rank
    from nerkit.tools.audit.suspects import SCORES
    from nerkit.tools.bench.runner import host_info, read_results, write_results
    from nerkit.tools.bench.speed import invocation

    started = time.perf_counter()
    out = Path(out)
    check_output_directory(out, resume, own=is_bench_audit_dir, inputs=[config_path],
                           what="an earlier audit benchmark (--resume it)")
    config = load_config(config_path, overrides)
    corpus = read_training(config)
    out.mkdir(parents=True, exist_ok=True)
    clean_file, noisy_file = out / "clean.jsonl", out / "noisy.jsonl"
    noisy, changes = corrupt(corpus.sentences, options.rates, options.noise_seed)
    write_corpus(clean_file, corpus.sentences, "jsonl")
    write_corpus(noisy_file, noisy, "jsonl")
    atomic_write_text(out / "truth.jsonl", "".join(json.dumps(c.to_dict(corpus.sentences), ensure_ascii=False) + "\n"
                                                   for c in changes))
    scheme = config.data.scheme if config.data.scheme != "auto" else corpus.scheme
    on_noisy = [*overrides, f"data.train={noisy_file}", "data.limit=0", f"data.scheme={scheme}"]
    audit_dir = out / "audit"
    found = audit(config_path, on_noisy, audit_dir,
                  AuditOptions(options.folds, options.seed, threshold=options.threshold,
                               missing_threshold=options.missing_threshold),
                  resume=resume and is_audit_dir(audit_dir), force=not resume and audit_dir.exists())
    noisy_sentences = {c.sentence for c in changes}
    # the audit's sentences are noisy.jsonl's, every one non-empty: its positions are the changes' indices
    rankings = {score: [found.judged[p].index for p in rank(found.judged, score)] for score in SCORES}
    cleanlab = cleanlab_ranking(found)
    if cleanlab is not None:
        rankings["cleanlab"] = cleanlab
    shuffled = [j.index for j in found.judged]
    random.Random(options.seed).shuffle(shuffled)
    rankings["random"] = shuffled
    omitted = omission_sentences(changes)
    record = {"name": name or f"audit-{Path(config_path).stem}", "kind": "audit", "config": str(config_path),
              "overrides": list(overrides), "options": {**asdict(options), "score": found.score},
              "sentences": len(found.judged), "noisy_sentences": len(noisy_sentences),
              "changes": {kind: sum(c.kind == kind for c in changes) for kind in options.rates.__dataclass_fields__},
              "sentence_level": {method: sentence_scores(order, noisy_sentences) for method, order in rankings.items()},
              "omissions": {method: omission_scores(order, omitted, noisy_sentences) for method, order in rankings.items()},
              "entity_level": entity_scores(found, changes), "thresholds": found.thresholds}
    if options.review >= 0 and config.data.test:
        k = options.review or len(noisy_sentences)
        record["review"] = review(config_path, on_noisy, out / "review", corpus.sentences, noisy, rankings,
                                  found.score, k, options.seed, resume)
    elif options.review >= 0:
        log.warning("the config has no data.test: the review's trainings are left out (they are scored on test)")
    record.update(command=invocation(), **host_info(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  seconds=round(time.perf_counter() - started, 1))
    records = read_results(out)
    records[record["name"]] = record
    write_results(out, records)
    table = audit_table(record)
    atomic_write_text(out / "RESULTS.md", "\n".join(f"## {r['name']}\n\n{audit_table(r)}" for r in records.values()))
    return table, record


def sentence_scores(order: list[int], noisy: set[int]) -> dict:
    from nerkit.tools.audit.ranking import ranking_scores

    return ranking_scores([i in noisy for i in order], len(noisy), KS)


def omission_sentences(changes) -> set[int]:
    """The sentences whose only changes are deletions."""
    kinds: dict[int, set[str]] = {}
    for c in changes:
        kinds.setdefault(c.sentence, set()).add(c.kind)
    return {i for i, found in kinds.items() if found == {"delete"}}


def omission_scores(order: list[int], omitted: set[int], noisy: set[int]) -> dict:
    """The omission-only sentences ranked among the clean ones (the other noisy ones left out)."""
    from nerkit.tools.audit.ranking import ranking_scores

    kept = [i for i in order if i in omitted or i not in noisy]
    return ranking_scores([i in omitted for i in kept], len(omitted), KS)


def entity_scores(found, changes) -> dict:
    """Every suspect by its evidence against the changes (see the module's docstring), and per kind
    of change the share found in the top N suspects (N: the number of changes) and by any suspect."""
    from nerkit.tools.audit.ranking import finds, ranking_scores

    by_sentence: dict[int, list] = {}
    for c in changes:
        by_sentence.setdefault(c.sentence, []).append(c)
    suspects = sorted(((s, j.index) for j in found.judged for s in j.suspects), key=lambda p: (-p[0].score, p[1]))
    hits, found_at = [], {}
    for rank, (suspect, i) in enumerate(suspects):
        hit = next((c for c in by_sentence.get(i, []) if c not in found_at and finds(suspect, c)), None)
        if hit is not None:
            found_at[hit] = rank
        hits.append(hit is not None)
    scores = ranking_scores(hits, len(changes), KS)
    scores["suspects"] = len(suspects)
    n = len(changes)
    per_kind = {}
    for kind in sorted({c.kind for c in changes}):
        mine = [c for c in changes if c.kind == kind]
        per_kind[kind] = {"changes": len(mine),
                          "found_in_top": round(sum(found_at.get(c, n) < n for c in mine) / len(mine), 4),
                          "found": round(sum(c in found_at for c in mine) / len(mine), 4)}
    scores["by_kind"] = per_kind
    return scores


def cleanlab_ranking(found) -> list[int] | None:
    """cleanlab's sentence ranking, worst first, from the fold models' per-character probabilities
    (the characters nobody annotated left out); None without cleanlab or without such probabilities
    (a span head)."""
    try:
        from cleanlab.token_classification.rank import get_label_quality_scores
    except ImportError:
        log.warning("cleanlab is not installed (pip install nerkit[audit]): its ranking is left out")
        return None
    import numpy as np

    from nerkit.tools.audit.evidence import flat_labels

    if any(j.char_probabilities is None for j in found.judged):
        log.warning("cleanlab ranks from per-character probabilities, which a span head has not: left out")
        return None
    labels, probabilities = [], []
    for j in found.judged:
        known = np.array(j.sentence.known())
        label = np.zeros(len(j.sentence), dtype=int)
        for s in flat_labels(j.sentence.spans()):
            label[s.start:s.end] = 1 + found.types.index(s.type) if s.type in found.types else 0
        if not known.any():
            known[:] = True
        probs = j.char_probabilities[known]
        labels.append(label[known])
        probabilities.append(probs / probs.sum(1, keepdims=True))
    scores, _ = get_label_quality_scores(labels, probabilities)
    return [found.judged[p].index for p in sorted(range(len(found.judged)), key=lambda p: (scores[p], p))]


def review(config_path, overrides: list[str], out: Path, clean: list, noisy: list, rankings: dict, score: str,
           k: int, seed: int, resume: bool) -> dict:
    """The review's trainings (see the module's docstring): each run's test F1, and what each review
    recovered of the F1 the noise cost."""
    from nerkit.config import load_config
    from nerkit.data.corpus import format_jsonl
    from nerkit.files import atomic_write_text
    from nerkit.training.loop import finished, train, train_or_continue

    config = load_config(config_path, overrides)
    chosen = {"clean": None, "noisy": set(), f"reviewed_{score}": set(rankings[score][:k]),
              "reviewed_random": set(rankings["random"][:k])}
    if "cleanlab" in rankings:
        chosen["reviewed_cleanlab"] = set(rankings["cleanlab"][:k])
    f1 = {}
    for run, fixed in chosen.items():
        run_dir, data = out / run, out / f"{run}.jsonl"
        sentences = clean if fixed is None else [c if i in fixed else n for i, (c, n) in enumerate(zip(clean, noisy))]
        text = format_jsonl(sentences)
        same = data.is_file() and data.read_text(encoding="utf-8") == text  # a resumed review whose choice held
        if not (resume and same and finished(run_dir)):
            run_config = replace(config, data=replace(config.data, train=str(data)))
            if resume and same:  # stopped midway: continued from its checkpoint
                log.info(f"review: continuing {run} ({run_dir})")
                train_or_continue(run_config, run_dir)
            else:
                out.mkdir(parents=True, exist_ok=True)
                atomic_write_text(data, text)
                log.info(f"review: training {run} ({run_dir})")
                train(run_config, out=run_dir, force=True, progress_bar=False)
        metrics = read_metrics(run_dir)
        f1[run] = round(metrics["test"]["f1"], 4)
    cost = f1["clean"] - f1["noisy"]
    recovered = {run: round((value - f1["noisy"]) / cost, 4) if cost > 0 else None
                 for run, value in f1.items() if run.startswith("reviewed_")}
    return {"k": k, "test_f1": f1, "recovered": recovered}


def audit_table(record: dict) -> str:
    """The record as Markdown: the sentence-level rankings side by side, then the rest."""
    methods = list(record["sentence_level"])
    figures = [key for key in record["sentence_level"][methods[0]] if key != "positives"]
    lines = [f"{record['sentences']:,} sentences, {record['noisy_sentences']:,} noisy ({', '.join(f'{k} {v:,}' for k, v in record['changes'].items())})",
             "", "| sentence level | " + " | ".join(figures) + " |", "|---|" + "---:|" * len(figures)]
    for method in methods:
        row = record["sentence_level"][method]
        lines.append(f"| {method} | " + " | ".join(f"{row.get(f, ''):.4f}" if f in row else "" for f in figures) + " |")
    lines += ["", "| omissions alone | recall at positives | auprc |", "|---|---:|---:|"]
    for method, row in record["omissions"].items():
        lines.append(f"| {method} | {row['recall_at_positives']:.4f} | {row['auprc']:.4f} |")
    entity = record["entity_level"]
    lines += ["", f"entity level ({entity['suspects']:,} suspects): recall at the number of changes "
              f"{entity['recall_at_positives']:.4f}, auprc {entity['auprc']:.4f}; by kind, found in the top: "
              + ", ".join(f"{k} {v['found_in_top']:.2f} (at all {v['found']:.2f})" for k, v in entity["by_kind"].items())]
    if "review" in record:
        r = record["review"]
        lines += ["", f"review of {r['k']:,} sentences, test F1: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in r["test_f1"].items())
                  + "; recovered: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in r["recovered"].items())]
    return "\n".join(lines) + "\n"
