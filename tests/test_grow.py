"""Adding entity types to a trained model (issue 58, section 1; nerkit.training.grow): the head grows
with the old weights kept exactly and the grown model predicting as its source until it trains;
the targets each head learns from (hard, soft, none), characters no label speaks of for a type never
read as O; the run's model directory, its record, save and load, resume; the refusals; `nerkit
bench grow` end to end on the tiny corpus; and grow.anchor's L2-SP penalty on the shared weights.
Every encoder grows in tests/encoders/test_contract.py."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
import torch
from helpers import TINY_DEV, TINY_TRAIN, assert_one_error_line, parse_jsonl, tiny_raw_config

from nerkit.config import build_config
from nerkit.data.corpus import read_corpus, write_corpus
from nerkit.data.matching import keep_types
from nerkit.data.records import Sentence
from nerkit.data.tags import Span, spans_to_tags
from nerkit.features.batch import collate
from nerkit.inference.pipeline import Pipeline
from nerkit.training.grow import Growth
from nerkit.training.loop import train

TEXTS = [s.text for s in read_corpus(TINY_DEV).sentences] + ["张三在北京大学读书。", "李明去了上海", "上"]


def typed_corpus(path, source, types) -> str:
    """`source`'s sentences with the entities of `types` alone, written as BIO."""
    write_corpus(path, keep_types(read_corpus(source).sentences, set(types)), "bio")
    return str(path)


def grow_config(tmp_path, *overrides: str, types=("LOC",), dev_types=("PER", "LOC")):
    """The tiny config whose train labels `types` alone and whose dev labels `dev_types`."""
    raw = tiny_raw_config()
    raw["data"]["train"] = typed_corpus(tmp_path / f"train-{'-'.join(types)}.bio", TINY_TRAIN, types)
    raw["data"]["dev"] = typed_corpus(tmp_path / f"dev-{'-'.join(dev_types)}.bio", TINY_DEV, dev_types)
    raw["train"]["epochs"] = 1
    return build_config(raw, "<grow config>", list(overrides))


@pytest.fixture(scope="module")
def per_models(tmp_path_factory):
    """A model of PER alone under each head (its corpus: the tiny one with PER entities only)."""
    root = tmp_path_factory.mktemp("per")
    models = {}
    for head in ("crf", "span"):
        raw = tiny_raw_config()
        raw["data"]["train"] = typed_corpus(root / "train-per.bio", TINY_TRAIN, ["PER"])
        raw["data"]["dev"] = typed_corpus(root / "dev-per.bio", TINY_DEV, ["PER"])
        overrides = ["train.epochs=4"] + (["model.head=span", "span.size=8", "span.threshold=0.3"] if head == "span" else [])
        train(build_config(raw, "<per>", overrides), out=root / head, progress_bar=False)
        models[head] = root / head
    return models


def grown(config, source):
    """The grown pipeline of `config` from `source`, before any training, its Growth and splits."""
    from nerkit.data.splits import read_splits

    growth = Growth.start(replace(config, grow=replace(config.grow, source=str(source))))
    splits = read_splits(growth.config)
    return growth.pipeline(splits, "cpu"), growth, splits


