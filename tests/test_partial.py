"""Training from partial labels (issue 57 section 2): what reaches the heads. The CRF's likelihood of
the paths through the known tags is checked against brute force in tests/test_crf.py, the span
head's loss term by term in tests/test_span_head.py, and every head alike in tests/test_heads.py;
here, what the featuriser and the batch give them, negative sampling, and the training data's
steps (splitting, spaces) keeping the unknown regions where they were."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from helpers import build_pipeline

from nerkit.config import build_config
from nerkit.data.records import Sentence
from nerkit.data.splits import insert_spaces
from nerkit.data.tags import Span, spans_to_tags
from nerkit.data.text import SPACE, split_sentence
from nerkit.errors import ConfigError, CorpusError
from nerkit.features.batch import collate
from nerkit.model.span import band_valid, sampled_negatives


def partial(text: str, spans: list[Span], unknown: list[tuple[int, int]]) -> Sentence:
    return Sentence(list(text), spans_to_tags(len(text), spans, "bio"), unknown=unknown)


def test_the_crf_heads_partial_likelihood_is_the_sum_over_the_paths_through_the_known_tags(tiny_config):
    """Brute force over every tag path of a 5-character sentence whose characters 1-2 are unknown:
    the head's loss is -log of the summed probability of the paths that keep the known tags."""
    pipe = build_pipeline(tiny_config())
    pipe.model.eval()
    sent = partial("王芳来自武", [Span(3, 5, "LOC")], [(1, 3)])
    batch = collate([pipe.featurizer.training_example(sent)])
    with torch.no_grad():
        loss = pipe.model.loss(batch).item()
        emissions = pipe.model.head.emissions(pipe.model.hidden(batch))[0]  # (T, K)
    crf, tags = pipe.model.head.crf, pipe.model.head.tags
    assert not crf.constrain_training  # the default: every path in the partition, valid ones in the numerator
    start, trans, end = crf.torch_crf.start_transitions, crf.torch_crf.transitions, crf.torch_crf.end_transitions
    gold = [tags.index(t) for t in spans_to_tags(5, sent.spans(), pipe.featurizer.scheme)]

    def score(path):
        s = start[path[0]] + end[path[-1]] + sum(emissions[i, k] for i, k in enumerate(path))
        return s + sum(trans[a, b] for a, b in zip(path, path[1:]))

    def valid(path):
        return bool(crf.start_ok[path[0]] and crf.end_ok[path[-1]] and all(crf.trans_ok[a, b] for a, b in zip(path, path[1:])))

    paths = list(itertools.product(range(len(tags)), repeat=5))
    with torch.no_grad():
        scores = torch.stack([score(p) for p in paths])
    keeps = torch.tensor([valid(p) and all(p[i] == gold[i] for i in (0, 3, 4)) for p in paths])
    expected = -(torch.logsumexp(scores[keeps], 0) - torch.logsumexp(scores, 0)).item()
    assert math.isfinite(expected) and loss == pytest.approx(expected, rel=1e-4)


def test_padding_and_complete_sentences_count_as_known(tiny_config):
    pipe = build_pipeline(tiny_config())
    examples = [pipe.featurizer.training_example(s) for s in
                (partial("王芳来自武汉", [], [(2, 4)]), Sentence(list("上海"), ["B-LOC", "I-LOC"]))]
    assert examples[1].known is None
    assert collate(examples).known.tolist() == [[True, True, False, False, True, True], [True] * 6]
    assert collate(examples[1:]).known is None  # no partial sentence, no mask


def test_negative_sampling_draws_ceil_rate_times_length_cells_that_no_entity_marks():
    torch.manual_seed(0)
    lengths, W, K = torch.tensor([7, 3, 1]), 4, 2
    mask = torch.arange(7)[None] < lengths[:, None]
    valid = band_valid(mask, W)
    targets = torch.zeros(3, K, 7, W, dtype=torch.bool)
    targets[0, 1, 2, 1] = targets[1, 0, 0, 0] = True
    counts = torch.zeros(7, W)
    for _ in range(2000):
        drawn = sampled_negatives(targets, valid, 0.35)
        assert not (drawn & ~valid).any() and not (drawn & targets.any(1)).any()
        assert drawn.flatten(1).sum(1).tolist() == [3, 2, 1]  # ceil(0.35 x 7), ceil(0.35 x 3), ceil(0.35)
        counts += drawn[0]
    # uniform over sentence 0's 21 candidate cells (22 valid, 1 an entity): each drawn 3/21 of the time
    chosen = counts[valid[0] & ~targets[0].any(0)] / 2000
    assert chosen.numel() == 21 and (chosen - 3 / 21).abs().max() < 0.04


def test_negative_sampling_is_the_span_heads_option(tiny_config):
    with pytest.raises(ConfigError, match="negative_sampling"):
        tiny_config("span.negative_sampling=0.35")
    tiny_config("model.head=span", "span.negative_sampling=0.35")


