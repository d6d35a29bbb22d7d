"""The span head (model.head: span, GlobalPointer; issue 45 section 1): its band of scores against a
naive loop over every (start, end) pair and the full L x L matrix, its loss against the formula term
by term, its decoding (threshold, flat) against brute force, window stitching, the config, and a
nested corpus learned, saved, loaded, predicted and exported."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch
from helpers import NESTED_SENTENCES as NESTED
from helpers import train_nested_span_model

from nerkit.data.records import Sentence
from nerkit.data.tags import Span
from nerkit.errors import ConfigError, UserError
from nerkit.inference.predictor import central_spans
from nerkit.inference.windows import text_windows
from nerkit.model.span import PRIOR, SpanHead, band_valid, decision_log_probability, multilabel_loss
from nerkit.model.span_decode import band_valid as numpy_band_valid
from nerkit.model.span_decode import decode_band, flat_choice, logit


def rotate_naive(vector: list[float], position: int) -> list[float]:
    """RoPE term by term: pair (i, i + D/2) turned by position * 10000^(-2i/D)."""
    half = len(vector) // 2
    out = [0.0] * len(vector)
    for i in range(half):
        angle = position * 10000.0 ** (-2 * i / len(vector))
        a, b = vector[i], vector[i + half]
        out[i], out[i + half] = a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)
    return out


def small_head(types=3, size=4, width=3, seed=0):
    torch.manual_seed(seed)
    head = SpanHead(5, types, size, width).double().eval()
    with torch.no_grad():
        head.bias.normal_()  # each type's own, not the shared start
    return head


@pytest.mark.parametrize("diagonals", [False, True], ids=["blocks", "diagonals"])
def test_band_scores_equal_a_naive_loop_over_every_pair(diagonals):
    head = small_head()
    h = torch.randn(2, 7, 5, dtype=torch.float64)  # 7: blocks of 3 starts, the last one padded
    band = head(h, diagonals)  # (B, K, T, W)
    qk = head.projection(h).view(2, 7, 3, 2, 4)  # (B, T, K, start/end, D)
    for b, k, s, e in itertools.product(range(2), range(3), range(7), range(7)):
        q = rotate_naive(qk[b, s, k, 0].tolist(), s)
        key = rotate_naive(qk[b, e, k, 1].tolist(), e)
        expected = sum(x * y for x, y in zip(q, key)) / 2.0 + head.bias[k].item()  # sqrt(D) = 2
        if s <= e < s + 3:
            assert band[b, k, s, e - s].item() == pytest.approx(expected, abs=1e-6)  # angles in float32


@pytest.mark.parametrize("prior", [PRIOR, 0.01, 0.5])
def test_a_new_head_gives_every_span_the_prior_before_it_reads_anything(prior):
    """The types' biases start at the log-odds of `prior`: with the projections at zero, every span's
    probability, however computed, is the prior."""
    head = SpanHead(5, 3, 4, 3, prior=prior).double()
    assert PRIOR == 1e-3 and head.bias.tolist() == pytest.approx([math.log(prior / (1 - prior))] * 3)
    with torch.no_grad():
        head.projection.weight.zero_()
        head.projection.bias.zero_()
    h = torch.randn(2, 7, 5, dtype=torch.float64)
    for scores in (head(h), head(h, diagonals=True), head.full(h)):
        assert torch.sigmoid(scores).flatten().tolist() == pytest.approx([prior] * scores.numel())


def test_a_head_saved_without_biases_loads_with_biases_of_zero():
    """A model directory written before the biases scored without them: it loads, and scores as it did."""
    head = small_head()
    state = {k: v for k, v in head.state_dict().items() if k != "bias"}
    h = torch.randn(2, 7, 5, dtype=torch.float64)
    q, k = head.queries_keys(h)
    unbiased = head.by_diagonals(q, k) - head.bias[:, None, None]
    again = small_head(seed=1)
    again.load_state_dict(state)
    assert again.bias.tolist() == [0.0, 0.0, 0.0]
    assert torch.allclose(again(h), unbiased)


@pytest.mark.parametrize("length", [1, 4, 9, 12])
def test_band_is_the_full_matrix_masked_to_the_band(length):
    head = small_head(width=4)
    h = torch.randn(3, length, 5, dtype=torch.float64)
    band, full = head(h), head.full(h)  # (B, K, T, W), (B, K, T, T)
    torch.testing.assert_close(head(h, diagonals=True), band)
    assert band.shape == (3, 3, length, 4)
    for s, w in itertools.product(range(length), range(4)):
        if s + w < length:
            torch.testing.assert_close(band[:, :, s, w], full[:, :, s, s + w])


def test_rotary_scores_depend_on_the_distance_only():
    head = small_head(types=1, width=5)
    vector = torch.randn(1, 1, 5, dtype=torch.float64).expand(1, 8, 5)
    band = head(vector)[0, 0]  # (T, W): the same vector everywhere, so only distances differ
    for w in range(5):
        torch.testing.assert_close(band[: 8 - w, w], band[0, w].expand(8 - w))


def test_band_valid_marks_spans_inside_each_sentence():
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    valid = band_valid(mask, 2)
    assert valid[0].tolist() == [[True, True], [True, True], [True, False], [False, False]]
    assert valid[1].tolist() == [[True, False], [False, False], [False, False], [False, False]]
    assert np.array_equal(valid.numpy(), numpy_band_valid(mask.numpy(), 2))


@pytest.mark.parametrize("seed", range(5))
def test_the_numpy_band_valid_equals_the_torch_one(seed):
    """span_decode's band_valid is a deliberate copy for the runtime without torch: the same cells."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 9, (4,), generator=generator)
    mask = torch.arange(int(lengths.max()) + 1)[None] < lengths[:, None]  # (B, T), left-aligned
    for width in (1, 3, 12):
        assert np.array_equal(band_valid(mask, width).numpy(), numpy_band_valid(mask.numpy(), width))