@pytest.mark.parametrize("head", ["crf", "span"])
def test_growth_keeps_every_old_weight_and_predicts_as_the_source_before_training(head, tmp_path, per_models):
    source = Pipeline.load(per_models[head])
    pipe, growth, _ = grown(grow_config(tmp_path), per_models[head])
    assert growth.old_types == ["PER"] and growth.new_types == ["LOC"] and pipe.types == ["LOC", "PER"]
    old_state, new_state = source.model.state_dict(), pipe.model.state_dict()
    for key, tensor in old_state.items():
        if key.startswith(("emission.", "crf.", "span.")):
            continue
        assert torch.equal(new_state[key], tensor), key
    if head == "crf":
        rows = [pipe.tags.index(t) for t in source.tags]
        assert torch.equal(new_state["emission.weight"][rows], old_state["emission.weight"])
        assert torch.equal(new_state["emission.bias"][rows], old_state["emission.bias"])
        transitions = new_state["crf.torch_crf.transitions"]
        assert torch.equal(transitions[rows][:, rows], old_state["crf.torch_crf.transitions"])
        assert torch.equal(pipe.model.head.crf.trans_ok[rows][:, rows], source.model.head.crf.trans_ok)
        # forbidden transitions stay forbidden: I-LOC never follows O or B-PER
        crf, tags = pipe.model.head.crf, pipe.tags
        assert not crf.trans_ok[tags.index("O"), tags.index("I-LOC")]
        assert not crf.trans_ok[tags.index("B-PER"), tags.index("I-LOC")] and not crf.start_ok[tags.index("I-LOC")]
    else:
        size, k_old, k = pipe.model.head.span.size, 0, pipe.types.index("PER")
        weight = new_state["span.projection.weight"]
        assert torch.equal(weight[2 * k * size:2 * (k + 1) * size],
                           old_state["span.projection.weight"][2 * k_old * size:2 * (k_old + 1) * size])
        assert torch.equal(new_state["span.bias"][k], old_state["span.bias"][k_old])
    # the same entities; their scores differ a little, the new tags holding a little of the probability
    assert pipe.predict(TEXTS) == source.predict(TEXTS) and any(source.predict(TEXTS)), "some PER to compare"
    for grown_found, found in zip(pipe.predict(TEXTS, scores=True), source.predict(TEXTS, scores=True)):
        assert [e["score"] for e in grown_found] == pytest.approx([e["score"] for e in found], abs=0.05)


def test_a_crf_grown_by_new_tags_never_decodes_one_whatever_the_scores():
    """The margin's proof on random heads with large scores: every input decodes as the source."""
    from nerkit.model.heads.crf import CrfHead

    config = build_config({})
    generator = torch.Generator().manual_seed(0)
    for scheme in ("bio", "bioes"):
        from nerkit.data.tags import scheme_tags

        old = CrfHead(config, 6, scheme_tags(["PER"], scheme))
        new = CrfHead(config, 6, scheme_tags(["LOC", "PER", "ORG"], scheme))
        with torch.no_grad():
            for p in old.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 5)
        new.grow_from(old)
        hidden = torch.randn(50, 9, 6, generator=generator) * 3
        mask = torch.ones(50, 9, dtype=torch.bool)
        mask[25:, 5:] = False
        named = [[[head.tags[k] for k in path] for path in head.paths(hidden, mask)] for head in (new, old)]
        assert named[0] == named[1] and any("B-PER" in path for path in named[1])


def sentence(text: str, spans: list[Span], unknown=None) -> Sentence:
    return Sentence(list(text), spans_to_tags(len(text), spans, "bio"), unknown=unknown)


def allowed_tags(example, tags) -> list[set[str]]:
    return [{tags[k] for k in range(len(tags)) if row[k]} for row in example.allowed]


def test_hard_targets_are_the_sources_entities_and_an_overlapped_one_is_unknown(tmp_path, per_models):
    """王芳去北京: the source's PER 王芳 is known, its PER 京 (overlapping the new LOC 北京) is unknown
    for PER; the new LOC is known; every other character is O for LOC, and for PER as the source says."""
    pipe, growth, _ = grown(grow_config(tmp_path), per_models["crf"])
    growth.old_spans = [[Span(0, 2, "PER"), Span(4, 5, "PER")]]
    example = growth.example(pipe, sentence("王芳去北京", [Span(3, 5, "LOC")]), 0)
    old = {"O", "B-PER", "I-PER"}
    assert allowed_tags(example, pipe.tags) == [{"B-PER"}, {"I-PER"}, {"O"}, {"B-LOC"}, {"I-LOC"}]
    growth.old_spans = [[Span(2, 4, "PER")]]  # 去北 overlaps 北京: unknown for PER, never O for it
    example = growth.example(pipe, sentence("王芳去北京", [Span(3, 5, "LOC")]), 0)
    assert allowed_tags(example, pipe.tags) == [{"O"}, {"O"}, old, {"B-LOC"}, {"I-LOC"}]
    # an unknown region of the corpus: the source's tag, and where it says O any new type's too
    growth.old_spans = [[Span(0, 2, "PER")]]
    example = growth.example(pipe, sentence("王芳去北京", [], unknown=[(1, 5)]), 0)
    assert allowed_tags(example, pipe.tags)[:3] == [{"B-PER"}, {"I-PER"}, {"O", "B-LOC", "I-LOC"}]


