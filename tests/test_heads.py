"""The heads' contract (nerkit.model.heads, issue 56 section 1): every head in HEADS passes the same
checks, as every encoder passes tests/encoders/test_contract.py: a finite loss that reaches every
parameter, decoding into the one entity shape, batched decoding equal to one sentence at a time, a
decision's log-probability per sentence, an export's output, and save -> load giving the same
entities under the saved names the tensors had before heads were components."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import TINY_TRAIN, build_pipeline

from nerkit.config import HEAD_TRAITS, HeadTraits
from nerkit.data.corpus import read_corpus
from nerkit.features.batch import collate
from nerkit.model.heads import HEADS, Head
from nerkit.model.span import PRIOR

OVERRIDES = ["span.size=8", "span.max_width=6"]  # small, for every head (a head reads only its own section)
TEXTS = ["张伟在北京大学读书。", "李娜", "新华社记者报道，上海", "北"]
THRESHOLD = PRIOR / 2  # below where an untrained span head's probabilities start, so it finds entities to compare


@pytest.fixture(params=sorted(HEADS))
def pipe(request, tiny_config):
    return build_pipeline(tiny_config(f"model.head={request.param}", *OVERRIDES))


def test_heads_are_the_config_names_and_follow_the_interface():
    assert tuple(HEADS) == tuple(HEAD_TRAITS)
    for name, cls in HEADS.items():
        assert issubclass(cls, Head) and cls.traits is HEAD_TRAITS[name] and isinstance(cls.traits, HeadTraits)
        assert cls.traits.export_outputs


def test_the_loss_is_finite_and_reaches_every_parameter(pipe):
    examples = [pipe.featurizer.training_example(s) for s in read_corpus(TINY_TRAIN).sentences[:12]]
    pipe.model.train()
    loss = pipe.model.loss(collate(examples))
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    missing = [name for name, p in pipe.model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not missing, f"no gradient for {missing}"


def partial_examples(pipe) -> list:
    """The first tiny training sentences, each with an unknown region (one over an entity)."""
    sentences = read_corpus(TINY_TRAIN).sentences[:6]
    for k, sent in enumerate(sentences):
        start = k % 3
        sent.unknown = [(start, min(len(sent), start + 2 + k % 2))]
        sent.tags = [("O" if start <= i < start + 2 + k % 2 else t) for i, t in enumerate(sent.tags)]
        assert not any(s.start < sent.unknown[0][1] and sent.unknown[0][0] < s.end for s in sent.spans())
    return [pipe.featurizer.training_example(s) for s in sentences]


def test_partial_labels_every_character_known_is_the_complete_loss(pipe):
    pipe.model.eval()
    examples = partial_examples(pipe)
    complete = [pipe.featurizer.training_example(s) for s in read_corpus(TINY_TRAIN).sentences[:6]]
    known = collate(examples)
    assert known.known is not None and not known.known.all()
    every = collate(examples)
    every.known = torch.ones_like(every.known)
    for a, b in zip(examples, complete):
        b.tag_ids, b.spans = a.tag_ids, a.spans  # the same marks, read as complete
    assert pipe.model.loss(every).item() == pytest.approx(pipe.model.loss(collate(complete)).item(), rel=1e-6)
    # an unknown region can only add paths (a CRF) or take negatives away (a span head)
    assert pipe.model.loss(known).item() < pipe.model.loss(every).item()


def test_partial_labels_batched_loss_equals_one_sentence_at_a_time(pipe):
    pipe.model.eval()
    examples = partial_examples(pipe)
    alone = [pipe.model.loss(collate([e])).item() for e in examples]
    assert pipe.model.loss(collate(examples)).item() == pytest.approx(sum(alone) / len(alone), rel=1e-5)


def decoded(pipe, texts: list[str], scores: bool = False) -> list:
    pipe.model.eval()
    batch = collate([pipe.featurizer.example(list(t)) for t in texts])
    return pipe.model.decode(batch, scores=scores, threshold=THRESHOLD)


def test_decoding_gives_the_one_entity_shape(pipe):
    for scores in (False, True):
        found = decoded(pipe, TEXTS, scores)
        assert len(found) == len(TEXTS)
        for text, entities in zip(TEXTS, found):
            assert entities == sorted(entities, key=lambda e: (e[0], e[1], e[2]))
            for start, end, kind, score in entities:
                assert 0 <= start < end <= len(text) and 0 <= kind < len(pipe.types)
                assert score is None or 0.0 <= score <= 1.0
                if scores:
                    assert score is not None
    assert sum(len(e) for e in decoded(pipe, TEXTS)) > 0  # the checks saw entities


def test_batched_decoding_equals_one_sentence_at_a_time(pipe):
    for scores in (False, True):
        together = decoded(pipe, TEXTS, scores)
        for text, entities in zip(TEXTS, together):
            alone = decoded(pipe, [text], scores)[0]
            assert [e[:3] for e in entities] == [e[:3] for e in alone]
            assert [e[3] for e in entities] == pytest.approx([e[3] for e in alone], abs=1e-5)


def test_a_decision_has_a_log_probability_per_sentence(pipe):
    pipe.model.eval()
    batch = collate([pipe.featurizer.example(list(t)) for t in TEXTS])
    found = pipe.model.decision_log_probabilities(batch, threshold=THRESHOLD)
    assert len(found) == len(TEXTS) and all(math.isfinite(lp) and lp <= 0.0 for lp in found)


def test_the_export_output_is_a_tensor_per_sentence(pipe):
    pipe.model.eval()
    batch = collate([pipe.featurizer.example(list(t)) for t in TEXTS])
    with torch.no_grad():
        out = pipe.model.head.export_forward(pipe.model.hidden(batch))
    assert out.size(0) == len(TEXTS) and torch.isfinite(out).all()


def test_save_and_load_keep_the_saved_names_and_the_entities(pipe, tmp_path):
    from nerkit.inference.pipeline import Pipeline

    keys = list(pipe.model.state_dict())
    assert not any(k.startswith("head.") for k in keys)  # saved as before heads were components
    assert {k.split(".")[0] for k in keys} >= set(pipe.model.head._modules) - {"output_dropout"}
    pipe.save(tmp_path / "model")
    loaded = Pipeline.load(tmp_path / "model")
    assert list(loaded.model.state_dict()) == keys
    assert decoded(loaded, TEXTS, True) == decoded(pipe, TEXTS, True)
    assert loaded.predict(TEXTS, scores=True) == pipe.predict(TEXTS, scores=True)


@pytest.mark.parametrize("name, saved", [
    ("crf", ["emission.weight", "emission.bias", "crf.torch_crf.start_transitions", "crf.torch_crf.end_transitions",
             "crf.torch_crf.transitions"]),
    ("span", ["span.bias", "span.projection.weight", "span.projection.bias"]),
])
def test_the_heads_tensors_keep_the_names_model_directories_hold(tiny_config, name, saved):
    """Model directories and checkpoints written before heads were components load unchanged (the
    span head's `span.bias`, added since, is 0 where a directory has none: tests/test_span_head.py)."""
    model = build_pipeline(tiny_config(f"model.head={name}", *OVERRIDES)).model
    assert [k for k in model.state_dict() if not k.startswith(("embedder.", "encoder.", "words."))] == saved
