"""Tests for partial annotation in the corpus formats (issue 57): the characters nobody annotated,
`UNK` in a character-per-line file and `"unknown": [[start, end], ...]` in JSON lines, doccano and
Label Studio's task data. Each format reads them into `Sentence.unknown` and writes them back, so
every round trip and every conversion between them is exact; a malformed region, or an entity in
one, is one error line; `nerkit data stats` and `validate` count them; and a score refuses a gold
file that has any (`refuse_partial`)."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_error_line, read_error

from nerkit.data.corpus import read_corpus, refuse_partial, write_corpus
from nerkit.data.records import UNKNOWN_KEY, Sentence
from nerkit.data.stats import corpus_stats
from nerkit.data.tags import UNKNOWN_TAG, Span
from nerkit.errors import CorpusError

# An excerpt shaped as dsner-news's ds_pa.bio: a distantly supervised name is known, the rest of
# the sentence is not; the second sentence is annotated whole, the third partly.
PARTIAL_BIO = ("我 UNK\n们 UNK\n受 UNK\n郑 B-PER\n振 I-PER\n铎 I-PER\n先 UNK\n生 UNK\n\n"
               "张 B-PER\n三 I-PER\n在 O\n北 O\n京 O\n\n"
               "宋 B-PER\n神 I-PER\n宗 I-PER\n时 O\n， UNK\n官 UNK\n\n")
PARTIAL_SPANS = [[Span(3, 6, "PER")], [Span(0, 2, "PER")], [Span(0, 3, "PER")]]
PARTIAL_UNKNOWN = [[(0, 3), (6, 8)], None, [(4, 6)]]




def jsonl(*records: dict) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


# ---------------------------------------------------------------- CoNLL: the UNK tag


def test_the_unknown_tag_is_unk():
    assert UNKNOWN_TAG == "UNK" and UNKNOWN_KEY == "unknown"


def test_conll_reads_unk_as_an_o_placeholder_and_an_unknown_region(write_file):
    corpus = read_corpus(write_file(PARTIAL_BIO))
    assert corpus.scheme == "bio" and corpus.types == ["PER"] and corpus.invalid_transitions == 0
    assert [s.unknown for s in corpus.sentences] == PARTIAL_UNKNOWN
    assert [s.spans() for s in corpus.sentences] == PARTIAL_SPANS
    assert UNKNOWN_TAG not in {t for s in corpus.sentences for t in s.tags}
    assert corpus.sentences[0].tags[:3] == ["O", "O", "O"]
    assert [s.partial for s in corpus.sentences] == [True, False, True]


def test_conll_round_trip_is_byte_identical(write_file, tmp_path):
    """The dsner-news file read and written again as BIO is the file (its tabs become the space
    that every character-per-line writer puts between columns)."""
    source = write_file(PARTIAL_BIO)
    write_corpus(tmp_path / "out.bio", read_corpus(source).sentences, "bio", source)
    assert (tmp_path / "out.bio").read_text(encoding="utf-8") == PARTIAL_BIO
    tabs = write_file(PARTIAL_BIO.replace(" ", "\t"), "tabs.bio")
    write_corpus(tmp_path / "tabs_out.bio", read_corpus(tabs).sentences, "bio", tabs)
    assert (tmp_path / "tabs_out.bio").read_text(encoding="utf-8") == PARTIAL_BIO


@pytest.mark.parametrize("scheme", ["bioes", "bmes"])
def test_conll_keeps_unk_in_every_scheme(write_file, tmp_path, scheme):
    source = write_file(PARTIAL_BIO)
    write_corpus(tmp_path / f"out.{scheme}", read_corpus(source).sentences, scheme, source)
    written = (tmp_path / f"out.{scheme}").read_text(encoding="utf-8")
    assert written.startswith("我 UNK\n们 UNK\n受 UNK\n郑 B-PER\n振 " + ("I" if scheme == "bioes" else "M") + "-PER\n铎 E-PER\n")
    back = read_corpus(tmp_path / f"out.{scheme}")
    assert back.scheme == scheme and [s.unknown for s in back.sentences] == PARTIAL_UNKNOWN
    write_corpus(tmp_path / "again.bio", back.sentences, "bio")
    assert (tmp_path / "again.bio").read_text(encoding="utf-8") == PARTIAL_BIO


def test_the_scheme_is_read_with_unk_as_o(write_file):
    assert read_corpus(write_file("我 UNK\n张 S-PER\n")).scheme == "bioes"
    only = read_corpus(write_file("我 UNK\n们 UNK\n", "only.bio"))
    assert only.scheme == "bio" and only.sentences[0].unknown == [(0, 2)] and only.types == []


def test_unk_before_an_inside_tag_breaks_the_scheme_as_o_does(write_file):
    path = write_file("我 UNK\n振 I-PER\n铎 I-PER\n")
    err = read_error(path)
    assert err.where == f"{path}:2"
    assert "I-PER after O continues no entity" in err.message and "UNK, not annotated, reads as O" in err.message
    repaired = read_corpus(path, repair=True)
    assert repaired.sentences[0].spans() == [Span(1, 3, "PER")] and repaired.sentences[0].unknown == [(0, 1)]
    unclosed = write_file("张 B-PER\n三 I-PER\n我 UNK\n们 S-PER\n", "unclosed.bioes")
    err = read_error(unclosed)
    assert err.where == f"{unclosed}:3" and "O after I-PER" in err.message and "UNK, not annotated, reads as O" in err.message


def test_a_lower_case_unk_is_an_error_that_names_unk(write_file):
    path = write_file("我 unk\n")
    err = read_error(path)
    assert err.where == f"{path}:1" and "did you mean UNK?" in err.fix


def test_repair_splits_an_unknown_token_into_unknown_characters(write_file):
    corpus = read_corpus(write_file("我们 UNK\n张 B-PER\n三 I-PER\n在北京 UNK\n"), repair=True)
    sent = corpus.sentences[0]
    assert sent.text == "我们张三在北京" and sent.unknown == [(0, 2), (4, 7)] and sent.spans() == [Span(2, 4, "PER")]


# ---------------------------------------------------------------- JSON lines: the "unknown" key


PARTIAL_RECORDS = [
    {"id": 1, "text": "我们受郑振铎先生", "entities": [{"start": 3, "end": 6, "type": "PER"}], "unknown": [[0, 3], [6, 8]]},
    {"text": "张三在北京", "entities": [{"start": 0, "end": 2, "type": "PER"}]},
    {"text": "宋神宗时，官", "entities": [{"start": 0, "end": 3, "type": "PER"}], "unknown": [[4, 6]],
     "meta": {"source": "news"}},
]


def test_jsonl_reads_unknown_regions_and_writes_them_back(write_file, tmp_path):
    """The regions are read as character offsets, end exclusive; a record's other keys stay where
    they were (first), "unknown" comes after "entities", and only a partial record has it."""
    source = write_file(jsonl(*PARTIAL_RECORDS), "partial.jsonl")
    corpus = read_corpus(source)
    assert [s.unknown for s in corpus.sentences] == PARTIAL_UNKNOWN
    assert [s.extra for s in corpus.sentences] == [{"id": 1}, None, {"meta": {"source": "news"}}]
    write_corpus(tmp_path / "out.jsonl", corpus.sentences, "jsonl", source)
    written = (tmp_path / "out.jsonl").read_text(encoding="utf-8")
    assert written == jsonl(
        PARTIAL_RECORDS[0], PARTIAL_RECORDS[1],
        {"meta": {"source": "news"}, "text": "宋神宗时，官", "entities": [{"start": 0, "end": 3, "type": "PER"}],
         "unknown": [[4, 6]]})
    write_corpus(tmp_path / "again.jsonl", read_corpus(tmp_path / "out.jsonl").sentences, "jsonl")
    assert (tmp_path / "again.jsonl").read_text(encoding="utf-8") == written


def test_a_record_without_the_key_or_with_an_empty_list_is_complete(write_file):
    corpus = read_corpus(write_file(jsonl({"text": "张三", "entities": [], "unknown": []},
                                          {"text": "李四", "entities": []}), "complete.jsonl"))
    assert [s.unknown for s in corpus.sentences] == [None, None]
    assert [s.extra for s in corpus.sentences] == [None, None]  # the key is read, not kept as another key
    assert not any(s.partial for s in corpus.sentences)


REGION_ERRORS = {
    "not a list": ({"unknown": {"0": 2}}, '"unknown" is dict, not a list'),
    "not a pair": ({"unknown": [[0, 1, 2]]}, "the unknown region '[0, 1, 2]' is not [start, end]"),
    "not integers": ({"unknown": [[0, 1.5]]}, "is not [start, end] with integer offsets"),
    "outside the text": ({"unknown": [[3, 6]]}, "the unknown region [3, 6] is outside the text of 5 characters"),
    "negative": ({"unknown": [[-1, 2]]}, "is outside the text"),
    "empty": ({"unknown": [[2, 2]]}, "the unknown region [2, 2] is empty"),
    "out of order": ({"unknown": [[3, 5], [0, 2]]}, "the unknown regions [3, 5] and [0, 2] are out of order"),
    "overlapping": ({"unknown": [[0, 3], [2, 5]]}, "the unknown regions [0, 3] and [2, 5] overlap"),
    "touching": ({"unknown": [[0, 2], [2, 5]]}, "the unknown regions [0, 2] and [2, 5] touch"),
    "an entity in one": ({"entities": [{"start": 0, "end": 2, "type": "PER"}], "unknown": [[1, 5]]},
                         "the entity PER '张三' at 0:2 overlaps the unknown region [1, 5]"),
}


@pytest.mark.parametrize("case", REGION_ERRORS)
def test_a_malformed_unknown_region_is_one_error_line(case, nerkit, write_file, tmp_path):
    change, words = REGION_ERRORS[case]
    record = {"text": "张三在北京", "entities": [], **change}
    path = write_file(jsonl({"text": "李四", "entities": []}, record), "bad.jsonl")
    err = read_error(path)
    assert err.where == f"{path}:2" and words in err.message and err.fix
    result = nerkit("data", "convert", str(path), str(tmp_path / "out.bio"), "--to", "bio", check=False)
    assert_one_error_line(result, f"{path}:2", words)
    assert not (tmp_path / "out.bio").exists()


def test_overlapping_regions_name_the_one_region_to_write(write_file):
    err = read_error(write_file(jsonl({"text": "张三在北京", "entities": [], "unknown": [[0, 3], [2, 5]]}), "a.jsonl"))
    assert "[0, 5]" in err.fix


def test_a_nested_partial_record_keeps_its_regions_through_a_flat_projection(write_file, tmp_path):
    record = {"text": "北京大学的人", "entities": [{"start": 0, "end": 2, "type": "LOC"}, {"start": 0, "end": 4, "type": "ORG"}],
              "unknown": [[4, 6]]}
    source = write_file(jsonl(record), "nested.jsonl")
    assert read_corpus(source).sentences[0].unknown == [(4, 6)]
    flat = read_corpus(source, flat="outer")
    assert flat.sentences[0].unknown == [(4, 6)] and flat.sentences[0].spans() == [Span(0, 4, "ORG")]
    write_corpus(tmp_path / "out.bio", flat.sentences, "bio", source)
    assert (tmp_path / "out.bio").read_text(encoding="utf-8") == "北 B-ORG\n京 I-ORG\n大 I-ORG\n学 I-ORG\n的 UNK\n人 UNK\n\n"


# ---------------------------------------------------------------- doccano and Label Studio


def test_doccano_carries_unknown_in_its_utf16_units(write_file, tmp_path):
    """doccano counts UTF-16 units, so a region after an emoji is one further along there, as its
    labels are; the key is read, written beside "label" and read back."""
    record = {"text": "😀张三在北京", "label": [[2, 4, "PER"]], "unknown": [[4, 7]]}
    source = write_file(jsonl(record), "export.jsonl")
    corpus = read_corpus(source, fmt="doccano")
    assert corpus.sentences[0].unknown == [(3, 6)] and corpus.sentences[0].spans() == [Span(1, 3, "PER")]
    write_corpus(tmp_path / "out.jsonl", corpus.sentences, "doccano", source, "doccano")
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == jsonl(record)
    inside = write_file(jsonl({"text": "😀张三", "label": [], "unknown": [[1, 3]]}), "inside.jsonl")
    assert "starts or ends inside a character" in read_error(inside, "doccano").message


def test_doccano_refuses_an_entity_in_an_unknown_region(write_file):
    path = write_file(jsonl({"text": "张三在北京", "label": [[0, 2, "PER"]], "unknown": [[1, 5]]}), "export.jsonl")
    err = read_error(path, "doccano")
    assert err.where == f"{path}:1" and "overlaps the unknown region [1, 5]" in err.message


def ls_tasks(unknown) -> list[dict]:
    data = {"text": "张三在北京", **({"unknown": unknown} if unknown is not None else {})}
    return [{"data": data, "annotations": [{"result": [{"from_name": "label", "to_name": "text", "type": "labels",
                                                        "value": {"start": 0, "end": 2, "text": "张三",
                                                                  "labels": ["PER"]}}]}]}]


def test_label_studio_carries_unknown_in_the_task_data(write_file, tmp_path):
    source = write_file(json.dumps(ls_tasks([[2, 5]]), ensure_ascii=False), "export.json")
    corpus = read_corpus(source, fmt="label-studio")
    assert corpus.sentences[0].unknown == [(2, 5)] and corpus.sentences[0].spans() == [Span(0, 2, "PER")]
    write_corpus(tmp_path / "out.json", corpus.sentences, "label-studio", source, "label-studio")
    written = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert written == ls_tasks([[2, 5]])
    write_corpus(tmp_path / "again.json", read_corpus(tmp_path / "out.json", fmt="label-studio").sentences,
                 "label-studio")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "out.json").read_bytes()
    complete = write_file(json.dumps(ls_tasks(None), ensure_ascii=False), "complete.json")
    write_corpus(tmp_path / "complete_out.json", read_corpus(complete, fmt="label-studio").sentences, "label-studio")
    assert "unknown" not in (tmp_path / "complete_out.json").read_text(encoding="utf-8")


def test_label_studio_refuses_an_entity_in_an_unknown_region(nerkit, write_file, tmp_path):
    path = write_file(json.dumps(ls_tasks([[1, 5]]), ensure_ascii=False), "export.json")
    result = nerkit("data", "convert", str(path), str(tmp_path / "out.jsonl"), "--from", "label-studio", "--to", "jsonl",
                    check=False)
    assert_one_error_line(result, f"{path}: task 0", "the entity PER '张三' at 0:2 overlaps the unknown region [1, 5]")
    bad = write_file(json.dumps(ls_tasks([[0, 9]]), ensure_ascii=False), "bad.json")
    assert "is outside the text of 5 characters" in read_error(bad, "label-studio").message


# ---------------------------------------------------------------- conversions between them


@pytest.mark.parametrize("via", ["jsonl", "bioes", "bmes", "doccano", "label-studio"])
def test_nerkit_data_convert_carries_unknown_regions_there_and_back(nerkit, write_file, tmp_path, via):
    """ds_pa.bio through every format that holds partial annotation and back is itself."""
    source = write_file(PARTIAL_BIO)
    middle, back = tmp_path / f"middle.{via}", tmp_path / "back.bio"
    nerkit("data", "convert", str(source), str(middle), "--to", via)
    fmt = "conll" if via in ("bioes", "bmes") else via
    assert [s.unknown for s in read_corpus(middle, fmt=fmt).sentences] == PARTIAL_UNKNOWN
    nerkit("data", "convert", str(middle), str(back), "--from", fmt, "--to", "bio")
    assert back.read_text(encoding="utf-8") == PARTIAL_BIO


# ---------------------------------------------------------------- stats, validate


def test_stats_count_partial_sentences_and_unknown_characters(nerkit, write_file):
    path = write_file(PARTIAL_BIO)
    stats = corpus_stats(path)
    assert (stats["partial_sentences"], stats["unknown_characters"]) == (2, 7)
    result = nerkit("data", "stats", str(path))
    assert '  partial       7 characters nobody annotated (UNK / "unknown") in 2 of 3 texts' in result.stdout
    complete = corpus_stats(write_file("张 B-PER\n三 I-PER\n", "complete.bio"))
    assert (complete["partial_sentences"], complete["unknown_characters"]) == (0, 0)
    assert "  partial  " not in nerkit("data", "stats", str(write_file("张 B-PER\n", "c.bio"))).stdout


def test_validate_says_how_much_is_unannotated_and_its_repair_keeps_it(nerkit, write_file, tmp_path):
    path = write_file(PARTIAL_BIO)
    result = nerkit("data", "validate", str(path))
    assert result.stdout == (f'{path}: OK, 3 texts, BIO, types PER; partial: 7 characters nobody annotated '
                             f'(UNK / "unknown") in 2 of 3 texts\n')
    assert "; partial" not in nerkit("data", "validate", str(write_file("张 B-PER\n", "c.bio"))).stdout
    broken = write_file("我 UNK\n振 I-PER\n铎 I-PER\n", "broken.bio")
    nerkit("data", "validate", str(broken), "--repair", str(tmp_path / "fixed.bio"))
    assert (tmp_path / "fixed.bio").read_text(encoding="utf-8") == "我 UNK\n振 B-PER\n铎 I-PER\n\n"


# ---------------------------------------------------------------- scores refuse partial gold


def test_refuse_partial_names_the_first_unknown_character(write_file):
    path = write_file(PARTIAL_BIO)
    corpus = read_corpus(path)
    with pytest.raises(CorpusError) as info:
        refuse_partial(corpus)
    assert info.value.where == f"{path}:1"
    assert 'the gold has unknown regions (UNK tags / "unknown") in 2 of 3 sentences' in info.value.message
    later = write_file("张 B-PER\n三 I-PER\n\n宋 B-PER\n神 I-PER\n， UNK\n", "later.bio")
    with pytest.raises(CorpusError) as info:
        refuse_partial(read_corpus(later).sentences, later, role="test set")
    assert info.value.where == f"{later}:6" and info.value.message.startswith("the test set has unknown regions")
    records = write_file(jsonl(*PARTIAL_RECORDS[1:]), "partial.jsonl")
    with pytest.raises(CorpusError) as info:
        refuse_partial(read_corpus(records))
    assert info.value.where == f"{records}:2"
    refuse_partial(read_corpus(write_file(jsonl(PARTIAL_RECORDS[1]), "complete.jsonl")))  # complete: no error


def test_eval_refuses_a_gold_file_with_unknown_regions(nerkit, tiny_model_dir, write_file):
    import nerkit as api

    path = write_file("张 B-PER\n伟 I-PER\n在 O\n北 B-LOC\n京 I-LOC\n\n李 B-PER\n娜 I-PER\n来 UNK\n了 UNK\n")
    result = nerkit("eval", "--model", str(tiny_model_dir), "--data", str(path), check=False)
    assert_one_error_line(result, f"{path}:9", "the gold has unknown regions")
    assert "a score needs complete annotation" in result.stderr
    with pytest.raises(CorpusError, match="the gold has unknown regions"):
        api.load(tiny_model_dir).evaluate(path)