def test_loss_equals_the_formula_term_by_term():
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 2, 4, 3, generator=generator, dtype=torch.float64)
    targets = torch.rand(2, 2, 4, 3, generator=generator) < 0.3
    valid = band_valid(torch.tensor([[True] * 4, [True, True, False, False]]), 3)
    total = 0.0
    for b, k in itertools.product(range(2), range(2)):
        negatives = positives = 0.0
        for s, w in itertools.product(range(4), range(3)):
            if valid[b, s, w]:
                x = logits[b, k, s, w].item()
                if targets[b, k, s, w]:
                    positives += math.exp(-x)
                else:
                    negatives += math.exp(x)
        total += math.log(1 + negatives) + math.log(1 + positives)
    assert multilabel_loss(logits, targets, valid).item() == pytest.approx(total / 2, abs=1e-10)  # per sentence


def test_partial_labels_make_no_negative_of_a_span_with_an_unannotated_character():
    """Issue 57: with `known`, the formula term by term where a cell is a negative only if every
    character of it is annotated (a positive stays one); all known, the loss is the full one."""
    from nerkit.model.span import band_known

    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 2, 5, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.rand(2, 2, 5, 3, generator=generator) < 0.3
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    valid = band_valid(mask, 3)
    known = torch.tensor([[True, True, False, True, True], [False, True, True, True, True]])
    cells = band_known(known, 3)
    total = 0.0
    for b, k in itertools.product(range(2), range(2)):
        negatives = positives = 0.0
        for start, w in itertools.product(range(5), range(3)):
            annotated = all(known[b, t] for t in range(start, min(start + w + 1, 5)))
            if valid[b, start, w]:
                x = logits[b, k, start, w].item()
                if targets[b, k, start, w]:
                    positives += math.exp(-x)
                elif annotated:
                    negatives += math.exp(x)
        total += math.log(1 + negatives) + math.log(1 + positives)
    loss = multilabel_loss(logits, targets, valid, cells)
    assert loss.item() == pytest.approx(total / 2, abs=1e-10)
    loss.backward()
    unsure = valid[:, None] & ~cells[:, None] & ~targets  # (B, K, T, W): cells that are neither
    assert unsure.any() and logits.grad[unsure].abs().max() == 0
    everything = torch.ones_like(known)
    assert multilabel_loss(logits, targets, valid, band_known(everything, 3)).item() == pytest.approx(
        multilabel_loss(logits, targets, valid).item(), abs=1e-12)


