"""Prediction with Transformer-XL's memory (nerkit.inference.recurrence): a text longer than one
segment is read segment by segment with the tags settled as they come, equal to decoding the whole
text at once; `--document` reads lines as one stream, checked against a by-hand reading of its
segments; the command line's --document, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import tiny_raw_config

from nerkit.config import build_config
from nerkit.features.batch import collate
from nerkit.inference.pipeline import Pipeline
from nerkit.inference.recurrence import MemoryReader, pieces

SEGMENT, MEMORY = 8, 6
TEXTS = ["张伟在北京大学读书，后来去了上海工作。", "李娜是湖北人。", "他们在天安门广场见面，然后去了王府井。",
         "中国人民银行", "我", "欧阳修在滁州写了醉翁亭记，那里的山水很美。"]


def test_lines_are_packed_whole_and_long_ones_cut():
    # lengths 3, 5, 10, 2, 0, 4, 1 with segments of 8: 3 and 5 fill one; 10 starts the next and is
    # cut at 8; its last 2 share a segment with the 2 and the 4; the empty line makes no piece.
    assert list(pieces([3, 5, 10, 2, 0, 4, 1], 8)) == [
        [(0, 0, 3), (1, 0, 5)],
        [(2, 0, 8)],
        [(2, 8, 10), (3, 0, 2), (5, 0, 4)],
        [(6, 0, 1)],
    ]
    assert list(pieces([20], 8)) == [[(0, 0, 8)], [(0, 8, 16)], [(0, 16, 20)]]  # the encoder's own cuts
    assert list(pieces([], 8)) == [] and list(pieces([0, 0], 8)) == []
    for lengths in ([7, 7, 7], [1] * 20, [9, 3, 17, 8, 8, 1]):
        segments = list(pieces(lengths, 8))
        assert all(sum(b - a for _, a, b in s) <= 8 for s in segments)
        covered = [(i, a, b) for s in segments for i, a, b in s]
        for line, length in enumerate(lengths):  # every line covered once, in order, without gaps
            own = [(a, b) for i, a, b in covered if i == line]
            assert own[0][0] == 0 and own[-1][1] == length and all(x[1] == y[0] for x, y in zip(own, own[1:]))


@pytest.fixture(scope="module")
def memory_pipe(tmp_path_factory) -> Pipeline:
    """A tiny TENER with memory, trained for two epochs: enough for tags that are not all one kind."""
    from nerkit.training.loop import train

    raw = tiny_raw_config()
    raw["encoder"] = {"name": "transformer", "attention": "tener", "n_heads": 2, "head_dim": 8, "num_layers": 2,
                      "dropout": 0.0, "attn_dropout": 0.0, "memory": MEMORY, "segment": SEGMENT}
    raw["train"].update(epochs=2)
    out = tmp_path_factory.mktemp("memory_model") / "model"
    train(build_config(raw, "<memory config>"), out=out)
    pipe = Pipeline.load(out)
    with torch.no_grad():  # random transitions: the CRF has a say in every decision
        generator = torch.Generator().manual_seed(0)
        for param in pipe.model.head.crf.parameters():
            param.add_(torch.randn(param.shape, generator=generator))
    pipe.save(out.parent / "perturbed")
    return Pipeline.load(out.parent / "perturbed")


def whole_text_tags(pipe: Pipeline, text: str) -> list[int]:
    """The tag ids of the text decoded at once: the encoder's own segment loop, CRF.decode."""
    batch = collate([pipe.featurizer.example(list(text))])
    pipe.model.eval()
    return pipe.model.paths(batch)[0]


def test_a_long_text_read_segment_by_segment_equals_decoding_it_whole(memory_pipe):
    text = "".join(TEXTS) * 3  # 330 characters: 42 segments
    reader = MemoryReader(memory_pipe)
    assert reader.read(text) == whole_text_tags(memory_pipe, text)
    assert all(state.size(1) <= MEMORY for state, _ in reader.memory)  # what it holds is bounded
    assert len(reader.decoder.pointers) < 10 * SEGMENT
    assert memory_pipe.window == 0  # the default: any text is read whole
    spans = memory_pipe.predict_tokens([text, TEXTS[1], list(text)])
    assert spans[0] == memory_pipe.spans_of(text, whole_text_tags(memory_pipe, text)) == spans[2]
    assert spans[1] == memory_pipe.spans_of(TEXTS[1], whole_text_tags(memory_pipe, TEXTS[1]))