def test_soft_targets_leave_the_old_types_unknown_and_their_loss_is_the_partial_likelihood_plus_the_kl(
        tmp_path, per_models):
    """Brute force over the 5^4 tag paths of a 4-character sentence whose 北京 is a new LOC: the
    likelihood term counts every path that keeps it and puts no LOC elsewhere, any PER or O
    there (unknown for PER, never O); the KL term is the source's marginals against the model's, a
    LOC counted as the source's O, left out inside the new entity."""
    pipe, growth, splits = grown(grow_config(tmp_path, "grow.targets=soft", "grow.weight=0.5"), per_models["crf"])
    text, tags = "王去北京", pipe.tags
    sent = sentence(text, [Span(2, 4, "LOC")])
    teacher = torch.tensor([[0.2, 0.8, 0.0], [0.7, 0.1, 0.2], [0.6, 0.3, 0.1], [0.9, 0.05, 0.05]])
    growth.marginals = [(teacher.half(), ["O", "B-PER", "I-PER"])]
    example = growth.example(pipe, sent, 0)
    assert allowed_tags(example, tags) == [{"O", "B-PER", "I-PER"}] * 2 + [{"B-LOC"}, {"I-LOC"}]
    batch = collate([example])
    pipe.model.eval()
    with torch.no_grad():
        loss = growth.loss(pipe.model, batch).item()
        emissions = pipe.model.head.emissions(pipe.model.hidden(batch))[0]  # (T, K)
    crf = pipe.model.head.crf
    start, trans, end = crf.torch_crf.start_transitions, crf.torch_crf.transitions, crf.torch_crf.end_transitions
    paths = list(itertools.product(range(len(tags)), repeat=len(text)))

    def valid(p):
        return bool(crf.start_ok[p[0]] and crf.end_ok[p[-1]] and all(crf.trans_ok[a, b] for a, b in zip(p, p[1:])))

    def score(p):
        return start[p[0]] + end[p[-1]] + sum(emissions[i, k] for i, k in enumerate(p)) + \
            sum(trans[a, b] for a, b in zip(p, p[1:]))

    with torch.no_grad():
        scores = torch.stack([score(p) for p in paths]).double()
    loc = {tags.index(t) for t in ("B-LOC", "I-LOC")}
    keeps = torch.tensor([valid(p) and p[2] == tags.index("B-LOC") and p[3] == tags.index("I-LOC")
                          and not {p[0], p[1]} & loc for p in paths])
    likelihood = -(torch.logsumexp(scores[keeps], 0) - torch.logsumexp(scores, 0))
    ok = torch.tensor([valid(p) for p in paths])
    probs = (scores - torch.logsumexp(scores[ok], 0)).exp() * ok  # each valid path's probability
    kl = 0.0
    for t in range(2):  # inside the new LOC the source's marginals are no target
        marginal = {k: float(sum(probs[i] for i, p in enumerate(paths) if p[t] == k)) for k in range(len(tags))}
        student = [marginal[tags.index("O")] + sum(marginal[k] for k in loc),
                   marginal[tags.index("B-PER")], marginal[tags.index("I-PER")]]
        target = teacher[t].half().double().tolist()
        kl += sum(p * math.log(p / q) for p, q in zip(target, student) if p > 0)
    assert loss == pytest.approx(float(likelihood) + 0.5 * kl, rel=1e-4)