def test_a_split_sentence_keeps_its_unknown_regions_in_each_piece():
    sent = partial("甲乙丙丁。戊己庚辛。", [Span(0, 2, "PER")], [(3, 7), (9, 10)])
    pieces = split_sentence(sent, 5)
    assert ["".join(p.tokens) for p in pieces] == ["甲乙丙丁。", "戊己庚辛。"]
    assert [p.unknown for p in pieces] == [[(3, 5)], [(0, 2), (4, 5)]]
    assert [t for p in pieces for t in p.known()] == sent.known()


def test_spaces_are_inserted_only_between_annotated_characters():
    sent = partial("王芳来自武汉市", [Span(0, 2, "PER")], [(3, 5)])
    spaced = insert_spaces([sent], 1.0, seed=1)[0]
    # every gap takes a space except inside an entity and beside or inside the unknown region
    assert "".join(spaced.tokens) == f"{SPACE}王芳{SPACE}来自武汉{SPACE}市{SPACE}"
    assert [spaced.tokens[s:e] for s, e in spaced.unknown] == [list("自武")]


# ---------------------------------------------------------------- the training data a config names


def write_partial(path, sentences, every: int = 2) -> str:
    """`sentences` as JSON lines, every `every`-th one with the characters after its entities unknown."""
    from nerkit.data.corpus import write_corpus

    out = []
    for k, sent in enumerate(sentences):
        spans = sent.spans()
        start = max((s.end for s in spans), default=0)
        if k % every == 0 and start < len(sent):
            tags = [t if i < start else "O" for i, t in enumerate(sent.tags)]
            sent = Sentence(sent.tokens, tags, sent.line, unknown=[(start, len(sent))])
        out.append(sent)
    write_corpus(path, out, "jsonl")
    return str(path)


def test_a_run_trains_on_partial_labels_under_either_head_and_keeps_dev_complete(tmp_path, tiny_config):
    from helpers import TINY_DEV, TINY_TRAIN

    from nerkit.data.corpus import read_corpus
    from nerkit.data.splits import read_splits
    from nerkit.training.loop import train

    partial_train = write_partial(tmp_path / "train.jsonl", read_corpus(TINY_TRAIN).sentences)
    for head in (["model.head=crf"], ["model.head=span", "span.negative_sampling=0.35", "span.size=8"]):
        config = tiny_config(f"data.train={partial_train}", "train.epochs=2", *head)
        out = tmp_path / head[0].split("=")[1]
        train(config, out=out)
        assert (out / "model.safetensors").is_file()
    # a dev set carved from partial training data takes only its complete sentences
    carved = read_splits(tiny_config(f"data.train={partial_train}", "data.dev=null", "data.dev_split=0.3"))
    assert carved.dev and not any(s.partial for s in carved.dev)
    assert sum(s.partial for s in carved.train) == sum(s.partial for s in read_corpus(partial_train).sentences)
    # a partial dev or test set is refused: a score needs complete annotation
    partial_dev = write_partial(tmp_path / "dev.jsonl", read_corpus(TINY_DEV).sentences, every=1)
    for key in ("dev", "test"):
        with pytest.raises(CorpusError, match=f"the {key} set has unknown regions"):
            read_splits(tiny_config(f"data.{key}={partial_dev}"))


def test_data_train_extra_adds_its_sentences_and_hide_entities_hides_a_fraction(tmp_path, tiny_config):
    from helpers import TINY_TRAIN

    from nerkit.data.corpus import read_corpus
    from nerkit.data.splits import read_splits

    extra = write_partial(tmp_path / "extra.jsonl", read_corpus(TINY_TRAIN).sentences[:5], every=1)
    plain = read_splits(tiny_config())
    added = read_splits(tiny_config(f"data.train_extra={extra}"))
    assert len(added.train) == len(plain.train) + 5 and sum(s.partial for s in added.train) >= 1
    entities = sum(len(s.spans()) for s in plain.train)
    hidden = read_splits(tiny_config("data.hide_entities=0.5"))
    assert sum(len(s.spans()) for s in hidden.train) == entities - round(0.5 * entities)
    assert [s.text for s in hidden.train] == [s.text for s in plain.train]


def test_predict_drops_unknown_regions_and_calibrate_refuses_a_partial_file(tmp_path, tiny_model_dir):
    """predict's output entities are the model's over the whole text: a kept "unknown" would say they
    were not; calibration, like every score, needs complete annotation."""
    import json
    import shutil

    from helpers import TINY_DEV
    from helpers import run_nerkit as nerkit

    from nerkit.data.corpus import read_corpus

    partial = write_partial(tmp_path / "dev.jsonl", read_corpus(TINY_DEV).sentences, every=1)
    out = tmp_path / "out.jsonl"
    result = nerkit("predict", "--model", tiny_model_dir, partial, "--output", out)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records and not any("unknown" in r for r in records)
    read_corpus(out)  # reads back as a complete corpus
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    before = (model / "nerkit.json").read_bytes()
    result = nerkit("calibrate", "--model", model, "--data", partial)
    assert result.returncode == 2 and "the calibration set has unknown regions" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and (model / "nerkit.json").read_bytes() == before