def by_hand(pipe: Pipeline, lines: list[str], segments: list[list[tuple[int, int, int]]]) -> list[list[int]]:
    """Each line's tags from the segments given: the pieces' features joined, the encoder stepped
    with its memory, each line's emissions gathered and decoded by CRF.decode."""
    model = pipe.model.eval()
    emissions: list[list[torch.Tensor]] = [[] for _ in lines]
    memory = None
    with torch.no_grad():
        for segment in segments:
            chars, bichars = [], []
            for i, a, b in segment:
                example = pipe.featurizer.example(list(lines[i]))  # the whole line's features, then cut
                chars += example.char_ids[a:b]
                bichars += example.bichar_ids[a:b]
            x = model.embedder(collate([type(example)(chars, bichars)]))
            h, memory = model.encoder.encode(x, torch.ones(1, len(chars), dtype=torch.bool), memory)
            step = model.head.emission(h)[0]  # (L, K)
            offset = 0
            for i, a, b in segment:
                emissions[i].append(step[offset:offset + b - a])
                offset += b - a
        return [model.head.crf.decode(torch.cat(e)[None], torch.ones(1, len(line), dtype=torch.bool))[0] if line else []
                for e, line in zip(emissions, lines)]


def test_a_document_is_read_as_one_stream(memory_pipe):
    lines = [TEXTS[1], TEXTS[3], "", TEXTS[0], TEXTS[4], TEXTS[2]]
    expected = by_hand(memory_pipe, lines, [[(0, 0, 7)], [(1, 0, 6)], [(3, 0, 8)], [(3, 8, 16)],
                                            [(3, 16, 19), (4, 0, 1)], [(5, 0, 8)], [(5, 8, 16)], [(5, 16, 19)]])
    assert MemoryReader(memory_pipe).read_lines(lines) == expected
    # The stream runs on across calls (the lines of `nerkit predict --document`'s chunks): a call
    # starts a new segment, with the memory of the calls before.
    stream = memory_pipe.document_stream()
    first, second = stream.predict_tokens(lines[:2]), stream.predict_tokens([TEXTS[0]])
    later = by_hand(memory_pipe, lines[:2] + [TEXTS[0]], [[(0, 0, 7)], [(1, 0, 6)], [(2, 0, 8)], [(2, 8, 16)],
                                                          [(2, 16, 19)]])
    assert first + second == [memory_pipe.spans_of(t, e) for t, e in zip(lines[:2] + [TEXTS[0]], later)]


def test_the_memory_changes_what_a_later_line_reads(memory_pipe):
    """A line read after others attends to them: its emissions differ from the line read alone."""
    reader = MemoryReader(memory_pipe)
    reader.read_lines([TEXTS[0]])
    example = memory_pipe.featurizer.example(list(TEXTS[1]))
    with torch.no_grad():
        after, _ = memory_pipe.model.read_segment(collate([example]), reader.memory)
        alone, _ = memory_pipe.model.read_segment(collate([example]))
    assert not torch.allclose(after, alone)


def test_evaluation_reads_each_document_in_order(memory_pipe, tmp_path):
    """Sentences of one document are one stream; a `-DOCSTART-` line starts the next from no memory."""
    def sentence(text: str) -> str:
        return "".join(f"{c} O\n" for c in text) + "\n"

    gold = tmp_path / "gold.bio"
    texts = [TEXTS[2], TEXTS[1], TEXTS[0]]
    gold.write_text(sentence(texts[0]) + sentence(texts[1]) + "-DOCSTART- O\n\n" + sentence(texts[2]),
                    encoding="utf-8")
    document = memory_pipe.predict_and_score(gold, document=True)
    expected = MemoryReader(memory_pipe).read_lines(texts[:2]) + [MemoryReader(memory_pipe).read(texts[2])]
    assert document.predicted == [memory_pipe.spans_of(t, e) for t, e in zip(texts, expected)]
    continued = MemoryReader(memory_pipe).read_lines(texts)[2]  # what no separator would have given
    assert continued != expected[2]  # (for these texts and this model: so the test can fail)
    # A separator line of `nerkit predict --document` input: no entities, and the next line starts afresh.
    spans = memory_pipe.document_stream().predict_tokens([texts[0], texts[1], "-DOCSTART-", texts[2]])
    assert spans == document.predicted[:2] + [[]] + document.predicted[2:]