def test_the_span_heads_hard_targets_and_unsure_cells(tmp_path, per_models):
    pipe, growth, _ = grown(grow_config(tmp_path), per_models["span"])
    growth.old_spans = [[Span(0, 2, "PER"), Span(2, 4, "PER")]]
    example = growth.example(pipe, sentence("王芳去北京", [Span(3, 5, "LOC")]), 0)
    loc, per = pipe.types.index("LOC"), pipe.types.index("PER")
    assert sorted(example.spans) == sorted([(loc, 3, 1), (per, 0, 1)]) and example.unsure == [(per, 2, 1)]
    from nerkit.model.span import band_valid, multilabel_loss

    batch = collate([example])
    pipe.model.eval()
    with torch.no_grad():
        hidden = pipe.model.hidden(batch)
        band = pipe.model.head.band(hidden)  # (1, K, T, W)
        loss = pipe.model.head.loss(hidden, batch).item()
        targets, valid = pipe.model.head.span.targets(batch.spans, band.shape), band_valid(batch.mask, band.size(-1))
        cells = valid[:, None].expand(band.shape).clone()
        cells[0, per, 2, 1] = False  # (PER, 去北) is neither positive nor negative
        assert loss == pytest.approx(multilabel_loss(band, targets, valid, cells).item(), rel=1e-6)
        assert loss != pytest.approx(multilabel_loss(band, targets, valid).item(), rel=1e-6)


def test_finetuning_reads_what_the_corpus_does_not_mark_as_o(tmp_path, per_models):
    pipe, growth, _ = grown(grow_config(tmp_path, "grow.targets=none"), per_models["crf"])
    example = growth.example(pipe, sentence("王芳去北京", [Span(3, 5, "LOC")]), 0)
    assert example.allowed is None and example.known is None
    assert [pipe.tags[k] for k in example.tag_ids] == ["O", "O", "O", "B-LOC", "I-LOC"]


@pytest.mark.parametrize("targets", ["hard", "soft", "none"])
def test_a_grown_run_is_an_ordinary_model_directory_that_records_its_source(targets, tmp_path, per_models):
    out = tmp_path / "grown"
    config = grow_config(tmp_path, f"grow.source={per_models['crf']}", f"grow.targets={targets}")
    metrics = train(config, out=out, progress_bar=False)
    loaded = Pipeline.load(out)
    assert loaded.types == ["LOC", "PER"] and loaded.evaluate(config.data.dev)["counts"] == metrics["dev"]["counts"]
    meta = json.loads((out / "nerkit.json").read_text(encoding="utf-8"))["grown_from"]
    assert meta["types"] == ["PER"] and meta["new_types"] == ["LOC"] and meta["targets"] == targets
    assert meta["name"] == "crf" and len(meta["sha256"]) == 64 and meta["nerkit_version"]
    saved = (out / "config.yaml").read_text(encoding="utf-8")
    assert "hidden_size: 16" in saved and f"source: {per_models['crf']}" in saved
    loaded.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").predict(TEXTS, scores=True) == loaded.predict(TEXTS, scores=True)


def test_a_grown_span_model_trains_saves_and_loads(tmp_path, per_models):
    out = tmp_path / "grown"
    config = grow_config(tmp_path, f"grow.source={per_models['span']}")
    metrics = train(config, out=out, progress_bar=False)
    loaded = Pipeline.load(out)
    assert loaded.types == ["LOC", "PER"] and loaded.config.model.head == "span"
    assert loaded.evaluate(config.data.dev)["counts"] == metrics["dev"]["counts"]