def test_spans_wider_than_the_band_are_left_out_of_the_targets():
    head = small_head(width=2)
    targets = head.targets(torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2]]), (2, 3, 4, 2))
    assert targets.sum() == 1 and targets[0, 1, 2, 1]


def brute_threshold(logits, length, cut):
    K, T, W = logits.shape
    return sorted((s, e + 1, k, float(logits[k, s, e - s])) for k in range(K) for s in range(length)
                  for e in range(s, min(length, s + W)) if logits[k, s, e - s] > cut)


@pytest.mark.parametrize("seed", range(20))
def test_threshold_and_flat_decoding_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    K, T, W, length = 2, 5, 3, int(rng.integers(1, 6))
    logits = rng.normal(-0.5, 1.5, (1, K, T, W))  # a dozen candidates at most: 2^12 subsets
    threshold = float(rng.choice([0.3, 0.5, 0.7]))
    found = decode_band(logits, [length], threshold, flat=False)[0]
    expected = brute_threshold(logits[0], length, logit(threshold))
    assert [f[:3] for f in found] == [e[:3] for e in expected]
    assert [f[3] for f in found] == pytest.approx([1 / (1 + math.exp(-e[3])) for e in expected])
    # flat: the set of pairwise disjoint spans with the largest sum of logit - cut (the log-odds over
    # the threshold's), over every subset of the candidates
    cut = logit(threshold)
    best, best_sum = [], 0.0
    for r in range(1, len(expected) + 1):
        for subset in itertools.combinations(expected, r):
            if all(a[1] <= b[0] or b[1] <= a[0] for a, b in itertools.combinations(subset, 2)):
                total = sum(x[3] - cut for x in subset)
                if total > best_sum + 1e-12:
                    best, best_sum = sorted(subset), total
    chosen = flat_choice(expected, cut)
    assert sum(x[3] - cut for x in chosen) == pytest.approx(best_sum)
    assert chosen == best
    assert [f[:3] for f in decode_band(logits, [length], threshold, flat=True)[0]] == [b[:3] for b in best]


def naive_decision_log_probability(logits, length: int, cut: float) -> float:
    """log of the product over every span inside the sentence of p (taken: logit above `cut`) or
    1 - p (left out), p the sigmoid of its logit."""
    K, T, W = logits.shape
    total = 0.0
    for k in range(K):
        for s in range(length):
            for e in range(s, min(length, s + W)):
                p = 1 / (1 + math.exp(-float(logits[k, s, e - s])))
                total += math.log(p if logits[k, s, e - s] > cut else 1 - p)
    return total


@pytest.mark.parametrize("seed", range(10))
def test_the_decisions_log_probability_equals_a_naive_product_and_is_the_best_at_one_half(seed):
    rng = np.random.default_rng(seed)
    K, T, W = 2, 4, 2
    lengths = [int(x) for x in rng.integers(1, T + 1, size=3)]
    logits = torch.tensor(rng.normal(0, 2, (3, K, T, W)))
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    cut = float(rng.choice([logit(0.3), 0.0, logit(0.7)]))
    got = decision_log_probability(logits, band_valid(mask, W), cut)
    expected = [naive_decision_log_probability(logits[b].numpy(), n, cut) for b, n in enumerate(lengths)]
    assert got.tolist() == pytest.approx(expected, rel=1e-5)
    # at threshold 0.5 the decided set is the most probable set of spans: no other subset beats it
    b, n = 0, lengths[0]
    cells = [(k, s, e - s) for k in range(K) for s in range(n) for e in range(s, min(n, s + W))]
    p = {c: 1 / (1 + math.exp(-float(logits[b][c]))) for c in cells}
    best = max(sum(math.log(p[c] if c in taken else 1 - p[c]) for c in cells)
               for r in range(len(cells) + 1) for taken in map(set, itertools.combinations(cells, r)))
    assert decision_log_probability(logits, band_valid(mask, W), 0.0)[b].item() == pytest.approx(best, rel=1e-6)


