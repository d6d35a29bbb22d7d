"""Annotating spans, not sentences (issue 57, section 4): the candidate spans of `nerkit data select
--unit span` against a reference that follows their definition by brute force, the tasks it writes
read back as partial annotation, and `nerkit bench loop --unit span`'s simulated annotator (whole
names, the cost counted exactly) through a tiny loop in both units that stops and resumes."""

from __future__ import annotations

import json
import random

import pytest

from nerkit.data.tags import Span
from nerkit.tools.annotation.spans import LOW, candidate_spans, span_task
from nerkit.tools.bench.annotator import QUERY_COST, partial_sentence, widen


# ------------------------------------------------------------------------------ candidates


def reference_candidates(entities: list[Span], inside: list[float], text: str) -> list[tuple[int, int, float]]:
    """The candidates by their definition, naively: every [a, b) that is a maximal run of characters
    outside the entities with inside >= LOW, trimmed of whitespace; with the entities, grouped into
    the connected parts of "overlaps or touches" (union-find over every pair)."""
    n = len(inside)
    covered = {k for s in entities for k in range(s.start, s.end)}
    doubtful = [k not in covered and inside[k] >= LOW for k in range(n)]
    pieces = [(s.start, s.end, 1 - s.score) for s in entities]
    for a in range(n):
        for b in range(a + 1, n + 1):
            if all(doubtful[a:b]) and (a == 0 or not doubtful[a - 1]) and (b == n or not doubtful[b]):
                while a < b and text[a].isspace():
                    a += 1
                while b > a and text[b - 1].isspace():
                    b -= 1
                if a < b:
                    pieces.append((a, b, max(inside[a:b])))
    parent = list(range(len(pieces)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, (a, b, _) in enumerate(pieces):
        for j, (c, d, _) in enumerate(pieces):
            if a <= d and c <= b:
                parent[root(i)] = root(j)
    groups: dict[int, list] = {}
    for i, piece in enumerate(pieces):
        groups.setdefault(root(i), []).append(piece)
    return sorted((min(p[0] for p in g), max(p[1] for p in g), max(p[2] for p in g)) for g in groups.values())


def rounded(spans):
    return [(a, b, round(u, 9)) for a, b, u in spans]


@pytest.mark.parametrize("seed", range(200))
def test_candidates_equal_the_naive_reference(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 14)
    text = "".join(rng.choice("张三北京 大学。") for _ in range(n))
    entities, at = [], 0
    while at < n:
        start = at + rng.randint(0, 4)
        end = start + rng.randint(1, 3)
        if end > n or rng.random() < 0.3:
            break
        entities.append(Span(start, end, rng.choice(["PER", "LOC"]), rng.random()))
        at = end + rng.randint(0, 2)
    inside = [rng.choice([0.0, 0.01, LOW, 0.3, 0.97, rng.random()]) for _ in range(n)]
    found = candidate_spans(entities, inside, text)
    assert rounded(found) == rounded(reference_candidates(entities, inside, text))
    for (a, b, _), (c, _, _) in zip(found, found[1:]):
        assert b < c  # disjoint and apart: a text's spans give valid unknown regions


def test_candidates_by_hand():
    text = "张三去北京大学了"
    entities = [Span(0, 2, "PER", 0.9), Span(3, 5, "LOC", 0.6)]
    inside = [0.9, 0.9, 0.01, 0.95, 0.95, 0.4, 0.2, 0.0]
    # 张三 alone (去 is sure); 北京 and the doubtful 大学 beside it one question, as unsure as 北京 (0.4)
    assert rounded(candidate_spans(entities, inside, text)) == [(0, 2, 0.1), (3, 7, 0.4)]
    # nothing predicted: a run of doubt, trimmed of spaces, scored by its most doubtful character
    assert rounded(candidate_spans([], [0.0, 0.2, 0.3, 0.6, 0.1, 0.0], "a bcd ")) == [(2, 5, 0.6)]
    assert candidate_spans([], [0.0, 0.2, 0.0], "a b") == []  # a run of a space alone


def test_a_task_is_the_entities_inside_its_spans_and_the_rest_unknown():
    entities = [Span(0, 2, "PER", 0.9), Span(3, 5, "LOC", 0.6), Span(8, 9, "ORG", 0.5)]
    inside, unknown = span_task("张三去北京大学了在", entities, [(3, 7)])
    assert inside == [entities[1]] and unknown == [(0, 3), (7, 9)]
    inside, unknown = span_task("张三去北京大学了在", entities, [(0, 2), (8, 9)])
    assert inside == [entities[0], entities[2]] and unknown == [(2, 8)]


# ------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from helpers import TINY_DEV

    from nerkit.data.corpus import read_corpus

    path = tmp_path_factory.mktemp("pool") / "pool.txt"
    path.write_text("".join(s.text + "\n" for s in read_corpus(TINY_DEV).sentences), encoding="utf-8")
    return path


def test_select_spans_writes_partial_annotation_that_reads_back(tiny_model_dir, pool, tmp_path, nerkit):
    from nerkit.data.corpus import read_corpus
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.annotation.spans import inside_probabilities

    out = tmp_path / "tasks.jsonl"
    nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "6", "--unit", "span",
           "-o", str(out))
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    pipe = Pipeline.load(tiny_model_dir)
    texts = [r["text"] for r in records]
    predicted = pipe.predict_tokens(texts, scores=True)
    inside = inside_probabilities(pipe, texts)
    every = sorted(((1 - u, i, a, b) for i, text in enumerate(pool.read_text(encoding="utf-8").splitlines())
                    for a, b, u in candidate_spans(pipe.predict_tokens([text], scores=True)[0],
                                                   inside_probabilities(pipe, [text])[0], text)))
    asked = []
    for i, r in enumerate(records):
        known, at = [], 0
        for a, b in r["unknown"]:
            if a > at:
                known.append((at, a))
            at = b
        if at < len(r["text"]):
            known.append((at, len(r["text"])))
        spans = {(a, b): u for a, b, u in candidate_spans(predicted[i], inside[i], r["text"])}
        assert all(k in spans for k in known)  # each known region one candidate span
        assert r["confidence"] == pytest.approx(1 - max(spans[k] for k in known), abs=1e-6)
        assert [(e["start"], e["end"], e["type"]) for e in r["entities"]] == [
            (s.start, s.end, s.type) for s in predicted[i] if any(a <= s.start and s.end <= b for a, b in known)]
        asked += [round(1 - spans[k], 6) for k in known]
    assert len(asked) == 6 and sorted(asked) == pytest.approx([c for c, *_ in every[:6]], abs=1e-6)
    corpus = read_corpus(out)  # partial annotation nerkit trains on, as it was written
    assert [s.unknown for s in corpus.sentences] == [[tuple(x) for x in r["unknown"]] or None for r in records]
    assert [[(e.start, e.end, e.type) for e in s.spans()] for s in corpus.sentences] == [
        [(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in records]
    for fmt, reader in (("label-studio", "label-studio"), ("doccano", "doccano")):
        other = tmp_path / f"tasks.{fmt}.json"
        nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "6", "--unit", "span",
               "-f", fmt, "-o", str(other))
        if fmt == "label-studio":  # predictions, not annotations: accept them as the annotation to read them
            tasks = json.loads(other.read_text(encoding="utf-8"))
            for task in tasks:
                task["annotations"] = task.pop("predictions")
            other.write_text(json.dumps(tasks, ensure_ascii=False), encoding="utf-8")
        again = read_corpus(other, fmt=reader)
        assert [(s.text, s.unknown, s.spans()) for s in again.sentences] == [
            (s.text, s.unknown, s.spans()) for s in corpus.sentences]


def test_inside_probabilities_are_the_crfs_marginals_and_a_long_text_takes_the_central_window(tiny_model_dir):
    from nerkit.features.batch import collate_padded
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.annotation.spans import inside_probabilities

    pipe = Pipeline.load(tiny_model_dir)
    text = "王五和赵六在武汉的华中科技大学见面，然后去了北京。"
    batch = collate_padded([pipe.featurizer.example(list(text))], 1, len(text))
    marginals = pipe.model.head.crf.marginals(pipe.model.emissions(batch), batch.mask)[0]  # (T, K)
    expected = [1 - float(row[pipe.tags.index("O")]) for row in marginals]
    found = inside_probabilities(pipe, [text, ""], window=0)
    assert found[0] == pytest.approx(expected, abs=1e-6) and found[1] == []  # float32 emissions, other padding
    whole = inside_probabilities(pipe, [text * 6], window=0)[0]
    windowed = inside_probabilities(pipe, [text * 6], window=2 * len(text))[0]
    assert len(windowed) == len(whole)
    # far from every window's edge the context is the same as the whole text's, and so, nearly, is q
    middle = range(2 * len(text), 4 * len(text))
    assert max(abs(windowed[k] - whole[k]) for k in middle) < 0.05


def test_select_spans_never_asks_again_what_an_exclude_corpus_annotated(tiny_model_dir, pool, tmp_path, nerkit):
    from nerkit.data.corpus import read_corpus

    first = tmp_path / "first.jsonl"
    nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "3", "--unit", "span",
           "-o", str(first))
    second = tmp_path / "second.jsonl"
    nerkit("data", "select", "--model", str(tiny_model_dir), "--pool", str(pool), "-n", "3", "--unit", "span",
           "-o", str(second), "--exclude", str(first))
    answered = {s.text: s.known() for s in read_corpus(first).sentences}
    for s in read_corpus(second).sentences:
        if s.text in answered:  # the same text asked again, about other characters only
            assert not any(a and b for a, b in zip(answered[s.text], s.known()))
    assert [json.loads(line) for line in first.read_text().splitlines()] != \
        [json.loads(line) for line in second.read_text().splitlines()]


def test_select_spans_refuses_a_span_head_in_one_line(tmp_path, pool, nerkit):
    from helpers import tiny_raw_config

    from nerkit.config import build_config
    from nerkit.training.loop import train

    model = tmp_path / "span-model"
    train(build_config(tiny_raw_config(), "<span>", ["train.max_steps=1", "model.head=span"]), out=model)
    out = tmp_path / "tasks.jsonl"
    refused = nerkit("data", "select", "--model", str(model), "--pool", str(pool), "-n", "3", "--unit", "span",
                     "-o", str(out), check=False)
    error = refused.stderr.strip().splitlines()[-1]  # the lines before it are the training's
    assert refused.returncode == 2 and "--unit span" in error and "model.head: crf" in error and not out.exists()


# ------------------------------------------------------------------------------ the simulated annotator


def test_an_answer_is_widened_to_the_whole_names_it_cuts():
    gold = [Span(2, 5, "PER"), Span(5, 7, "LOC"), Span(9, 12, "ORG")]
    assert widen(3, 4, gold) == (2, 5)  # inside a name: the name
    assert widen(4, 6, gold) == (2, 7)  # across two: both
    assert widen(7, 9, gold) == (7, 9)  # between names: as asked
    assert widen(8, 10, gold) == (8, 12)
    nested = [Span(0, 4, "ORG"), Span(3, 8, "LOC")]
    assert widen(5, 6, nested) == (0, 8)  # widened until nothing crosses, through the second


def test_a_partial_sentence_keeps_the_gold_of_its_answers_only():
    from nerkit.data.records import Sentence

    sentence = Sentence(list("张三去北京了"), ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"])
    partial = partial_sentence(sentence, [(2, 5)])
    assert partial.unknown == [(0, 2), (5, 6)] and partial.spans() == [Span(3, 5, "LOC")]
    assert partial.tags == ["O", "O", "O", "B-LOC", "I-LOC", "O"] and sentence.tags[0] == "B-PER"
    assert partial_sentence(sentence, [(0, 6)]).unknown is None


@pytest.fixture
def loop_config(tmp_path):
    from helpers import write_loop_config

    return write_loop_config(tmp_path)


def test_a_span_loop_beside_the_sentence_loop_counts_its_cost_exactly_and_resumes(loop_config, tmp_path, nerkit):
    from helpers import TINY_TRAIN

    from nerkit.data.corpus import read_corpus

    out = tmp_path / "loop"
    args = ["bench", "loop", "--config", str(loop_config), "--out", str(out), "--start", "10", "--add", "4",
            "--seeds", "1", "--strategies", "uncertainty", "--unit", "sentence,span", "--full"]
    nerkit(*args, "--rounds", "1")  # stopped after round 1 ...
    state = out / "state" / "span-uncertainty-s1.json"
    before = json.loads(state.read_text())
    shown = nerkit(*args, "--rounds", "2", "--resume").stdout  # ... and carried on
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["unit"], r["round"]) for r in records) == [
        ("full", 0), ("sentence", 0), ("sentence", 1), ("sentence", 2), ("span", 0), ("span", 1), ("span", 2)]
    after = json.loads(state.read_text())
    assert after["complete"] == before["complete"] and after["chosen"] == 2
    assert after["answers"][:len(before["answers"])] == before["answers"]  # round 1's answers kept, round 2's added
    assert {a[0] for a in after["answers"]} == {1, 2}
    train = [s for s in read_corpus(TINY_TRAIN).sentences if len(s)]  # the loop's training split
    sentence_state = json.loads((out / "state" / "uncertainty-s1.json").read_text())
    assert after["complete"] == sentence_state["labelled"][:10]  # one round 0 for both units
    by = {(r["unit"], r["round"]): r for r in records}
    assert by["span", 0]["dev_f1"] == by["sentence", 0]["dev_f1"]
    mean = sum(len(s) for s in train) / len(train)
    for round_ in (0, 1, 2):
        answers = [a for a in after["answers"] if a[0] <= round_]
        characters = sum(len(train[i]) for i in after["complete"]) + sum(e - s for _, _, s, e in answers)
        record = by["span", round_]
        assert record["characters"] == characters and record["queries"] == 10 + len(answers)
        assert record["cost"] == characters + QUERY_COST * (10 + len(answers))
        if round_:  # a round buys what 4 sentences of mean length cost, the last question over it
            spent = [e - s + QUERY_COST for r, _, s, e in after["answers"] if r == round_]
            assert sum(spent[:-1]) < round(4 * (mean + QUERY_COST)) <= sum(spent)
        labelled = sentence_state["labelled"][:10 + 4 * round_]
        chars = sum(len(train[i]) for i in labelled)
        assert (by["sentence", round_]["characters"], by["sentence", round_]["cost"]) == \
            (chars, chars + QUERY_COST * len(labelled))
    for _, i, start, end in after["answers"]:  # each answer whole names: no gold entity crosses its edges
        assert i not in after["complete"]
        assert not any(s.start < start < s.end or s.start < end < s.end for s in train[i].spans())
    assert by["full", 0]["characters"] == sum(len(s) for s in train)
    assert "reaches 99% at round" in shown and "| tiny | 1 |" in shown
    figure = tmp_path / "loop.png"  # both units drawn against their cost
    nerkit("plot", "loop", str(out / "results.jsonl"), "--out", str(figure))
    assert figure.stat().st_size > 0
    refused = nerkit(*args, "--rounds", "2", check=False)  # a finished loop is not overwritten without --resume
    assert refused.returncode == 2 and "not empty" in refused.stderr