@pytest.mark.slow
def test_nerkit_train_from_and_its_resume(tmp_path, per_models, nerkit):
    """`nerkit train --from`, stopped after one epoch, resumed for a second: the run keeps its source."""
    import yaml

    config = grow_config(tmp_path)
    path = tmp_path / "loc.yaml"
    path.write_text(yaml.safe_dump({"data": {"train": config.data.train, "dev": config.data.dev},
                                    "train": {"epochs": 1, "batch_size": 8, "lr": 0.02, "device": "cpu"}}),
                    encoding="utf-8")
    out = tmp_path / "grown"
    nerkit("train", "--config", str(path), "--from", str(per_models["crf"]), "--out", str(out))
    first = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert first["epochs"] == 1
    nerkit("train", "--resume", str(out), "--set", "train.epochs=2")
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["epoch"] for r in history] == [1, 2]
    assert json.loads((out / "nerkit.json").read_text(encoding="utf-8"))["grown_from"]["types"] == ["PER"]
    assert Pipeline.load(out).types == ["LOC", "PER"]
    result = nerkit("train", "--resume", str(out), "--from", str(per_models["crf"]), check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "drop --from" in result.stderr


def test_refusals_are_one_line_naming_the_fix(tmp_path, per_models, nerkit, write_file):
    import yaml

    def config_file(name, **data):
        raw = {"data": {"dev": str(TINY_DEV), **data}, "train": {"epochs": 1}}
        return str(write_file(yaml.safe_dump(raw), name))

    with_per = config_file("per.yaml", train=typed_corpus(tmp_path / "both.bio", TINY_TRAIN, ["PER", "LOC"]))
    result = nerkit("train", "--config", with_per, "--from", str(per_models["crf"]), "--out", str(tmp_path / "a"),
                    check=False)
    assert_one_error_line(result, str(tmp_path / "both.bio"), "already has")
    bioes = tmp_path / "loc.bioes"
    write_corpus(bioes, keep_types(read_corpus(TINY_TRAIN).sentences, {"LOC"}), "bioes")
    result = nerkit("train", "--config", config_file("bioes.yaml", train=str(bioes)), "--from", str(per_models["crf"]),
                    "--out", str(tmp_path / "b"), check=False)
    assert_one_error_line(result, str(bioes), "data.scheme")
    loc = config_file("loc.yaml", train=typed_corpus(tmp_path / "loc.bio", TINY_TRAIN, ["LOC"]))
    result = nerkit("train", "--config", loc, "--from", str(per_models["span"]), "--set", "grow.targets=soft",
                    "--out", str(tmp_path / "c"), check=False)
    assert_one_error_line(result, str(per_models["span"]), "grow.targets")
    result = nerkit("train", "--config", loc, "--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "d"),
                    check=False)
    assert_one_error_line(result, str(tmp_path / "nothing"), "--from")
    result = nerkit("train", "--config", loc, "--from", str(per_models["crf"]), "--set", "encoder.hidden_size=32",
                    "--out", str(tmp_path / "e"), check=False)
    assert_one_error_line(result, loc, "encoder.hidden_size")


def test_keep_types_removes_the_other_entities_as_o():
    sentences = read_corpus(TINY_TRAIN).sentences
    kept = keep_types(sentences, {"LOC"})
    assert [len(s) for s in kept] == [len(s) for s in sentences]
    assert {sp.type for s in kept for sp in s.spans()} == {"LOC"}
    assert sum(len(s.spans()) for s in kept) == sum(1 for s in sentences for sp in s.spans() if sp.type == "LOC")


@pytest.mark.slow
def test_the_bench_adds_types_step_by_step_and_resumes(tmp_path, nerkit):
    from helpers import write_loop_config

    config = write_loop_config(tmp_path)
    out = tmp_path / "bench"
    args = ("bench", "grow", "--config", str(config), "--out", str(out), "--order", "PER,LOC,ORG",
            "--set", "train.epochs=1")
    result = nerkit(*args)
    records = parse_jsonl((out / "results.jsonl").read_text(encoding="utf-8"))
    assert sorted((r["method"], r["step"]) for r in records) == sorted(
        (m, s) for m in ("hard", "soft", "finetune", "joint") for s in (1, 2, 3))
    last = [r for r in records if r["step"] == 3]
    assert all(r["types"] == ["PER", "LOC", "ORG"] and r["new_types"] == ["ORG"] for r in last)
    assert all(set(r["per_type"]) <= {"PER", "LOC", "ORG"} and r["command"].startswith("nerkit bench grow")
               and r["git_commit"] is not None for r in records)
    assert "| average |" in result.stdout and "PER-LOC-ORG" in result.stdout
    again = nerkit(*args, "--resume")  # every step done: nothing trains, the same records
    assert parse_jsonl((out / "results.jsonl").read_text(encoding="utf-8")) == records
    assert again.stdout == result.stdout
    # The first step stopped midway, before any record: its weights and a metrics.json of its best
    # epoch's dev scores are there, but not its final scores. --resume continues it from the
    # checkpoint (here, one at its last epoch) to the same model, and writes its records.
    step1 = out / "runs" / "PER-LOC-ORG-s1" / "step1"
    final = json.loads((step1 / "metrics.json").read_text(encoding="utf-8"))
    (step1 / "metrics.json").write_text(json.dumps({"best_epoch": final["best_epoch"], "dev": final["dev"]}))
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records if r["step"] > 1))
    nerkit(*args, "--resume")
    resumed = parse_jsonl((out / "results.jsonl").read_text(encoding="utf-8"))
    ignored = ("date", "command")
    assert sorted(({k: v for k, v in r.items() if k not in ignored} for r in resumed), key=json.dumps) == \
        sorted(({k: v for k, v in r.items() if k not in ignored} for r in records), key=json.dumps)
    figure = nerkit("plot", "grow", str(out / "results.jsonl"), "--out", str(tmp_path / "grow.png"))
    assert (tmp_path / "grow.png").stat().st_size > 0 and "wrote" in figure.stdout