def test_a_span_belongs_to_the_window_that_holds_it_most_centrally():
    # windows 0:8 and 4:12; span 5:7 is 1 from the first's end (margin 1) and 1 from the second's start
    # (margin 1): a tie, the earlier window decides; span 6:8 is more central in the second window.
    windows = [(0, 8, [Span(5, 7, "A", 0.9), Span(6, 8, "B", 0.8), Span(1, 3, "C", 0.7)]),
               (4, 12, [Span(1, 3, "A", 0.6), Span(0, 1, "D", 0.9)])]  # the second's 5:7 A, and D 4:5
    kept = central_spans(windows)
    # A 5:7 from window 0 (tie, earlier); B 6:8 was only found by window 0, but window 1 holds it
    # more centrally (margin 2 against 0) and did not find it: dropped. D 4:5: margin 0 in window 1,
    # margin 3 in window 0, which did not find it: dropped. C 1:3: window 0 alone holds it.
    assert kept == [Span(1, 3, "C"), Span(5, 7, "A")]
    assert [s.score for s in kept] == [0.7, 0.9]


def test_the_config_defaults_to_the_crf_and_checks_the_span_head(tiny_config):
    from nerkit.config import HEADS

    assert HEADS == ("crf", "span") and tiny_config().model.head == "crf"
    config = tiny_config("model.head=span", "span.max_width=8")
    assert config.span.max_width == 8 and config.span.threshold == 0.5 and not config.span.flat
    with pytest.raises(ConfigError, match="even"):
        tiny_config("model.head=span", "span.size=5")
    with pytest.raises(ConfigError, match="memory"):
        tiny_config("model.head=span", "encoder.name=transformer", "encoder.attention=xl", "encoder.memory=4",
                    "encoder.segment=4")
    with pytest.raises(ConfigError):
        tiny_config("model.head=biaffine")


def nested_corpus(write_file, repeat: int = 1):
    records = [{"text": t, "entities": [{"start": s, "end": e, "type": k} for s, e, k in ents]} for t, ents in NESTED]
    return write_file("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records) * repeat, "nested.jsonl")


def test_the_span_head_trains_on_nested_data_that_the_crf_refuses(write_file, tiny_config):
    from nerkit.data.splits import read_splits
    from nerkit.features.batch import collate
    from nerkit.training.build import build_pipeline

    path = nested_corpus(write_file)
    with pytest.raises(UserError, match="CRF head"):
        read_splits(tiny_config(f"data.train={path}", f"data.dev={path}"))
    config = tiny_config(f"data.train={path}", f"data.dev={path}", "model.head=span", "data.max_len=5")
    splits = read_splits(config)
    # data.max_len cut the first sentence between 国务院 and 总理张三: each piece keeps its own entities
    assert [s.spans() for s in splits.train][:2] == [
        [Span(0, 2, "LOC"), Span(0, 7, "LOC"), Span(0, 10, "ORG")], [Span(2, 4, "PER")]]
    pipe = build_pipeline(config, splits, "cpu")
    batch = collate([pipe.featurizer.training_example(s) for s in splits.train[:2]])
    assert batch.tag_ids is None and pipe.featurizer.types == ["LOC", "ORG", "PER"]
    assert batch.spans.tolist() == [[0, 0, 0, 1], [0, 0, 0, 6], [0, 1, 0, 9], [1, 2, 2, 1]]
    loss = pipe.model.loss(batch)
    loss.backward()
    missing = [n for n, p in pipe.model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum())]
    assert not missing


