"""Training with context (`data.context: document`, issue #31): separator lines start documents;
documents are cut into segments that pack whole sentences and cut a long one only where no entity
crosses; the documents are dealt to balanced, seeded streams; a row's memory is dropped where its
document changes; a tiny run learns, and a run stopped inside an epoch resumes to the very weights
of an uninterrupted one (its memory restored); the config refuses the mode without memory; and a
carved dev set is made of contiguous blocks."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import TINY_TRAIN, tiny_raw_config

import nerkit.training.loop
from nerkit.config import TenerOptions, build_config
from nerkit.data.corpus import format_conll, read_corpus
from nerkit.data.documents import contiguous_dev_split, documents, piece_starts, segments
from nerkit.data.records import Sentence
from nerkit.data.splits import read_splits
from nerkit.errors import ConfigError
from nerkit.model.crf import CRF
from nerkit.model.encoders.transformer import Transformer, forget
from nerkit.model.tagger import piece_sequences
from nerkit.training.loop import train
from nerkit.training.run_dir import resume_config
from nerkit.training.streams import deal, split_parts, step_batch

ENCODER = {"name": "transformer", "attention": "xl", "n_heads": 2, "head_dim": 8, "num_layers": 1,
           "dropout": 0.1, "attn_dropout": 0.1, "memory": 16, "segment": 24}


def sentence(text: str, tags: str = "", document: int = 0) -> Sentence:
    """A sentence of `text`, tagged by `tags`: one letter a character (O, B, I)."""
    tags = tags or "O" * len(text)
    return Sentence(list(text), [t if t == "O" else f"{t}-PER" for t in tags], document=document)


@pytest.fixture
def documented(tmp_path):
    """The tiny training corpus with a `-DOCSTART-` line before every 12th sentence."""
    blocks = TINY_TRAIN.read_text(encoding="utf-8").strip().split("\n\n")
    parts = [("-DOCSTART- -X- -X- O\n\n" if i % 12 == 0 else "") + block + "\n\n" for i, block in enumerate(blocks)]
    path = tmp_path / "documents.bio"
    path.write_text("".join(parts), encoding="utf-8")
    return path


def document_config(*overrides: str, train_file=None):
    raw = tiny_raw_config()
    raw["data"].update(context="document", train=str(train_file or TINY_TRAIN))
    raw["encoder"] = dict(ENCODER)
    raw["train"].update(batch_size=4, epochs=3)
    return build_config(raw, "<document config>", list(overrides))


# ------------------------------------------------------------------------------ documents


def test_a_separator_line_starts_a_document_in_conll_and_json_lines(write_file, documented):
    plain = read_corpus(TINY_TRAIN)
    marked = read_corpus(documented)
    assert {s.document for s in plain.sentences} == {0}  # a file without separators: one document
    assert [s.tokens for s in marked.sentences] == [s.tokens for s in plain.sentences]  # separators are no sentences
    assert [len(d) for d in documents(marked.sentences)] == [12, 12, 12, 12, 12]
    assert read_corpus(write_file(format_conll(marked.sentences, "bio"))).sentences == marked.sentences  # written back
    jsonl = write_file('{"text": "-DOCSTART-", "entities": []}\n{"text": "王芳", "entities": []}\n'
                       '{"text": "-DOCSTART-", "entities": []}\n{"text": "他", "entities": []}\n', "d.jsonl")
    assert [(s.text, s.document) for s in read_corpus(jsonl).sentences] == [("王芳", 1), ("他", 2)]


def test_a_long_sentence_is_cut_as_late_as_no_entity_crosses():
    #           0123456789
    tags = list("OOOOOBIIOO")  # an entity at 5:8 across the naive cut at 6
    assert piece_starts([t if t == "O" else f"{t}-X" for t in tags], 6) == [0, 5]
    assert piece_starts(["O"] * 13, 5) == [0, 5, 10]  # no entity: at the segment
    # an entity longer than the segment cannot be kept whole: cut at the segment
    assert piece_starts(["B-X"] + ["I-X"] * 9, 4) == [0, 4, 8]


def test_segments_pack_whole_sentences_and_cut_only_the_long_one():
    doc = [sentence("甲乙丙"), sentence("丁戊"), sentence("一二三四五六七八", "OOOBIIIO"), sentence("子丑")]
    assert segments(doc, 6) == [
        [(0, 0, 3), (1, 0, 2)],  # 3 + 2: the next sentence does not fit
        [(2, 0, 3)],  # the long one cut before its entity, which stays whole
        [(2, 3, 8)],
        [(3, 0, 2)],
    ]
    assert all(sum(end - start for _, start, end in seg) <= 6 for seg in segments(doc, 6))


def test_a_carved_dev_set_is_contiguous_blocks_and_train_streams_do_not_bridge_them():
    marked = [sentence(f"句{i}", document=i // 5) for i in range(40)]  # 8 documents of 5
    train, dev = contiguous_dev_split(marked, 0.25, seed=3)
    assert len(dev) == 10 and len(train) == 30
    assert sorted(len(d) for d in documents(dev)) == [5, 5]  # whole documents
    assert contiguous_dev_split(marked, 0.25, seed=3) == (train, dev)  # seeded
    unmarked = [sentence(f"句{i}") for i in range(200)]
    train, dev = contiguous_dev_split(unmarked, 0.1, seed=3)
    index = {s.text: i for i, s in enumerate(unmarked)}
    for doc in documents(dev) + documents(train):  # each run of consecutive sentences a document of its own
        positions = [index[s.text] for s in doc]
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert len(dev) == 20 and 1 < len(documents(dev)) <= 10 and len(documents(train)) > 1


def test_document_context_reads_long_sentences_whole_and_carves_dev_in_blocks(documented):
    splits = read_splits(document_config("data.max_len=5", "data.dev=null", "data.dev_split=0.2",
                                         train_file=documented))
    assert max(len(s) for s in splits.train) > 5  # data.max_len cuts nothing
    assert sorted(len(d) for d in documents(splits.dev)) == [12]  # one whole document of the five


# ------------------------------------------------------------------------------ streams


def test_documents_are_dealt_to_balanced_rows_deterministically():
    lengths = [random.Random(0).randint(5, 60) for _ in range(37)]
    dealt = deal(lengths, 4, random.Random(7))
    assert sorted(d for row in dealt for d in row) == list(range(37))
    totals = [sum(lengths[d] for d in row) for row in dealt]
    assert max(totals) - min(totals) <= max(lengths)
    assert deal(lengths, 4, random.Random(7)) == dealt
    assert deal(lengths, 4, random.Random(8)) != dealt  # each epoch's seed deals anew


def test_one_long_document_is_cut_into_parts_that_fill_the_rows():
    class Seg:  # split_parts reads only the length of a segment
        def __len__(self):
            return 10

    parts = split_parts([[Seg() for _ in range(40)]], rows=4)
    assert [len(p) for p in parts] == [10, 10, 10, 10]


def test_a_row_whose_document_changes_reads_without_memory():
    torch.manual_seed(0)
    options = TenerOptions(n_heads=2, head_dim=4, num_layers=2, dropout=0.0, attn_dropout=0.0, attention="xl",
                           memory=6, segment=6)
    encoder = Transformer(5, options).double().eval()
    x = torch.randn(2, 12, 5, dtype=torch.float64)
    mask = torch.ones(2, 12, dtype=torch.bool)
    with torch.no_grad():
        _, memory = encoder.encode(x[:, :6], mask[:, :6])
        resets = torch.tensor([True, False])  # row 0 starts a new document, row 1 reads on
        out, _ = encoder.encode(x[:, 6:], mask[:, 6:], forget(memory, resets))
        fresh, _ = encoder.encode(x[:, 6:], mask[:, 6:])
        carried, _ = encoder.encode(x[:, 6:], mask[:, 6:], memory)
    torch.testing.assert_close(out[0], fresh[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(out[1], carried[1], atol=1e-12, rtol=0)
    assert not torch.allclose(carried[0], fresh[0])  # without the reset the old document leaks in


def test_a_step_batch_marks_each_piece_and_the_rows_that_start_a_document():
    from nerkit.features.featurizer import Example
    from nerkit.training.streams import Segment

    seg = Segment(Example([3, 4, 5], [1, 1, 1], [0, 1, 0]), [2, 1])
    empty = Example([], [], [])
    batch = step_batch([(seg, False), None, (seg, True)], empty)
    assert batch.pieces.tolist() == [[0, 0, 2], [0, 2, 1], [2, 0, 2], [2, 2, 1]]
    assert batch.resets.tolist() == [False, True, True]
    assert batch.mask.tolist() == [[True] * 3, [False] * 3, [True] * 3]


def test_each_piece_of_a_segment_is_its_own_crf_sequence():
    torch.manual_seed(0)
    emissions, tag_ids = torch.randn(2, 7, 3), torch.randint(0, 3, (2, 7))
    pieces = torch.tensor([[0, 0, 3], [0, 3, 4], [1, 0, 5]])
    crf = CRF(["O", "B-X", "I-X"])
    em, tags, mask = piece_sequences(emissions, tag_ids, pieces)
    each = [crf.neg_log_likelihood(emissions[r:r + 1, s:s + n], tag_ids[r:r + 1, s:s + n],
                                   torch.ones(1, n, dtype=torch.bool)) for r, s, n in pieces.tolist()]
    torch.testing.assert_close(crf.neg_log_likelihood(em, tags, mask, reduction="mean"), torch.stack(each).mean())


# ------------------------------------------------------------------------------ training


def losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_tiny_run_in_document_context_learns(tmp_path, documented):
    metrics = train(document_config("train.epochs=4", train_file=documented), out=tmp_path / "run")
    history = losses(tmp_path / "run")
    assert history[-1] < 0.5 * history[0], history
    assert metrics["dev"]["f1"] > 0.5


def test_a_run_stopped_inside_an_epoch_resumes_to_the_uninterrupted_weights(tmp_path, documented, monkeypatch):
    """10 steps an epoch: the stop at step 13 falls inside epoch 2, with memory carried."""
    train(document_config(train_file=documented), out=tmp_path / "whole")
    train(document_config("train.max_steps=13", train_file=documented), out=tmp_path / "cut")
    train(resume_config(tmp_path / "cut", ["train.max_steps=0"]), out=tmp_path / "cut", resume=True)
    whole = (tmp_path / "whole" / "last" / "model.safetensors").read_bytes()
    assert (tmp_path / "cut" / "last" / "model.safetensors").read_bytes() == whole
    # the memory is what makes it exact: a resume that lost it ends elsewhere
    train(document_config("train.max_steps=13", train_file=documented), out=tmp_path / "lost")
    monkeypatch.setattr(nerkit.training.loop, "load_memory", lambda out, device: None)
    train(resume_config(tmp_path / "lost", ["train.max_steps=0"]), out=tmp_path / "lost", resume=True)
    assert (tmp_path / "lost" / "last" / "model.safetensors").read_bytes() != whole


def test_document_context_without_memory_is_refused_when_the_config_loads():
    raw = tiny_raw_config()
    raw["data"]["context"] = "document"
    with pytest.raises(ConfigError, match="encoder bilstm has no memory"):
        build_config(raw)
    raw["encoder"] = {"name": "transformer", "attention": "xl"}
    with pytest.raises(ConfigError, match="memory = 0.*encoder.name: transformer"):
        build_config(raw)
    raw["encoder"].update(memory=8, segment=8)
    assert build_config(raw).data.context == "document"