def test_the_benchs_slices_are_disjoint_and_each_holds_its_own_types():
    """The papers' greedy sampling: every sentence in one slice, and a step's slice holds its types'
    entities even when they are rare (ORG in a third of the sentences would miss a random slice)."""
    from nerkit.tools.bench.grow import slices, steps_of

    sentences = read_corpus(TINY_TRAIN).sentences
    steps = steps_of(("PER", "LOC", "ORG"), 1)
    cut = slices(sentences, steps, seed=3)
    assert sorted(i for c in cut for i in c) == list(range(len(sentences)))
    for types, indices in zip(steps, cut):
        assert any(sp.type in types for i in indices for sp in sentences[i].spans())
    assert max(map(len, cut)) - min(map(len, cut)) <= len(sentences) // 3
    assert cut == slices(sentences, steps, seed=3) != slices(sentences, steps, seed=4)


# ------------------------------------------------------------------------------ grow.anchor (L2-SP)


def anchored(tmp_path, source, strength: float):
    """The grown pipeline, Growth and training examples of the tiny LOC corpus with grow.anchor."""
    pipe, growth, splits = grown(grow_config(tmp_path, f"grow.anchor={strength:g}"), source)
    return pipe, growth, growth.examples(pipe, splits.train)


@pytest.mark.parametrize("head", ["crf", "span"])
def test_the_anchor_is_zero_at_the_start_and_leaves_the_new_rows_free(head, tmp_path, per_models):
    """The grown model equals its source where they share weights: no penalty until a step moves
    them. The penalty's gradient reaches the encoder and the old tags' or types' rows of the head,
    never the new ones'."""
    from nerkit.training.loop import learn

    pipe, growth, examples = anchored(tmp_path, per_models[head], 1.0)
    assert growth.anchor.penalty().item() == 0.0
    optimizer = torch.optim.Adam(pipe.model.parameters(), lr=0.01)
    learn(growth.loss(pipe.model, collate(examples[:8])), optimizer)
    optimizer.zero_grad()
    penalty = growth.anchor.penalty()
    assert penalty.item() > 0
    penalty.backward()
    grads = {name: p.grad for name, p in pipe.model.head.named_parameters()}
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in pipe.model.encoder.parameters())
    if head == "crf":
        old = torch.tensor([t in ("O", "B-PER", "I-PER") for t in pipe.tags])
        for name in ("emission.weight", "emission.bias", "crf.torch_crf.start_transitions"):
            assert not grads[name][~old].any() and grads[name][old].any(), name
        transitions = grads["crf.torch_crf.transitions"]
        assert not transitions[~old].any() and not transitions[:, ~old].any() and transitions[old][:, old].any()
    else:
        size, loc, per = pipe.model.head.span.size, pipe.types.index("LOC"), pipe.types.index("PER")
        for name in ("span.projection.weight", "span.projection.bias"):
            assert not grads[name][2 * loc * size:2 * (loc + 1) * size].any(), name
            assert grads[name][2 * per * size:2 * (per + 1) * size].any(), name
        assert grads["span.bias"][loc] == 0 and grads["span.bias"][per] != 0