def test_the_span_model_s_training_log_names_its_types_and_the_entities_too_wide_for_it(write_file, tiny_config,
                                                                                        tmp_path, caplog):
    """Issue 55: the span model's log spoke of "tags BIOES" (it has no tags), and the training
    entities longer than span.max_width were left out of its loss without a word."""
    from nerkit.training.loop import train

    path = nested_corpus(write_file)
    config = tiny_config(f"data.train={path}", f"data.dev={path}", "model.head=span", "span.max_width=6",
                         "train.epochs=1")
    with caplog.at_level("INFO", logger="nerkit"):
        train(config, out=tmp_path / "model", progress_bar=False)
    assert f"{path}: 2 training entities longer than span.max_width (6 characters) are left out of the span head's " \
           "loss, the longest 10; raise span.max_width to learn them" in caplog.messages
    [described] = [m for m in caplog.messages if m.startswith("model: ")]
    assert "spans of types LOC, ORG, PER;" in described and "tags" not in described
    caplog.clear()
    with caplog.at_level("INFO", logger="nerkit"):  # every entity fits the default width: nothing to say
        train(tiny_config(f"data.train={path}", f"data.dev={path}", "model.head=span", "train.epochs=1"),
              out=tmp_path / "wide", progress_bar=False)
    assert not [m for m in caplog.messages if "span.max_width" in m]


@pytest.fixture(scope="module")
def nested_model(tmp_path_factory):
    """A span-head model trained on the tiny nested corpus to dev F1 1.0: its directory and metrics."""
    return train_nested_span_model(tmp_path_factory.mktemp("span"))


@pytest.mark.slow
def test_a_nested_corpus_round_trips_train_save_load_predict(nested_model, tmp_path):
    from nerkit.inference.pipeline import Pipeline

    out, metrics = nested_model
    assert metrics["dev"]["f1"] == 1.0, metrics["dev"]
    pipe = Pipeline.load(out)
    predicted = pipe.predict([t for t, _ in NESTED], scores=True)
    assert [[(e["start"], e["end"], e["type"]) for e in found] for found in predicted] == \
        [sorted(ents) for _, ents in NESTED]
    assert all(0.5 < e["score"] < 1 for found in predicted for e in found)
    assert pipe.evaluate([Sentence(list(t), None, entities=[Span(*e) for e in ents]) for t, ents in NESTED])["f1"] == 1.0
    pipe.save(tmp_path / "again")
    assert Pipeline.load(tmp_path / "again").predict([t for t, _ in NESTED], scores=True) == predicted


@pytest.mark.slow
def test_batched_equals_one_at_a_time_and_windows_stitch(nested_model):
    from nerkit.inference.pipeline import Pipeline

    pipe = Pipeline.load(nested_model[0])
    texts = [t for t, _ in NESTED] + ["李四", "北京大学的张三在中华人民共和国国务院"]
    together = pipe.predict(texts, scores=True, batch_size=8)
    alone = [pipe.predict(t, scores=True, batch_size=1)[0] for t in texts]
    # float32 sums in another order: scores (written to 6 decimals) within a few units of the last
    assert [[{**e, "score": pytest.approx(e["score"], abs=1e-5)} for e in f] for f in together] == alone
    # a long text read in windows of 16: each window's spans, read alone, kept by the central rule
    text = NESTED[0][0] * 4
    windows = [(a, b, [Span(e["start"], e["end"], e["type"], e["score"]) for e in pipe.predict(text[a:b], scores=True, window=0)[0]])
               for a, b in text_windows(len(text), 16)]
    assert len(windows) > 3
    expected = [s.to_dict(text) for s in central_spans(windows)]
    got = pipe.predict(text, scores=True, window=16)[0]
    assert [{**e, "score": pytest.approx(e["score"], abs=1e-5)} for e in got] == expected


@pytest.mark.slow
def test_flat_decoding_gives_non_overlapping_spans(nested_model):
    from nerkit.inference.pipeline import Pipeline

    pipe = Pipeline.load(nested_model[0])
    texts = [t for t, _ in NESTED]
    nested = pipe.predict(texts, scores=True)
    pipe.config.span.flat = True
    predicted = pipe.predict(texts + [NESTED[0][0] * 3], scores=True, window=16)
    for found in predicted:
        assert all(a["end"] <= b["start"] for a, b in zip(found, found[1:])), found
    for found, flat in zip(nested, predicted):  # the best disjoint subset of the nested predictions
        odds = lambda spans: sum(math.log(e["score"] / (1 - e["score"])) for e in spans)  # noqa: E731
        best = max((subset for r in range(len(found) + 1) for subset in itertools.combinations(found, r)
                    if all(a["end"] <= b["start"] for a, b in zip(subset, subset[1:]))), key=odds)
        assert flat == list(best)
    assert len(predicted[0]) < len(nested[0])