def test_document_on_the_command_line(memory_pipe, tiny_model_dir, tmp_path, nerkit):
    source = tmp_path / "doc.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    model = str(memory_pipe.directory)
    out = nerkit("predict", "--model", model, str(source), "--document").stdout
    records = [json.loads(line) for line in out.splitlines()]
    expected = MemoryReader(memory_pipe).read_lines(TEXTS)
    assert [r["text"] for r in records] == TEXTS
    assert [r["entities"] for r in records] == [[s.to_dict(t) for s in memory_pipe.spans_of(t, e)]
                                                  for t, e in zip(TEXTS, expected)]
    refusals = [
        (("predict", "--model", str(tiny_model_dir), str(source), "--document"), "needs a model with encoder.memory"),
        (("predict", "--model", model, str(source), "--document", "--workers", "2"), "one process reads it"),
        (("predict", "--model", model, str(source), "--document", "--window", "5"), "would cut it"),
        (("eval", "--model", str(tiny_model_dir), "--data", str(source), "--document"), "needs a model with encoder"),
    ]
    for args, message in refusals:
        result = nerkit(*args, check=False)
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1, args


def test_a_look_ahead_margin_is_read_but_neither_emitted_nor_remembered(memory_pipe):
    """With `margin`, each segment is encoded with the characters after it, emits only its own and
    remembers only its own inputs: checked against the encoder stepped by hand."""
    text = TEXTS[0] + TEXTS[2]  # 38 characters: segments of 8, the last one 6
    model = memory_pipe.model.eval()
    example = memory_pipe.featurizer.example(list(text))
    x = model.embedder(collate([example]))  # (1, 38, D): per-character features, the whole text's
    emissions, memory = [], None
    with torch.no_grad():
        for start in range(0, len(text), SEGMENT):
            end = min(start + SEGMENT, len(text))
            ahead = min(end + 3, len(text))
            h, memory = model.encoder.encode(x[:, start:ahead], torch.ones(1, ahead - start, dtype=torch.bool),
                                             memory, keep=end - start)
            assert all(state.size(1) == min(MEMORY, end) for state, _ in memory)  # nothing of the look-ahead
            emissions.append(model.head.emission(h)[0, : end - start])
        expected = model.head.crf.decode(torch.cat(emissions)[None], torch.ones(1, len(text), dtype=torch.bool))[0]
    assert MemoryReader(memory_pipe, margin=3).read(text) == expected
    assert MemoryReader(memory_pipe, margin=0).read(text) == whole_text_tags(memory_pipe, text)


def test_a_long_text_read_with_memory_gets_scores_from_windows_of_its_emissions(memory_pipe):
    """Scores of a text longer than a segment: the spans are those of reading it unscored, and in a
    text no longer than two segments (one window) each score is the CRF's probability of that entity
    over the text's whole emission sequence, as the reader computed it segment by segment."""
    from nerkit.inference.recurrence import MemoryReader

    short = TEXTS[0][:2 * SEGMENT]  # one window of two segments
    long = "".join(TEXTS)
    scored = memory_pipe.predict_tokens([short, long], scores=True)
    plain = memory_pipe.predict_tokens([short, long])
    assert scored == plain and any(scored)  # spans compare by offsets and type
    assert all(s.score is not None and 0 <= s.score <= 1 for spans in scored for s in spans)
    reader = MemoryReader(memory_pipe)
    reader.keep_emissions(1)
    tag_ids = reader.read(short)
    emissions = torch.from_numpy(np.concatenate(reader.kept[0]))[None]  # (1, n, K)
    mask = torch.ones(1, len(short), dtype=torch.bool)
    expected = memory_pipe.model.head.crf.entity_probabilities(emissions, mask, [tag_ids])[0]
    assert [s.score for s in scored[0]] == pytest.approx(expected, abs=1e-9)


def test_a_document_stream_gives_scores(memory_pipe):
    stream = memory_pipe.document_stream()
    scored = stream.predict_tokens(TEXTS, scores=True)
    stream.reset()
    assert scored == stream.predict_tokens(TEXTS) and any(scored)
    assert all(s.score is not None for spans in scored for s in spans)