def test_a_strong_anchor_keeps_the_shared_weights_near_the_source(tmp_path, per_models):
    """An epoch of training at grow.anchor 100 moves the weights shared with the source far less than
    one at 0 (both measured as the anchor's distance); nerkit.json records the anchor."""
    pipe, growth, _ = anchored(tmp_path, per_models["crf"], 1.0)
    moved = {}
    for strength in (0, 100):
        out = tmp_path / f"anchor-{strength}"
        config = grow_config(tmp_path, f"grow.source={per_models['crf']}", f"grow.anchor={strength}")
        train(config, out=out, progress_bar=False)
        pipe.model.load_state_dict(Pipeline.load(out).model.state_dict())
        moved[strength] = growth.anchor.penalty().item()
        grown_from = json.loads((out / "nerkit.json").read_text(encoding="utf-8"))["grown_from"]
        assert grown_from.get("anchor") == (strength or None)
    assert 0 < moved[100] < moved[0] / 10, moved


def test_an_anchored_run_resumed_midway_is_the_uninterrupted_run(tmp_path, per_models):
    """The anchor's starting values are no part of the checkpoint nor of the model directory: a
    resume grows the model from its source again and takes them anew, so the resumed run ends with
    the uninterrupted run's model."""
    from safetensors.torch import load_file

    from nerkit.training.run_dir import resume_config

    config = grow_config(tmp_path, f"grow.source={per_models['crf']}", "grow.anchor=1", "train.epochs=2")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(config, out=whole, progress_bar=False)
    assert train(replace(config, train=replace(config.train, max_steps=3)), out=cut, progress_bar=False)["steps"] == 3
    train(resume_config(cut, ["train.max_steps=0"]), out=cut, resume=True, progress_bar=False)
    assert (cut / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    source = per_models["crf"]
    assert sorted(p.name for p in cut.iterdir()) == sorted(p.name for p in source.iterdir())
    assert load_file(cut / "model.safetensors").keys() == load_file(source / "model.safetensors").keys()


def test_an_anchor_without_a_source_is_refused_in_one_line(tmp_path, per_models, nerkit, write_file):
    import yaml

    loc = write_file(yaml.safe_dump({"data": {"train": typed_corpus(tmp_path / "loc.bio", TINY_TRAIN, ["LOC"]),
                                              "dev": str(TINY_DEV)}}), "loc.yaml")
    result = nerkit("train", "--config", str(loc), "--set", "grow.anchor=0.5", "--out", str(tmp_path / "a"),
                    check=False)
    assert_one_error_line(result, str(loc), "grow.anchor")
    assert "--from" in result.stderr
    # --from gives it its source after the file loads
    nerkit("train", "--config", str(loc), "--from", str(per_models["crf"]), "--set", "grow.anchor=0.5", "--dry-run")
