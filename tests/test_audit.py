"""`nerkit data audit` (nerkit.tools.audit): a tiny corpus with planted errors that the audit must rank
first, unknown regions never called errors, the span head, resuming, the outputs read back by nerkit's
own readers, the noise protocol, the ranking metrics against a hand-worked example, cleanlab's
baseline when it is installed, and the users' errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from helpers import run_cli

from nerkit.data.tags import Span
from nerkit.tools.audit.ranking import average_precision, precision_at, ranking_scores, recall_at
from nerkit.tools.audit.suspects import class_thresholds, find_suspects, logit, proposed_labels, sentence_score

PEOPLE = ["张伟", "王芳", "李娜", "刘洋", "陈静", "杨帆", "赵磊", "孙丽"]
PLACES = ["北京", "上海", "广州", "深圳", "武汉", "成都", "南京", "西安"]
TEMPLATES = ["{p}在{l}工作。", "{p}去了{l}。", "{l}的{p}很忙。", "我和{p}住在{l}。"]

# The planted errors (sentence index: what was done), blatant enough for a tiny model to see.
TYPE_ERROR, OMISSION, SPURIOUS = 3, 10, 17
PARTIAL = 22  # a sentence whose name lies in a region nobody annotated


def record(text: str, entities: list[tuple[str, str]], unknown=None) -> dict:
    out = {"text": text, "entities": [{"start": text.index(s), "end": text.index(s) + len(s), "type": t}
                                      for s, t in entities]}
    if unknown:
        out["unknown"] = unknown
    return out


def tiny_corpus(count: int, seed: int, planted: bool) -> list[dict]:
    rnd = random.Random(seed)
    records = []
    for i in range(count):
        p, l, template = rnd.choice(PEOPLE), rnd.choice(PLACES), TEMPLATES[i % len(TEMPLATES)]
        text = template.format(p=p, l=l)
        entities = [(p, "PER"), (l, "LOC")]
        unknown = None
        if planted and i == TYPE_ERROR:
            entities = [(p, "PER"), (l, "PER")]
        elif planted and i == OMISSION:
            entities = [(l, "LOC")]
        elif planted and i == SPURIOUS:
            text = f"{p}在{l}工作。"
            entities = [(p, "PER"), (l, "LOC"), ("工作", "PER")]
        elif planted and i == PARTIAL:
            text = f"{p}在{l}工作。"
            entities = [(l, "LOC")]
            unknown = [[0, len(p)]]  # the name nobody annotated: not an omission
        records.append(record(text, entities, unknown))
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def audit_config(directory: Path, head: str = "crf", epochs: int = 12) -> Path:
    train = write_jsonl(directory / "train.jsonl", tiny_corpus(48, 1, planted=True))
    dev = write_jsonl(directory / "dev.jsonl", tiny_corpus(12, 2, planted=False))
    raw = {"data": {"train": str(train), "dev": str(dev), "test": str(dev), "max_len": 250},
           "embeddings": {"char_dim": 16, "bichar_dim": 8, "dropout": 0.0},
           "encoder": {"name": "bilstm", "hidden_size": 24},
           "model": {"head": head},
           "train": {"epochs": epochs, "batch_size": 4, "lr": 0.02, "patience": 0, "seed": 1, "device": "cpu",
                     "threads": 1}}
    if head == "span":
        raw["span"] = {"max_width": 6}
    path = directory / "audit.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """One audit of the tiny corpus with 2 folds, shared by the tests that read it."""
    from nerkit.tools.audit.run import AuditOptions, audit

    directory = tmp_path_factory.mktemp("audit")
    config = audit_config(directory)
    result = audit(config, [], directory / "out", AuditOptions(folds=2))
    return config, directory / "out", result


def test_the_planted_errors_are_ranked_first(audited):
    _, out, result = audited
    top = {result.judged[p].index for p in result.ranking[:3]}
    assert top == {TYPE_ERROR, OMISSION, SPURIOUS}
    kinds = {result.judged[p].index: {s.kind for s in result.judged[p].suspects} for p in result.ranking[:3]}
    assert "type" in kinds[TYPE_ERROR] and "missing" in kinds[OMISSION] and "unsupported" in kinds[SPURIOUS]
    lines = [json.loads(line) for line in (out / "suspects.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["rank"] for r in lines] == list(range(1, 49)) and {r["index"] for r in lines[:3]} == top
    assert lines[0]["score"] >= lines[-1]["score"] and lines[0]["suspects"]


def test_unknown_regions_are_never_called_errors(audited):
    _, _, result = audited
    judged = next(j for j in result.judged if j.index == PARTIAL)
    assert judged.sentence.unknown == [(0, 2)]
    assert all(s.proposed is None or s.proposed.start >= 2 for s in judged.suspects)
    for j in result.judged:  # no suspect anywhere touches a character nobody annotated
        known = j.sentence.known()
        assert all(all(known[x.start:x.end]) for s in j.suspects for x in (s.labelled, s.proposed) if x is not None)


def test_the_outputs_load_in_nerkits_readers(audited):
    from nerkit.data.annotation import read_doccano, read_label_studio

    _, out, result = audited
    flagged = [result.judged[p] for p in result.ranking if result.judged[p].suspects]
    tasks = json.loads((out / "label-studio.json").read_text(encoding="utf-8"))
    assert len(tasks) == len(flagged) and tasks[0]["predictions"][0]["model_version"].startswith("nerkit audit fold")
    studio = read_label_studio(out / "label-studio.json").sentences  # the annotations: the labels as they are
    doccano = read_doccano(out / "doccano.jsonl").sentences
    for judged, a, b in zip(flagged, studio, doccano):
        assert a.text == b.text == judged.sentence.text
        assert a.spans() == b.spans() == judged.sentence.spans()
    page = (out / "suspects.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "mark" in page
    thresholds = json.loads((out / "summary.json").read_text(encoding="utf-8"))["thresholds"]
    assert list(thresholds) == ["O", *result.types] and thresholds == pytest.approx(result.thresholds, abs=1e-6)
    assert thresholds["O"] > max(t for name, t in thresholds.items() if name != "O")  # O is read surest


def test_resume_keeps_finished_folds(audited, tmp_path, monkeypatch):
    import shutil

    import nerkit.training.loop as loop
    from nerkit.tools.audit.run import AuditOptions, audit

    config, out, result = audited
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "folds" / "1" / "metrics.json").unlink()  # fold 1 stopped before its final model: it resumes
    calls, train = [], loop.train

    def once(config, out, **options):
        calls.append((Path(out).name, options["resume"]))
        return train(config, out, **options)

    monkeypatch.setattr(loop, "train", once)
    again = audit(config, [], copy, AuditOptions(folds=2), resume=True)
    assert calls == [("1", True)]  # fold 0 was finished: kept
    for a, b in zip(again.judged, result.judged):
        assert a.scores == pytest.approx(b.scores)


def test_the_span_head_audits(tmp_path):
    from nerkit.tools.audit.run import AuditOptions, audit

    config = audit_config(tmp_path, head="span", epochs=8)
    result = audit(config, [], tmp_path / "out", AuditOptions(folds=2, score="path"))
    assert all(j.char_probabilities is None for j in result.judged)
    assert {s.kind for j in result.judged for s in j.suspects} <= {"missing", "unsupported", "type", "boundary"}
    assert TYPE_ERROR in {result.judged[p].index for p in result.ranking[:5]}
    partial = next(j for j in result.judged if j.index == PARTIAL)
    assert all(s.proposed is None or s.proposed.start >= 2 for s in partial.suspects)


def test_cleanlab_ranks_the_same_folds(audited):
    pytest.importorskip("cleanlab")
    from nerkit.tools.bench.audit import cleanlab_ranking

    _, _, result = audited
    order = cleanlab_ranking(result)
    assert sorted(order) == sorted(j.index for j in result.judged)


# ------------------------------------------------------------------------------- suspects by hand

def test_suspects_of_each_kind():
    labelled = [Span(0, 2, "PER", 0.9), Span(3, 5, "PER", 0.1), Span(6, 8, "LOC", 0.2), Span(9, 11, "ORG", 0.35)]
    cells = [Span(3, 5, "LOC", 0.85),  # the same span, another type
             Span(6, 9, "LOC", 0.7),  # overlapping, the same type
             Span(12, 14, "PER", 0.6),  # no labelled entity there
             Span(15, 16, "PER", 0.3)]  # too unlikely at 0.5
    known = [True] * 16
    suspects, confidences = find_suspects(labelled, cells, known, types=["PER", "LOC", "ORG"])
    assert [(s.kind, s.labelled, s.proposed) for s in suspects] == [
        ("type", Span(3, 5, "PER"), Span(3, 5, "LOC")), ("boundary", Span(6, 8, "LOC"), Span(6, 9, "LOC")),
        ("unsupported", Span(9, 11, "ORG"), None), ("missing", None, Span(12, 14, "PER"))]
    assert confidences[3] == (1, pytest.approx(0.1)) and confidences[8] == (0, pytest.approx(0.3))
    # one bar for every class (cleanlab's reading): the retyped entity, no PER over it with 0.9
    assert sentence_score(confidences, [0.5] * 4) == pytest.approx(logit(0.9))
    # confident learning's bars: O read with near certainty, names not: character 8, labelled O with
    # P(O) 0.3 (the LOC one character longer), stands out further than PER's 0.1 against 0.7
    assert sentence_score(confidences, [0.98, 0.7, 0.7, 0.7]) == pytest.approx(logit(0.98) - logit(0.3))
    assert class_thresholds([confidences, [(2, 0.5)]], 5) == pytest.approx(
        [sum(p for c, p in confidences if c == 0) / sum(c == 0 for c, _ in confidences), 0.5, (0.9 + 0.9 + 0.5) / 3, 0.35, 0.5])
    assert proposed_labels(labelled, suspects) == [Span(0, 2, "PER"), Span(3, 5, "LOC"), Span(6, 9, "LOC"),
                                                   Span(12, 14, "PER")]
    # a name the model is sure of but not of its ends: 0.3 + 0.3 that some entity covers 20-21
    spread = find_suspects(labelled, cells + [Span(20, 22, "LOC", 0.3), Span(20, 23, "LOC", 0.25)], [True] * 24)[0]
    assert ("missing", Span(20, 22, "LOC")) in [(s.kind, s.proposed) for s in spread]
    assert next(s.score for s in spread if s.proposed == Span(20, 22, "LOC")) == pytest.approx(0.55)
    lower, _ = find_suspects(labelled, cells, known, missing_threshold=0.25)
    assert ("missing", Span(15, 16, "PER")) in [(s.kind, s.proposed) for s in lower]
    known[12] = False  # nobody annotated that character: no omission there
    assert "missing" not in {s.kind for s in find_suspects(labelled, cells, known)[0]}


# ------------------------------------------------------------------------------- metrics by hand

def test_ranking_metrics_against_a_hand_worked_example():
    hits = [True, False, True, False, False, True]
    assert precision_at(hits, 1) == 1 and precision_at(hits, 2) == 0.5 and precision_at(hits, 4) == 0.5
    assert recall_at(hits, 3, 4) == 0.5
    # precision at each error's rank: 1/1, 2/3, 3/6; a fourth error never reached adds 0
    assert average_precision(hits) == pytest.approx((1 + 2 / 3 + 3 / 6) / 3)
    assert average_precision(hits, 4) == pytest.approx((1 + 2 / 3 + 3 / 6) / 4)
    scores = ranking_scores(hits, 3, ks=(2, 10))
    assert scores == {"precision_at_2": 0.5, "positives": 3, "recall_at_positives": 0.6667, "auprc": 0.7222}
    sklearn = pytest.importorskip("sklearn.metrics")
    assert average_precision(hits) == pytest.approx(sklearn.average_precision_score(
        hits, [len(hits) - r for r in range(len(hits))]))


# ------------------------------------------------------------------------------- the noise protocol

def test_the_noise_protocol_is_seeded_and_its_truth_exact(tmp_path):
    from nerkit.data.corpus import read_corpus
    from nerkit.tools.audit.noise import NoiseRates, corrupt, read_truth

    source = write_jsonl(tmp_path / "clean.jsonl", tiny_corpus(400, 3, planted=False))
    sentences = read_corpus(source).sentences
    rates = NoiseRates(retype=0.1, boundary=0.1, delete=0.1, spurious=0.05)
    noisy, changes = corrupt(sentences, rates, seed=5)
    again, same = corrupt(sentences, rates, seed=5)
    assert changes == same and [s.spans() for s in noisy] == [s.spans() for s in again]
    assert changes != corrupt(sentences, rates, seed=6)[1]
    entities = sum(len(s.spans()) for s in sentences)
    counts = {kind: sum(c.kind == kind for c in changes) for kind in ("retype", "boundary", "delete", "spurious")}
    assert 0.05 * entities < counts["retype"] < 0.15 * entities and counts["spurious"] == round(0.05 * entities)
    # undoing every change gives back the clean corpus; no other sentence changed
    restored = [list(s.spans()) for s in noisy]
    for c in changes:
        spans = restored[c.sentence]
        if c.after is not None:
            spans.remove(c.after)
        if c.before is not None:
            spans.append(c.before)
    assert [sorted(s, key=lambda x: (x.start, x.end)) for s in restored] == [s.spans() for s in sentences]

def test_the_corrupt_command_writes_the_protocols_corpus_and_truth(tmp_path, monkeypatch, capfd):
    from nerkit.data.corpus import read_corpus
    from nerkit.tools.audit.noise import NoiseRates, corrupt, read_truth

    source = write_jsonl(tmp_path / "clean.jsonl", tiny_corpus(200, 3, planted=False))
    noisy, changes = corrupt(read_corpus(source).sentences, NoiseRates(0.1, 0.1, 0.1, 0.05), seed=5)
    result = run_cli(monkeypatch, capfd, "data", "corrupt", source, tmp_path / "noisy.jsonl",
                     "--truth", tmp_path / "truth.jsonl", "--retype", "0.1", "--boundary", "0.1", "--delete", "0.1",
                     "--spurious", "0.05", "--seed", "5")
    assert result.returncode == 0, result.stderr
    assert read_truth(tmp_path / "truth.jsonl") == changes
    assert [s.spans() for s in read_corpus(tmp_path / "noisy.jsonl").sentences] == [s.spans() for s in noisy]


# ------------------------------------------------------------------------------- the command line

def test_user_errors_are_one_line(tmp_path, monkeypatch, capfd):
    config = audit_config(tmp_path)
    for args, words in [(["--folds", "1"], "--folds must be at least 2"),
                        (["--resume"], "nothing to resume"),
                        (["--score", "best"], "--score")]:
        result = run_cli(monkeypatch, capfd, "data", "audit", "--config", config, "--out", tmp_path / "new", *args)
        assert result.returncode == 2, result
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert words in result.stderr and (len(lines) == 1 or "Usage" in result.stderr), result.stderr
    tiny = write_jsonl(tmp_path / "three.jsonl", tiny_corpus(3, 1, planted=False))
    result = run_cli(monkeypatch, capfd, "data", "audit", "--config", config, "--out", tmp_path / "few",
                     "--folds", "5", "--set", f"data.train={tiny}")
    assert result.returncode == 2 and "cannot make 5 folds" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.slow
def test_the_benchmark_runs_end_to_end(tmp_path, monkeypatch, capfd):
    config = audit_config(tmp_path, epochs=4)
    result = run_cli(monkeypatch, capfd, "bench", "audit", "--config", config, "--out", tmp_path / "bench",
                     "--folds", "2", "--retype", "0.1", "--boundary", "0.1", "--delete", "0.1", "--spurious", "0.05",
                     "--review", "5", "--name", "tiny")
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "bench" / "results.jsonl").read_text(encoding="utf-8"))
    assert record["name"] == "tiny" and record["command"].startswith("nerkit bench audit")
    assert {"entity", "path", "random"} <= set(record["sentence_level"]) and "git_commit" in record
    assert set(record["review"]["test_f1"]) >= {"clean", "noisy", "reviewed_entity", "reviewed_random"}
    assert "sentence level" in result.stdout


def test_a_name_whose_ends_the_model_doubts_is_not_unsupported():
    """A correct name the model reads with p = 0.2 for its exact span, 0.7 for one character longer:
    its characters are covered by its type either way, so it is no error of the labels (1 - p would
    say it is); a retyped name is one, by the exact marginals when they are given."""
    import numpy as np

    labelled = [Span(0, 2, "LOC", 0.2), Span(4, 6, "PER", 0.05)]
    cells = [Span(0, 3, "LOC", 0.7), Span(4, 6, "LOC", 0.9)]
    suspects, _ = find_suspects(labelled, cells, [True] * 8)
    assert [(s.kind, s.labelled) for s in suspects] == [("type", Span(4, 6, "PER")), ("boundary", Span(0, 2, "LOC"))]
    chars = np.zeros((8, 3))  # O, LOC, PER: the same reading as exact marginals
    chars[:, 0] = 1.0
    chars[0:2] = [0.1, 0.9, 0.0]
    chars[2] = [0.3, 0.7, 0.0]
    chars[4:6] = [0.05, 0.9, 0.05]
    exact, confidences = find_suspects(labelled, [Span(4, 6, "LOC", 0.9)], [True] * 8, chars=chars, types=["LOC", "PER"])
    assert [(s.kind, s.labelled) for s in exact] == [("type", Span(4, 6, "PER"))]
    assert sentence_score(confidences, [0.5] * 3) == pytest.approx(logit(0.95))  # no PER over characters 4-5: 0.95
