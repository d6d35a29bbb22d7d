"""Nested data (issue 45, section 2): overlapping entities and spans with two types read and written by
every format of offsets, counted by validate and stats, refused by what cannot hold them (a BIO file,
a CRF's training data) with the fix, projected flat on request, CBLUE's JSON, and evaluation that
counts nested spans exactly with a nested/flat split. Expected figures are worked out by hand."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from nerkit.data.corpus import read_corpus, write_corpus
from nerkit.data.nesting import Nesting, nesting
from nerkit.data.tags import Span
from nerkit.errors import CorpusError, UserError
from nerkit.inference.evaluate import nesting_errors, score

# 中华人民共和国国务院总理张三: ORG 0:10 holds LOC 0:7, which holds LOC 0:2 (depth 3); X 9:12 crosses
# ORG 0:10; 张三 12:14 is both PER and NAME (written in that order). The second sentence is flat.
NESTED_TEXT = "中华人民共和国国务院总理张三"
NESTED = [(0, 10, "ORG"), (0, 7, "LOC"), (0, 2, "LOC"), (9, 12, "X"), (12, 14, "PER"), (12, 14, "NAME")]
FLAT_TEXT, FLAT = "李四在北京", [(0, 2, "PER"), (3, 5, "LOC")]


def spans(*triples) -> list[Span]:
    return sorted((Span(*t) for t in triples), key=lambda s: (s.start, s.end, s.type))


def jsonl_corpus(write_file, name: str = "nested.jsonl"):
    records = [{"text": NESTED_TEXT, "entities": [{"start": s, "end": e, "type": t} for s, e, t in NESTED]},
               {"text": FLAT_TEXT, "entities": [{"start": s, "end": e, "type": t} for s, e, t in FLAT]}]
    return write_file("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), name)


def test_a_nested_corpus_is_read_whole(write_file):
    corpus = read_corpus(jsonl_corpus(write_file))
    first, second = corpus.sentences
    assert first.nested and first.spans() == spans(*NESTED)
    assert not second.nested and second.spans() == spans(*FLAT)
    assert corpus.types == ["LOC", "NAME", "ORG", "PER", "X"]


@pytest.mark.parametrize("fmt, name", [("jsonl", "out.jsonl"), ("doccano", "out.jsonl"),
                                       ("label-studio", "out.json")])
def test_nested_spans_and_two_types_round_trip(fmt, name, write_file, tmp_path):
    source = jsonl_corpus(write_file)
    out = tmp_path / name
    write_corpus(out, read_corpus(source).sentences, fmt, source)
    back = read_corpus(out, fmt=fmt)
    assert [s.spans() for s in back.sentences] == [spans(*NESTED), spans(*FLAT)]


def test_label_studio_reads_two_labels_on_one_result_as_two_entities(write_file):
    task = {"data": {"text": "张三"}, "annotations": [{"result": [
        {"from_name": "label", "to_name": "text", "type": "labels",
         "value": {"start": 0, "end": 2, "text": "张三", "labels": ["PER", "NAME"]}}]}]}
    corpus = read_corpus(write_file(json.dumps([task], ensure_ascii=False), "ls.json"), fmt="label-studio")
    assert corpus.sentences[0].spans() == spans((0, 2, "NAME"), (0, 2, "PER"))


def test_nesting_counts_by_hand(write_file):
    found = nesting(s.spans() for s in read_corpus(jsonl_corpus(write_file)).sentences)
    # overlapping: all six of the first sentence; inside: LOC 0:7 (in ORG), LOC 0:2 (in both);
    # crossing: X and ORG; the flat sentence adds two entities and nothing else.
    assert found == Nesting(entities=8, overlapping=6, inside=2, crossing=2, two_types=1, depth=3, sentences=1)
    assert nesting([spans(*FLAT)]) == Nesting(entities=2, depth=1)


def test_validate_and_stats_report_nesting(nerkit, write_file):
    path = jsonl_corpus(write_file)
    said = ("nested: 6 of 8 entities (75.0%) overlap another in 1 sentences (2 inside another, 2 crossing one), "
            "depth 3, 1 spans with two types")
    result = nerkit("data", "validate", str(path))
    assert result.stdout == f"{path}: OK, 2 texts, spans (JSON lines), types LOC, NAME, ORG, PER, X; {said}\n"
    assert f"  nesting       {said}\n" in nerkit("data", "stats", str(path)).stdout + "\n"
    stats = json.loads(nerkit("data", "stats", str(path), "--json").stdout)[0]
    assert stats["nesting"] == {"entities": 8, "overlapping": 6, "inside": 2, "crossing": 2, "two_types": 1,
                                "depth": 3, "sentences": 1}


def test_a_flat_corpus_reports_as_before(nerkit, write_file):
    path = write_file(json.dumps({"text": FLAT_TEXT, "entities": []}) + "\n", "flat.jsonl")
    assert nerkit("data", "validate", str(path)).stdout == f"{path}: OK, 1 texts, spans (JSON lines), types -\n"
    assert "nesting" not in nerkit("data", "stats", str(path)).stdout


def test_converting_nested_to_bio_is_refused_in_one_line(nerkit, write_file, tmp_path):
    path, out = jsonl_corpus(write_file), tmp_path / "out.bio"
    result = nerkit("data", "convert", str(path), str(out), "--to", "bio", check=False)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"nerkit: error: {path}:1: a character-per-line file (BIO) holds one entity per "
                                    "character, but the entities of 1 sentence overlap (the first: LOC '中华' at 0:2 "
                                    "and LOC '中华人民共和国' at 0:7)")
    assert "--flat outer" in result.stderr and "--flat inner" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("flat, expected", [
    # outer: the longest first (ORG takes 0-9, so X 9:12 loses); of 张三's two types NAME, first
    # alphabetically though the file lists PER first
    ("outer", [(0, 10, "ORG"), (12, 14, "NAME")]),
    # inner: the shortest first: LOC 0:2, NAME 12:14, then X 9:12 finds its characters free
    ("inner", [(0, 2, "LOC"), (9, 12, "X"), (12, 14, "NAME")]),
])
def test_flat_projections_keep_the_hand_computed_spans(flat, expected, nerkit, write_file, tmp_path):
    path, out = jsonl_corpus(write_file), tmp_path / "out.bioes"
    result = nerkit("data", "convert", str(path), str(out), "--to", "bioes", "--flat", flat)
    assert f"dropped {6 - len(expected)} overlapping entities (--flat {flat} keeps the " in result.stdout
    assert [s.spans() for s in read_corpus(out).sentences] == [spans(*expected), spans(*FLAT)]


def test_repair_is_the_outer_projection(write_file):
    repaired = read_corpus(jsonl_corpus(write_file), repair=True)
    assert repaired.sentences[0].spans() == spans((0, 10, "ORG"), (12, 14, "NAME")) and repaired.dropped_overlaps == 4


def test_the_flat_option_lists_the_configs_projections():
    from nerkit.cli.options import Flat
    from nerkit.config import FLATS

    assert ("none", *get_args(Flat)) == FLATS


# ----------------------------------------------------------------------------- training's data

def test_training_on_a_nested_corpus_names_the_fix_and_data_flat_projects_train_only(write_file, tiny_config):
    from nerkit.data.splits import read_splits

    path = jsonl_corpus(write_file)
    with pytest.raises(UserError) as info:
        read_splits(tiny_config(f"data.train={path}", f"data.dev={path}"))
    assert info.value.where == f"{path}:1" and "a CRF head tags each character once" in info.value.message
    assert "data.flat: outer" in info.value.fix and "model.head: span" in info.value.fix
    splits = read_splits(tiny_config(f"data.train={path}", f"data.dev={path}", "data.flat=inner"))
    assert [s.spans() for s in splits.train] == [spans((0, 2, "LOC"), (9, 12, "X"), (12, 14, "NAME")), spans(*FLAT)]
    assert not any(s.nested for s in splits.train)
    assert splits.dev[0].spans() == spans(*NESTED)  # gold is scored as written


# ----------------------------------------------------------------------------- CBLUE

def cblue_record(text, *entities) -> dict:
    return {"text": text, "entities": [{"start_idx": s, "end_idx": e, "type": t, "entity": text[s:e + 1]}
                                       for s, e, t in entities]}


def test_cblue_json_is_read_with_inclusive_ends(write_file, nerkit, tmp_path):
    records = [cblue_record("咽肌痉挛", (0, 3, "sym"), (0, 1, "bod")), cblue_record("无", )]
    path = write_file(json.dumps(records, ensure_ascii=False, indent=2), "CMeEE_dev.json")
    for fmt in ("cblue", "auto"):  # auto: a .json array whose entities have start_idx
        corpus = read_corpus(path, fmt=fmt)
        assert corpus.format == "cblue"
        assert [s.spans() for s in corpus.sentences] == [spans((0, 2, "bod"), (0, 4, "sym")), []]
    out = tmp_path / "dev.jsonl"
    nerkit("data", "convert", str(path), str(out), "--from", "cblue", "--to", "jsonl")
    assert out.read_text(encoding="utf-8").splitlines()[0] == (
        '{"text": "咽肌痉挛", "entities": [{"start": 0, "end": 2, "type": "bod"}, {"start": 0, "end": 4, "type": "sym"}]}')


def test_cblue_entity_text_that_is_not_at_its_offsets_is_refused(write_file, nerkit, tmp_path):
    bad = cblue_record("咽肌痉挛", (0, 3, "sym"))
    bad["entities"][0]["entity"] = "咽肌痉"  # as if the end were exclusive
    path = write_file(json.dumps([cblue_record("无"), bad], ensure_ascii=False), "bad.json")
    with pytest.raises(CorpusError) as info:
        read_corpus(path, fmt="cblue")
    assert info.value.where == f"{path}: record 1"
    assert info.value.message == "sym '咽肌痉' is not the text at [0, 3] ('咽肌痉挛')"
    result = nerkit("data", "convert", str(path), str(tmp_path / "o.jsonl"), "--to", "jsonl", check=False)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and "record 1" in result.stderr


# ----------------------------------------------------------------------------- evaluation

# Gold: the nested sentence's ORG 0:10, LOC 0:7 and 张三 as PER and NAME (all four nested), and the
# flat sentence's PER 0:2, LOC 3:5. Predicted: ORG and PER right, LOC 0:6 (touches nested gold:
# nested), PER 0:2 right, LOC 3:4 and X 2:3 (flat; X touches no gold entity: spurious).
GOLD = [spans((0, 10, "ORG"), (0, 7, "LOC"), (12, 14, "PER"), (12, 14, "NAME")), spans(*FLAT)]
PREDICTED = [spans((0, 10, "ORG"), (12, 14, "PER"), (0, 6, "LOC")), spans((0, 2, "PER"), (3, 4, "LOC"), (2, 3, "X"))]


def test_evaluation_counts_nested_spans_exactly_and_splits_them():
    found = score(GOLD, PREDICTED)
    assert found["counts"] == {"correct": 3, "predicted": 6, "gold": 6}
    assert (found["precision"], found["recall"], found["f1"]) == pytest.approx((0.5, 0.5, 0.5))
    per_type = {t: (m["precision"], m["recall"], m["f1"], m["support"]) for t, m in found["per_type"].items()}
    assert per_type == {"LOC": (0, 0, 0, 2), "NAME": (0, 0, 0, 1), "ORG": (1, 1, 1, 1), "PER": (1, 1, 1, 2),
                        "X": (0, 0, 0, 0)}
    nested, flat = found["nesting"]["nested"], found["nesting"]["flat"]
    assert nested["counts"] == {"correct": 2, "predicted": 3, "gold": 4}
    assert (nested["precision"], nested["recall"], nested["f1"]) == pytest.approx((2 / 3, 1 / 2, 4 / 7))
    assert flat["counts"] == {"correct": 1, "predicted": 3, "gold": 2}
    assert (flat["precision"], flat["recall"], flat["f1"]) == pytest.approx((1 / 3, 1 / 2, 0.4))
    assert "nesting" not in score([spans(*FLAT)], [spans(*FLAT)])  # a flat corpus's metrics are as they were


def test_errors_by_nesting_class():
    zero = dict.fromkeys(("correct", "wrong_type", "wrong_boundary", "wrong_both", "missed", "spurious"), 0)
    assert nesting_errors(GOLD, PREDICTED) == {
        "nested": {**zero, "correct": 2, "wrong_type": 1, "wrong_boundary": 1},  # NAME: PER has its offsets
        "flat": {**zero, "correct": 1, "wrong_boundary": 1, "spurious": 1},
    }
    assert nesting_errors([spans(*FLAT)], [[]]) is None


def test_eval_of_a_crf_on_nested_gold_shows_the_split(nerkit, write_file, tiny_model_dir):
    text = "新华社记者张三"  # ORG 0:3 holds 新华 (LOC 0:2): a flat model can get one of them at most
    path = write_file(json.dumps({"text": text, "entities": [{"start": 0, "end": 3, "type": "ORG"},
                                                             {"start": 0, "end": 2, "type": "LOC"},
                                                             {"start": 5, "end": 7, "type": "PER"}]},
                                 ensure_ascii=False) + "\n", "gold.jsonl")
    metrics = json.loads(nerkit("eval", "--model", str(tiny_model_dir), "--data", str(path), "--json").stdout)
    assert metrics["nesting"]["nested"]["support"] == 2 and metrics["nesting"]["flat"]["support"] == 1
    assert metrics["nesting"]["nested"]["recall"] <= 0.5
    table = nerkit("eval", "--model", str(tiny_model_dir), "--data", str(path), "--errors").stdout
    assert "\nnested " in table and "\nflat " in table
    refused = nerkit("eval", "--model", str(tiny_model_dir), "--data", str(path), "--output",
                     str(path.parent / "out.txt"), check=False)
    assert refused.returncode == 2 and "--output writes one gold tag per character" in refused.stderr


# ----------------------------------------------------------------------------- the real corpus

def test_cmeee_nesting_matches_its_readme(data_root, nerkit):
    path = data_root / "cmeee" / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"no {path}")
    stats = json.loads(nerkit("data", "stats", str(path), "--json").stdout)[0]
    # The README's "overlapping" column: entities that share a character with another
    assert stats["entities_total"] == 61_794 and stats["nesting"]["overlapping"] == 6_561
    assert stats["nesting"]["two_types"] == 33