def test_a_span_loop_refuses_a_span_head(loop_config, tmp_path, nerkit):
    refused = nerkit("bench", "loop", "--config", str(loop_config), "--out", str(tmp_path / "loop"), "--unit", "span",
                     "--set", "model.head=span", check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "model.head: crf" in refused.stderr
    refused = nerkit("bench", "loop", "--config", str(loop_config), "--out", str(tmp_path / "loop"), "--unit", "span",
                     *(f"--set={o}" for o in ("data.context=document", "encoder.name=transformer",
                                              "encoder.attention=xl", "encoder.memory=16", "encoder.segment=24")),
                     check=False)
    assert refused.returncode == 2 and "data.context: document" in refused.stderr.strip().splitlines()[-1]
    refused = nerkit("bench", "loop", "--config", str(loop_config), "--out", str(tmp_path / "loop"), "--unit", "word",
                     check=False)
    assert refused.returncode == 2 and "--unit takes sentence, span" in refused.stderr


def test_the_reach_table_compares_each_loop_with_the_sentence_loop_at_its_first_round_past_99_percent():
    from nerkit.tools.bench.loop import reach_table

    def record(unit, strategy, round_, test_f1, characters, queries):
        return {"config": "c/pd.yaml", "unit": unit, "strategy": strategy, "seed": 1, "round": round_,
                "test_f1": test_f1, "dev_f1": 0.5, "characters": characters, "queries": queries,
                "cost": characters + 10 * queries}

    records = [record("full", "all", 0, 0.80, 1000, 100),
               record("sentence", "uncertainty", 0, 0.70, 100, 10), record("sentence", "uncertainty", 1, 0.795, 400, 40),
               record("span", "uncertainty", 0, 0.70, 100, 10), record("span", "uncertainty", 1, 0.78, 150, 30),
               record("span", "uncertainty", 2, 0.792, 200, 50)]  # 0.792 is 99% of 0.80: reached
    rows = [line for line in reach_table(records).splitlines() if line.startswith("| pd |")]
    assert rows[0].endswith("| sentence, uncertainty | 1 | 800 | 400 (40.0%) |  |  |")
    assert rows[1].endswith("| span, uncertainty | 2 | 700 | 200 (20.0%) | 0.88 | 0.50 |")
    records[-1]["test_f1"] = 0.7919  # just short of 99%: the best round is named instead
    assert "| span, uncertainty | not reached (best 79.19 at round 2) |" in reach_table(records)


def test_a_loop_round_stopped_midway_continues_from_its_checkpoint_and_a_finished_one_is_only_scored(
        loop_config, tmp_path, monkeypatch):
    import nerkit.training.loop as training
    from nerkit.config import load_config
    from nerkit.data.splits import read_splits
    from nerkit.tools.bench.loop import train_round

    config = load_config(loop_config, [])
    splits = read_splits(config)
    run_dir = tmp_path / "round1"
    _, whole = train_round(config, splits, splits.train[:10], run_dir, 1, 0)
    weights = (run_dir / "model.safetensors").read_bytes()
    epochs, resumed = [], []
    run_epoch, train = training.run_epoch, training.train
    monkeypatch.setattr(training, "run_epoch", lambda run, epoch: epochs.append(epoch) or run_epoch(run, epoch))
    monkeypatch.setattr(training, "train", lambda *a, **k: resumed.append(k["resume"]) or train(*a, **k))
    # Stopped after its last epoch's checkpoint, before its final model: metrics.json says not why it stopped.
    final = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    (run_dir / "metrics.json").write_text(json.dumps({"best_epoch": final["best_epoch"], "dev": final["dev"]}))
    _, again = train_round(config, splits, splits.train[:10], run_dir, 1, 0)
    assert (again, resumed, epochs) == (whole, [True], [])  # continued, no epoch trained again
    assert (run_dir / "model.safetensors").read_bytes() == weights
    _, scored = train_round(config, splits, splits.train[:10], run_dir, 1, 0)
    assert (scored, resumed) == (whole, [True])  # finished: not trained at all