def test_conll_and_inline_output_of_nested_predictions_is_the_outer_projection():
    from nerkit.inference.formats import format_record

    spans = [Span(0, 4, "ORG"), Span(0, 2, "LOC"), Span(5, 7, "PER")]
    lines = format_record("北京大学的张三", spans, "conll").split("\n")
    assert [line.split()[-1] for line in lines if line] == ["B-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "B-PER", "I-PER"]
    assert format_record("北京大学的张三", spans, "inline") == "[北京大学]ORG的[张三]PER\n"
    assert json.loads(format_record("北京大学的张三", spans, "jsonl"))["entities"][1]["type"] == "LOC"


@pytest.mark.slow
def test_the_onnx_export_gives_the_same_spans_and_scores(nested_model, tmp_path):
    from nerkit.inference.onnx_runtime import OnnxPipeline
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.onnx.export import export_model

    found = export_model(nested_model[0], tmp_path / "onnx")
    assert found["same_tags"] == 1.0 and found["max_emission_difference"] < 1e-4
    onnx, torch_pipe = OnnxPipeline.load(tmp_path / "onnx", threads=1), Pipeline.load(nested_model[0])
    texts = [t for t, _ in NESTED] + [NESTED[0][0] * 3]
    expected = torch_pipe.predict(texts, scores=True, window=16)
    got = onnx.predict(texts, scores=True, window=16)
    assert [[{**e, "score": pytest.approx(e["score"], abs=1e-4)} for e in f] for f in expected] == got
    assert not (tmp_path / "onnx" / "crf.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("finetune", [False, True])
def test_the_span_head_reads_language_model_features(lm_dir, tmp_path, tiny_config, finetune):
    from helpers import TINY_DEV

    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.loop import train

    out = tmp_path / "model"
    metrics = train(tiny_config(f"embeddings.lm.path={lm_dir}", f"embeddings.lm.finetune={str(finetune).lower()}",
                                "model.head=span", "span.size=8", "train.epochs=1"), out=out, progress_bar=False)
    loaded = Pipeline.load(out)
    assert loaded.model.lm is not None and loaded.evaluate(TINY_DEV)["counts"] == metrics["dev"]["counts"]


@pytest.mark.slow
def test_data_select_ranks_a_span_model_by_the_probability_of_its_decisions(nested_model, tmp_path, nerkit):
    """`nerkit data select` on a span-head model: the texts in the order of the mean log-probability
    per character of what the head decides (each text read alone, by the naive product), the tasks
    carrying its nested predictions with their scores."""
    from nerkit.features.batch import collate_padded
    from nerkit.inference.pipeline import Pipeline
    from nerkit.model.span_decode import band_cut

    pipe = Pipeline.load(nested_model[0])
    texts = [t for t, _ in NESTED] + ["李四在中华人民共和国", "张三", "北京的国务院", "王五在大学读书"]
    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(texts) + "\n", encoding="utf-8")
    expected = []
    for text in texts:
        batch = collate_padded([pipe.featurizer.example(list(text))], 1, len(text))
        with torch.no_grad():
            band = pipe.model.head.band(pipe.model.hidden(batch))[0].numpy()
        expected.append(naive_decision_log_probability(band, len(text), band_cut(pipe.threshold)) / len(text))
    order = sorted(range(len(texts)), key=lambda i: (expected[i], i))
    found = [json.loads(line) for line in nerkit("data", "select", "--model", str(nested_model[0]), "--pool",
                                                  str(pool), "-n", "4", "--window", "0").stdout.splitlines()]
    assert [r["text"] for r in found] == [texts[i] for i in order[:4]]
    assert [r["confidence"] for r in found] == pytest.approx([math.exp(expected[i]) for i in order[:4]], abs=1e-5)
    predicted = {t: p for t, p in zip(texts, pipe.predict(texts, scores=True, window=0))}
    assert [r["entities"] for r in found] == [predicted[r["text"]] for r in found]
