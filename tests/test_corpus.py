"""Tests for nerkit.data.corpus: tags <-> spans in every scheme, reading and writing CoNLL and JSON-lines,
validation messages with FILE:LINE, repair as conlleval reads, normalisation, sentence splitting,
and the statistics of the real benchmark files."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers import read_error
from seqeval.metrics.sequence_labeling import get_entities

from nerkit.data.corpus import read_corpus, write_corpus
from nerkit.data.records import Sentence
from nerkit.data.stats import corpus_stats
from nerkit.data.tags import (
    SCHEMES,
    Span,
    convert_tags,
    detect_scheme,
    invalid_transition,
    spans_to_tags,
    tags_to_spans,
)
from nerkit.data.text import cut_points, normalize_char, split_sentence
from nerkit.errors import CorpusError

FIXTURES = Path(__file__).parent / "fixtures"
# A hyphen and a dot inside a type: the type is everything after the first '-'.
TYPES = ["PER", "LOC", "ORG-X", "GPE.NAM"]
# Token characters: CJK, ASCII, punctuation and a full-width space (a valid token), never an ASCII
# separator or the BOM (which the reader drops at the start of a file).
TOKEN_CHARS = st.one_of(
    st.sampled_from(list("张三北京中国银行。，！a1Ｚ\u3000")),
    st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters="\ufeff"),
)
REUSED_FIXTURE = [HealthCheck.function_scoped_fixture]  # one file, rewritten by every example


# ---------------------------------------------------------------- strategies and references


@st.composite
def span_sets(draw, max_pieces: int = 12) -> tuple[int, list[Span]]:
    """A sentence length and flat spans over it, adjacent entities (of the same type too) included."""
    pieces = draw(st.lists(
        st.one_of(st.tuples(st.just("O"), st.integers(1, 3)), st.tuples(st.sampled_from(TYPES), st.integers(1, 5))),
        max_size=max_pieces,
    ))
    spans, pos = [], 0
    for kind, n in pieces:
        if kind != "O":
            spans.append(Span(pos, pos + n, kind))
        pos += n
    return pos, spans


@st.composite
def sentences(draw, max_sentences: int = 4) -> list[Sentence]:
    out = []
    for _ in range(draw(st.integers(1, max_sentences))):
        n, spans = draw(span_sets().filter(lambda s: s[0] > 0))
        tokens = draw(st.lists(TOKEN_CHARS, min_size=n, max_size=n))
        out.append(Sentence(tokens, spans_to_tags(n, spans, "bioes")))
    return out


def any_tags(prefixes: str) -> st.SearchStrategy[list[str]]:
    """Arbitrary tag sequences over `prefixes` (and O), invalid transitions included."""
    entity_tag = st.builds(lambda p, t: f"{p}-{t}", st.sampled_from(prefixes.replace("O", "")), st.sampled_from(["A", "B"]))
    tag = st.one_of(st.just("O"), entity_tag)
    return st.lists(tag, min_size=1, max_size=10)


def conlleval_bio_spans(tags: list[str]) -> list[Span]:
    """conlleval's startOfChunk/endOfChunk restricted to B/I/O, transcribed from the Perl script."""
    spans, start, prev_tag, prev_type = [], None, "O", ""
    for i, tag in enumerate(tags + ["O"]):
        prefix, typ = (tag.split("-", 1) + [""])[:2] if tag != "O" else ("O", "")
        end = (prev_tag in "BI" and prefix in "BO") or (prev_tag != "O" and prev_type != typ)
        begin = prefix == "B" or (prev_tag == "O" and prefix == "I") or (prefix != "O" and prev_type != typ)
        if end and start is not None:
            spans.append(Span(start, i, prev_type))
            start = None
        if begin:
            start = i
        prev_tag, prev_type = prefix, typ
    return spans


def reference_spans(tags: list[str]) -> list[Span]:
    """seqeval's conlleval-style reading (it knows I-, not M-: the two mean the same)."""
    tags = ["I-" + t[2:] if t.startswith("M-") else t for t in tags]
    return sorted((Span(start, end + 1, typ) for typ, start, end in get_entities(tags)), key=span_key)


def span_key(span: Span) -> tuple[int, int, str]:
    return span.start, span.end, span.type




def assert_at(err: CorpusError, path: Path, line: int) -> None:
    assert err.where == f"{path}:{line}"
    assert str(err).startswith(f"{path}:{line}: ")


# ---------------------------------------------------------------- tags and spans


@pytest.mark.parametrize("scheme", SCHEMES)
@given(span_sets())
def test_spans_to_tags_to_spans_is_identity(scheme, length_spans):
    length, spans = length_spans
    tags = spans_to_tags(length, spans, scheme)
    assert len(tags) == length
    assert tags_to_spans(tags) == spans


@pytest.mark.parametrize("scheme", SCHEMES)
@given(span_sets())
def test_written_tags_break_no_transition_rule(scheme, length_spans):
    tags = spans_to_tags(*length_spans, scheme)
    prev = None
    for tag in tags + [None]:
        assert invalid_transition(prev, tag, scheme) is None, (prev, tag, tags)
        prev = tag


@pytest.mark.parametrize("source", SCHEMES)
@pytest.mark.parametrize("target", SCHEMES)
@given(span_sets())
def test_convert_tags_between_schemes_keeps_spans(source, target, length_spans):
    length, spans = length_spans
    converted = convert_tags(spans_to_tags(length, spans, source), target)
    assert converted == spans_to_tags(length, spans, target)
    assert tags_to_spans(converted) == spans


def test_scheme_tag_shapes():
    spans = [Span(0, 1, "PER"), Span(1, 4, "LOC")]
    assert spans_to_tags(5, spans, "bio") == ["B-PER", "B-LOC", "I-LOC", "I-LOC", "O"]
    assert spans_to_tags(5, spans, "bioes") == ["S-PER", "B-LOC", "I-LOC", "E-LOC", "O"]
    assert spans_to_tags(5, spans, "bmes") == ["S-PER", "B-LOC", "M-LOC", "E-LOC", "O"]
    with pytest.raises(ValueError, match="unknown scheme"):
        spans_to_tags(5, spans, "iob2")


@given(any_tags("BIO"))
def test_bio_spans_are_read_as_conlleval_reads_them(tags):
    assert tags_to_spans(tags) == conlleval_bio_spans(tags)


@pytest.mark.parametrize("prefixes", ["BIOES", "BMES"])
@given(data=st.data())
def test_bioes_and_bmes_spans_are_read_as_seqeval_reads_them(prefixes, data):
    tags = data.draw(any_tags(prefixes))
    assert sorted(tags_to_spans(tags), key=span_key) == reference_spans(tags)


@given(any_tags("BIMES"), st.sampled_from(SCHEMES))
def test_convert_tags_keeps_the_spans_of_invalid_sequences(tags, scheme):
    """Conversion, and so repair, reads an invalid sequence as conlleval does and keeps those spans."""
    assert tags_to_spans(convert_tags(tags, scheme)) == tags_to_spans(tags)


@pytest.mark.parametrize("scheme", SCHEMES)
@given(span_sets())
def test_detect_scheme(scheme, length_spans):
    length, spans = length_spans
    expected = {
        "bio": "bio",
        "bioes": "bioes" if spans else "bio",
        "bmes": "bmes" if any(s.end - s.start > 2 for s in spans) else "bioes" if spans else "bio",
    }[scheme]
    assert detect_scheme(spans_to_tags(length, spans, scheme)) == expected


def test_detect_scheme_rejects_i_mixed_with_m():
    with pytest.raises(ValueError, match="mix I-"):
        detect_scheme(["B-PER", "I-PER", "O", "B-LOC", "M-LOC", "E-LOC"])


# ---------------------------------------------------------------- validation: FILE:LINE messages


BAD_FILES = {
    # name: (content, line of the error, words the message must contain)
    "one column": ("张 B-PER\n三\n", 2, "found 1"),
    "inconsistent columns": ("张 x B-PER\n三 x I-PER\n\n在 O\n", 4, "expected 3 columns"),
    "leading space": ("张 O\n O\n", 2, "empty token"),
    "leading tab": ("张 O\n\n在 O\n\tO\n", 4, "empty token"),
    "unknown prefix": ("张 O\n三 X-PER\n", 2, "unknown tag 'X-PER'"),
    "lowercase tag": ("张 O\n三 b-per\n", 2, "did you mean B-PER?"),
    "lowercase o": ("张 B-PER\n三 o\n", 2, "did you mean O?"),
    "BIO: I after O": ("在 O\n京 I-LOC\n", 2, "I-LOC after O continues no entity"),
    "BIO: I at a sentence start": ("在 O\n\n京 I-LOC\n", 3, "at the sentence start"),
    "type change inside an entity": ("张 B-PER\n三 I-LOC\n", 2, "changes the type"),
    "BMES: M without a start": ("北 B-LOC\n京 M-LOC\n市 E-LOC\n\n在 O\n人 M-PER\n", 6, "M-PER after O"),
    "BMES: E without a start": ("北 B-LOC\n京 M-LOC\n市 E-LOC\n\n在 O\n人 E-PER\n", 6, "E-PER after O"),
    "BIOES: not closed at the end": ("李 S-PER\n\n张 B-PER\n三 I-PER\n\n在 O\n", 4, "not closed before the sentence ends"),
    "BIOES: not closed before O": ("李 S-PER\n张 B-PER\n在 O\n", 3, "is not closed"),
    "NUL byte": ("张 O\n三\x00 O\n", 2, "NUL"),
    "M- after I- tags": ("张 B-PER\n三 I-PER\n\n北 B-LOC\n京 M-LOC\n市 E-LOC\n", 5, "mix I-"),
    "I- after M- tags": ("北 B-LOC\n京 M-LOC\n市 E-LOC\n\n张 B-PER\n三 I-PER\n四 E-PER\n", 6, "mix I-"),
    # LAC's vocabulary crashed on these (issue 33); offsets count characters on every path
    "token of two characters": ("张 B-PER\n三 I-PER\n在 O\nab O\n北 B-LOC\n", 4,
                                "the token 'ab' is longer than one character (2 characters)"),
    "two U+FFFD as one token": ("张 O\n\n\ufffd\ufffd O\n", 3, "longer than one character"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_malformed_file_names_the_line(case, write_file):
    content, line, words = BAD_FILES[case]
    path = write_file(content)
    err = read_error(path)
    assert_at(err, path, line)
    assert words in str(err)


def test_non_utf8_bytes_give_line_and_byte_offset(write_file):
    head = "张 B-PER\n三 I-PER\n\n".encode("utf-8")
    path = write_file(head + "北 O\n".encode("gbk"))
    err = read_error(path)
    assert_at(err, path, 4)
    assert f"offset {len(head)} " in err.message
    assert "iconv" in err.fix


def _lm_adapt_text(path):
    from nerkit.tools.resources.lm_adapt import read_lines

    return read_lines([path])


def _select_pool(path):
    from nerkit.tools.annotation.select import read_pool

    return read_pool(path, "text")


def _speed_text(path):
    from nerkit.tools.bench.speed import text_chars

    return text_chars(path)


def _serve_load_text(path):
    from nerkit.tools.bench.serve_load import read_texts

    return read_texts(path)


@pytest.mark.parametrize("read", [_lm_adapt_text, _select_pool, _speed_text, _serve_load_text])
def test_plain_text_inputs_name_their_first_line_that_is_not_utf8(read, write_file):
    """Issue 55: `--text` (lm adapt, distill, bench) and `--pool` said "not UTF-8 text" of the whole
    file; they decode as the corpora do, naming the line, the byte offset and the fix."""
    head = "张三在北京。\n李四\n".encode("utf-8")
    path = write_file(head + "上海\n".encode("gbk") + "王五\n".encode("utf-8"), "texts.txt")
    with pytest.raises(CorpusError) as info:
        read(path)
    assert_at(info.value, path, 3)
    assert f"offset {len(head)} " in info.value.message and "iconv" in info.value.fix


def _vectors_text(path):
    from nerkit.tools.resources.vectors import read_texts

    return read_texts(path)


@pytest.mark.parametrize("read", [_lm_adapt_text, _select_pool, _serve_load_text, _vectors_text])
def test_every_plain_text_input_drops_a_byte_order_mark(read, write_file):
    """Issue 56: lm adapt's --text (and distill's, read through it) kept a BOM as the first text's
    first character; every plain-text input reads through records.read_text, which drops it."""
    path = write_file("\ufeff张三在北京。\r\n\n李四\n".encode("utf-8"), "texts.txt")
    found = read(path)
    texts = found[0] if isinstance(found, tuple) else found  # read_pool: (texts, keys)
    assert texts == ["张三在北京。", "李四"]
    assert _speed_text(path) == len("张三在北京。李四")


@pytest.mark.parametrize("content, words", [(b"", "empty"), (b"\n\n  \n\t\r\n", "empty"), ("\ufeff\n\n", "no sentences")])
def test_file_without_sentences(content, words, write_file):
    path = write_file(content)
    err = read_error(path)
    assert str(path) in str(err)
    assert words in err.message


def test_missing_file_and_directory(tmp_path):
    assert "no such file" in read_error(tmp_path / "absent.bio").message
    assert "directory" in read_error(tmp_path).message


ACCEPTED = {
    "BOM": "\ufeff张 B-PER\n三 I-PER\n\n在 O\n",
    "CRLF": "张 B-PER\r\n三 I-PER\r\n\r\n在 O\r\n",
    "no final newline": "张 B-PER\n三 I-PER\n\n在 O",
    "extra columns": "张 x 1 B-PER\n三 y 2 I-PER\n\n在 z 3 O\n",
    "tabs": "张\tB-PER\n三\t\tI-PER \n\t\n在\tO\n",
    "blank lines with spaces, several between sentences": "\n张 B-PER\n三 I-PER\n  \n\n\n在 O\n\n\n",
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_accepted_variants(case, write_file):
    corpus = read_corpus(write_file(ACCEPTED[case]))
    assert [s.tokens for s in corpus.sentences] == [["张", "三"], ["在"]]
    assert [s.tags for s in corpus.sentences] == [["B-PER", "I-PER"], ["O"]]
    assert corpus.scheme == "bio"
    assert corpus.types == ["PER"]


def test_full_width_space_is_a_token(write_file):
    corpus = read_corpus(write_file("\u3000 O\n张 B-PER\n\u3000 O\n"))
    assert corpus.sentences[0].tokens == ["\u3000", "张", "\u3000"]
    assert corpus.sentences[0].spans() == [Span(1, 2, "PER")]


def test_a_space_or_tab_token_reads_as_nerkit_predict_writes_it(write_file):
    """`nerkit predict --format conll` writes the character, a space, the tag: `  O` is a space."""
    corpus = read_corpus(write_file("张 B-PER\n  O\n\t O\n三\tO\n \tO\n\t\tO\n   O\n在 O\n\n  O\n"))
    assert [s.tokens for s in corpus.sentences] == [["张", " ", "\t", "三", " ", "\t", " ", "在"], [" "]]
    assert corpus.sentences[0].tags == ["B-PER"] + ["O"] * 7


def test_a_space_token_keeps_the_column_count(write_file):
    corpus = read_corpus(write_file("张 NR B-PER\n  PU O\n"))
    assert corpus.sentences[0].tokens == ["张", " "]
    err = read_error(write_file("张 NR B-PER\n  O\n"))
    assert "expected 3 columns" in err.message


def test_indented_lines_are_not_read_as_space_tokens(write_file):
    """Indentation would make every line start with a space token and shift the columns."""
    path = write_file("  张 B-PER\n  三 I-PER\n")
    err = read_error(path)
    assert_at(err, path, 1)
    assert "indented" in err.message


def test_sentences_record_their_first_line(write_file):
    corpus = read_corpus(write_file("\n张 O\n三 O\n\n\n在 O\n"))
    assert [s.line for s in corpus.sentences] == [2, 6]


# ---------------------------------------------------------------- repair


def test_repair_reads_invalid_transitions_as_conlleval():
    path = FIXTURES / "invalid_transitions.bio"
    assert_at(read_error(path), path, 2)
    corpus = read_corpus(path, repair=True)
    assert [s.spans() for s in corpus.sentences] == [
        [Span(1, 3, "LOC")],  # orphan I-LOC opens an entity
        [Span(0, 1, "PER"), Span(1, 2, "ORG")],  # I-ORG after B-PER opens a new one
    ]
    assert corpus.invalid_transitions == 2
    assert corpus.repaired == 2
    assert corpus.sentences[0].tags == ["O", "B-LOC", "I-LOC", "O"]


def test_a_token_of_several_characters_names_the_repair_of_each_command(write_file):
    path = write_file("张 B-PER\nab O\n")
    assert read_error(path).fix.endswith("its tag spread over them: pass --repair")
    assert read_error(path, repair_option="set data.repair: true").fix.endswith(": set data.repair: true")
    assert_at(read_error(path, strict=False), path, 2)  # `nerkit data stats` refuses it too


SPLIT_TOKENS = {
    # scheme: (file, the characters' tags after repair)
    "bio": ("张 B-PER\nab I-PER\n在 O\ncd B-LOC\n京 I-LOC\nef O\n",
            "B-PER I-PER I-PER O B-LOC I-LOC I-LOC O O"),
    "bioes": ("ab S-PER\n在 O\ncd B-LOC\n北 I-LOC\nef E-LOC\n",
              "B-PER E-PER O B-LOC I-LOC I-LOC I-LOC E-LOC"),
    "bmes": ("ab S-PER\n北 B-LOC\ncd M-LOC\nefg E-LOC\n",
             "B-PER E-PER B-LOC M-LOC M-LOC M-LOC M-LOC E-LOC"),
}


@pytest.mark.parametrize("scheme", SPLIT_TOKENS)
def test_repair_splits_a_token_into_its_characters_keeping_its_entity(write_file, scheme):
    content, tags = SPLIT_TOKENS[scheme]
    corpus = read_corpus(write_file(content), repair=True)
    [sentence] = corpus.sentences
    assert sentence.tokens == [c for line in content.splitlines() for c in line.split()[0]]
    assert sentence.tags == tags.split()
    assert corpus.scheme == scheme and corpus.split_tokens == 3
    assert corpus.invalid_transitions == 0 and corpus.repaired == 0  # a valid file stays valid


@pytest.mark.parametrize("scheme", SCHEMES)
@settings(max_examples=40, suppress_health_check=REUSED_FIXTURE)
@given(length_spans=span_sets().filter(lambda s: s[0] > 0), widths=st.lists(st.integers(1, 3), min_size=40, max_size=40))
def test_repair_of_tokens_of_several_characters_keeps_every_entity(tmp_path, scheme, length_spans, widths):
    """Tokens 1 to 3 characters wide: after the split, each entity covers the characters of its
    tokens, and a valid sequence has no invalid transition."""
    length, spans = length_spans
    tags = spans_to_tags(length, spans, scheme)
    tokens = ["字" * widths[i % len(widths)] for i in range(length)]
    path = tmp_path / f"wide.{scheme}"
    path.write_text("".join(f"{t} {tag}\n" for t, tag in zip(tokens, tags)), encoding="utf-8")
    corpus = read_corpus(path, repair=True)
    starts = [sum(len(t) for t in tokens[:i]) for i in range(length + 1)]
    assert corpus.sentences[0].spans() == [Span(starts[s.start], starts[s.end], s.type) for s in spans]
    assert corpus.invalid_transitions == 0
    assert corpus.split_tokens == sum(len(t) > 1 for t in tokens)


def test_lenient_read_counts_but_keeps_tags():
    corpus = read_corpus(FIXTURES / "invalid_transitions.bio", strict=False)
    assert corpus.invalid_transitions == 2
    assert corpus.repaired == 0
    assert corpus.sentences[0].tags == ["O", "I-LOC", "I-LOC", "O"]


@settings(max_examples=60, suppress_health_check=REUSED_FIXTURE)
@given(st.lists(any_tags("BIO"), min_size=1, max_size=4))
def test_repair_matches_conlleval_on_random_files(tmp_path, tag_lists):
    path = tmp_path / "random.bio"
    path.write_text("".join("".join(f"字 {t}\n" for t in tags) + "\n" for tags in tag_lists), encoding="utf-8")
    corpus = read_corpus(path, repair=True)
    assert [s.spans() for s in corpus.sentences] == [conlleval_bio_spans(tags) for tags in tag_lists]
    changed = sum(a != b for tags, s in zip(tag_lists, corpus.sentences) for a, b in zip(tags, s.tags))
    assert corpus.repaired == changed
    assert (corpus.invalid_transitions > 0) == (changed > 0)
    write_corpus(path, corpus.sentences, corpus.scheme)
    assert read_corpus(path).invalid_transitions == 0  # strict read passes


# ---------------------------------------------------------------- writing and reading back


@pytest.mark.parametrize("to", [*SCHEMES, "jsonl"])
@settings(max_examples=40, suppress_health_check=REUSED_FIXTURE)
@given(sents=sentences())
def test_write_then_read_round_trip(tmp_path, to, sents):
    path = tmp_path / ("out.jsonl" if to == "jsonl" else f"out.{to}")
    write_corpus(path, sents, to)
    back = read_corpus(path)
    assert [s.tokens for s in back.sentences] == [s.tokens for s in sents]
    assert [s.spans() for s in back.sentences] == [s.spans() for s in sents]
    if to == "jsonl":
        assert back.scheme == "bioes"
    else:
        assert back.scheme == detect_scheme([t for s in sents for t in convert_tags(s.tags, to)])
        assert [s.tags for s in back.sentences] == [convert_tags(s.tags, to) for s in sents]


@pytest.mark.parametrize("to", [*SCHEMES, "jsonl"])
def test_a_token_of_several_characters_is_written_in_no_format(tmp_path, to):
    """The reader refuses such a token, so no writer makes a file with one."""
    sents = [Sentence(["New", "York", "市"], ["B-LOC", "I-LOC", "I-LOC"])]
    with pytest.raises(CorpusError, match="'New' is longer than one character"):
        write_corpus(tmp_path / f"a.{to}", sents, to)
    assert not (tmp_path / f"a.{to}").exists()


@pytest.mark.parametrize("token", ["\n", "\x00", ""])
def test_conll_refuses_tokens_it_cannot_hold(tmp_path, token):
    """A line break would end the token's line, NUL would make a binary file of it."""
    with pytest.raises(CorpusError, match="cannot be written"):
        write_corpus(tmp_path / "a.bio", [Sentence(["纽", token, "约"], ["O", "O", "O"], line=3)], "bio")
    assert not (tmp_path / "a.bio").exists()


@pytest.mark.parametrize("to", SCHEMES)
def test_conll_writes_whitespace_tokens_that_read_back(tmp_path, to):
    """A space, a tab and a carriage return are tokens as `nerkit predict --format conll` writes
    them (`  O`), inside entities and between them, and the reader takes them back."""
    text = "New York 的\t王 芳\r。 "
    spans = [Span(0, 8, "LOC"), Span(10, 14, "PER"), Span(14, 16, "ORG")]  # "\t王 芳", "\r。"
    sentences = [Sentence(list(text), spans_to_tags(len(text), spans, to)), Sentence(list("  "), ["O", "O"])]
    write_corpus(tmp_path / "a.txt", sentences, to)
    corpus = read_corpus(tmp_path / "a.txt")
    assert [s.text for s in corpus.sentences] == [text, "  "] and corpus.scheme == to
    assert corpus.sentences[0].spans() == spans


def test_unknown_output_format(tmp_path):
    with pytest.raises(CorpusError, match="unknown output format"):
        write_corpus(tmp_path / "a.txt", [Sentence(["a"], ["O"])], "iob")


@pytest.mark.parametrize("name", ["three_types.bio", "three_types.bmes", "three_types.jsonl"])
def test_fixture_formats_hold_the_same_corpus(name):
    corpus = read_corpus(FIXTURES / name)
    assert [s.text for s in corpus.sentences] == ["张三在北京。", "中国银行见李。"]
    assert [s.spans() for s in corpus.sentences] == [
        [Span(0, 2, "PER"), Span(3, 5, "LOC")],
        [Span(0, 4, "ORG"), Span(5, 6, "PER")],
    ]


JSONL_ERRORS = {
    "not JSON": ('{"text": "张三", "entities": []}\n{"text": \n', 2, "not valid JSON"),
    "no text": ('{"text": "张三", "entities": []}\n\n{"entities": []}\n', 3, 'no "text"'),
    "no entities": ('{"text": "张三", "entities": []}\n{"text": "李四"}\n', 2, 'no "entities" key'),
    "CLUENER's label": ('{"text": "张三", "label": {"name": {"张三": [[0, 1]]}}}\n', 1, 'no "entities" key'),
    "misspelt entities": ('{"text": "张三", "entites": []}\n', 1, 'no "entities" key'),
    "misspelt text": ('{"txt": "张三", "entities": []}\n', 1, 'no "text" string'),
    "unknown entity key": ('{"text": "张三", "entities": [{"start": 0, "end": 2, "typ": "PER"}]}\n', 1,
                           "unknown key 'typ' in an entity; the keys are 'start', 'end', 'type', 'text'"),
    "entity text that is not at its offsets": ('{"text": "张三在北京", "entities": [{"start": 0, "end": 2, "type": "PER", '
                                               '"text": "三在"}]}\n', 1, "'三在' is not the text at 0:2 ('张三')"),
    "bad entity": ('{"text": "张三", "entities": [{"start": 0, "type": "PER"}]}\n', 1, "needs integer start"),
    "outside the text": ('{"text": "张三", "entities": [{"start": 1, "end": 3, "type": "PER"}]}\n', 1, "outside the text"),
    "empty entity": ('{"text": "张三", "entities": [{"start": 1, "end": 1, "type": "PER"}]}\n', 1, "outside the text"),
}


@pytest.mark.parametrize("case", JSONL_ERRORS)
def test_malformed_jsonl_names_the_line(case, write_file):
    content, line, words = JSONL_ERRORS[case]
    path = write_file(content, "bad.jsonl")
    err = read_error(path)
    assert_at(err, path, line)
    assert words in err.message


def test_jsonl_keeps_a_record_s_other_keys_through_conversion_to_jsonl(write_file, tmp_path):
    """Issue 55: a corpus line with an id or metadata was "unknown key 'doc'" on every line. Other
    keys are kept with the sentence, written back by JSON lines (a flat projection too), and left
    out of a tag scheme's file."""
    import json

    records = [{"doc": 12, "text": "张三在北京", "entities": [{"start": 0, "end": 2, "type": "PER"}],
                "meta": {"source": "新闻", "page": 3}},
               {"id": "b", "text": "北京大学", "entities": [{"start": 0, "end": 2, "type": "LOC"},
                                                         {"start": 0, "end": 4, "type": "ORG"}]},
               {"text": "李四", "entities": []}]
    path = write_file("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "ids.jsonl")
    corpus = read_corpus(path)
    assert [s.extra for s in corpus.sentences] == [{"doc": 12, "meta": {"source": "新闻", "page": 3}}, {"id": "b"}, None]
    write_corpus(tmp_path / "out.jsonl", corpus.sentences, "jsonl", path)
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert written == records
    flat = read_corpus(path, flat="outer")
    write_corpus(tmp_path / "flat.jsonl", flat.sentences, "jsonl", path)
    assert [s.extra for s in read_corpus(tmp_path / "flat.jsonl").sentences] == [s.extra for s in corpus.sentences]
    write_corpus(tmp_path / "out.bio", flat.sentences, "bio", path)
    assert [s.spans() for s in read_corpus(tmp_path / "out.bio").sentences] == [s.spans() for s in flat.sentences]


def entities(*spans: tuple[int, int, str]) -> str:
    return ", ".join(f'{{"start": {s}, "end": {e}, "type": "{t}"}}' for s, e, t in spans)


# Issue 41: a record with several overlaps named its first alone (issue 45: now kept). 0:6 holds 1:3 and 4:6 (nested),
# 4:6 and 5:8 overlap, and 9:10 overlaps nothing.
SEVERAL_OVERLAPS = ('{"text": "中华人民共和国国务院总理", "entities": [' +
                    entities((0, 6, "ORG"), (1, 3, "LOC"), (4, 6, "LOC"), (5, 8, "ORG"), (9, 10, "PER")) + "]}\n")


def test_every_overlap_of_a_record_is_kept(write_file):
    """Issue 45: overlapping entities were refused; they are nested data, kept as written."""
    corpus = read_corpus(write_file(SEVERAL_OVERLAPS, "nested.jsonl"))
    assert corpus.sentences[0].spans() == [Span(0, 6, "ORG"), Span(1, 3, "LOC"), Span(4, 6, "LOC"), Span(5, 8, "ORG"),
                                           Span(9, 10, "PER")]
    assert corpus.dropped_overlaps == 0 and corpus.sentences[0].nested


def test_repair_keeps_the_longest_of_each_overlap_and_the_earliest_of_equal_ones(write_file):
    corpus = read_corpus(write_file(SEVERAL_OVERLAPS, "bad.jsonl"), repair=True)
    assert corpus.sentences[0].spans() == [Span(0, 6, "ORG"), Span(9, 10, "PER")]
    assert corpus.dropped_overlaps == 3
    # Of equal lengths the earliest: 0:2 before 1:3, whose character 1 it took; 2:4 is then free, 3:5 not.
    ties = '{"text": "张三丰李四王", "entities": [' + entities((1, 3, "B"), (0, 2, "A"), (2, 4, "C"), (3, 5, "D")) + "]}\n"
    corpus = read_corpus(write_file(ties, "ties.jsonl"), repair=True)
    assert corpus.sentences[0].spans() == [Span(0, 2, "A"), Span(2, 4, "C")] and corpus.dropped_overlaps == 2
    # The same rule in every format of offsets (CLUENER's ends are inclusive).
    cluener = '{"text": "叶老桂博士", "label": {"name": {"叶老桂": [[0, 2]]}, "title": {"桂博士": [[2, 4]], "博士": [[3, 4]]}}}\n'
    corpus = read_corpus(write_file(cluener, "c.json"), fmt="cluener", repair=True)
    assert corpus.sentences[0].spans() == [Span(0, 3, "name"), Span(3, 5, "title")] and corpus.dropped_overlaps == 1


def test_cluener_label_in_jsonl_names_the_converter(write_file):
    err = read_error(write_file(JSONL_ERRORS["CLUENER's label"][0], "bad.jsonl"))
    assert "--from cluener" in err.fix


CLUENER = ('{"text": "浙商银行企业信贷部叶老桂博士", "label": {"name": {"叶老桂": [[9, 11]]}, "company": {"浙商银行": [[0, 3]]}}}\n'
           '{"id": 7, "text": "没有实体", "label": {}}\n'
           '{"text": "北京北京", "label": {"address": {"北京": [[0, 1], [2, 3], [0, 1]]}}}\n')


def test_cluener_records_become_spans_with_exclusive_ends(write_file):
    corpus = read_corpus(write_file(CLUENER, "train.json"), fmt="cluener")
    assert [s.text for s in corpus.sentences] == ["浙商银行企业信贷部叶老桂博士", "没有实体", "北京北京"]
    assert [s.spans() for s in corpus.sentences] == [
        [Span(0, 4, "company"), Span(9, 12, "name")], [], [Span(0, 2, "address"), Span(2, 4, "address")]]
    assert corpus.format == "cluener" and corpus.labels == "spans" and corpus.types == ["address", "company", "name"]
    assert [s.line for s in corpus.sentences] == [1, 2, 3]


CLUENER_ERRORS = {
    "mention not at its place": ('{"text": "叶老桂博士", "label": {"name": {"叶老桂": [[1, 3]]}}}', "name '叶老桂' is not the text "
                                 "at [1, 3] ('老桂博')"),
    "exclusive end": ('{"text": "叶老桂博士", "label": {"name": {"叶老桂": [[0, 3]]}}}', "is not the text at [0, 3]"),
    "outside the text": ('{"text": "叶老桂", "label": {"name": {"叶老桂": [[0, 3]]}}}', "outside the text of 3 characters"),
    "places not pairs": ('{"text": "叶老桂", "label": {"name": {"叶老桂": [0, 2]}}}', "not a list of [start, end] integer pairs"),
    "no label": ('{"id": 0, "text": "叶老桂"}', 'no "label" key'),
    "unknown key": ('{"text": "叶老桂", "labels": {}}', "unknown key 'labels'; the keys are 'id', 'text', 'label'"),
}


@pytest.mark.parametrize("case", CLUENER_ERRORS)
def test_malformed_cluener_names_the_line(case, write_file):
    record, words = CLUENER_ERRORS[case]
    path = write_file('{"text": "张三", "label": {}}\n' + record + "\n", "dev.json")
    err = read_error(path, fmt="cluener")
    assert_at(err, path, 2)
    assert words in err.message and err.fix


@pytest.mark.parametrize("content, suggestion", [
    ('{"text": "张三", "entites": []}\n', "rename 'entites' to 'entities' (a record's other keys are kept as they are)"),
    ('{"text": "张三", "entities": [{"start": 0, "end": 2, "tpye": "PER"}]}\n', "did you mean 'type'?"),
    ('{"txt": "张三", "entities": []}\n', "rename 'txt' to 'text' (a record's other keys are kept as they are)"),
    ('{"text": "张三", "label": {"name": {"张三": [[0, 1]]}}}\n', "this looks like CLUENER's format: convert it with "
                                                            "`nerkit data convert IN OUT --from cluener --to jsonl`"),
    ('{"text": "张三", "label": [[0, 2, "PER"]]}\n', "this looks like doccano's format: convert it with "
                                                 "`nerkit data convert IN OUT --from doccano --to jsonl`"),
])
def test_a_misspelt_jsonl_key_gets_the_closest_one(write_file, content, suggestion):
    """Issue 55: a record's other keys are kept, so a misspelt "text" or "entities" is caught as that
    key missing, the fix naming the record's key that looks like it (or the format whose keys it has)."""
    err = read_error(write_file(content, "bad.jsonl"))
    assert err.fix == suggestion


def test_jsonl_reads_what_nerkit_predict_writes(write_file):
    """Entities as `nerkit predict` writes them carry their text: a known key, checked."""
    path = write_file('{"text": "张三在北京", "entities": [{"start": 0, "end": 2, "type": "PER", "text": "张三"}]}\n'
                      '{"text": "", "entities": []}\n', "pred.jsonl")
    corpus = read_corpus(path)
    assert [s.spans() for s in corpus.sentences] == [[Span(0, 2, "PER")], []]


def test_jsonl_has_spans_not_a_tag_scheme():
    from nerkit.data.corpus import scheme_label
    from nerkit.data.stats import format_stats

    corpus = read_corpus(FIXTURES / "three_types.jsonl")
    assert corpus.labels == "spans" and scheme_label(corpus.labels) == "spans (JSON lines)"
    assert corpus_stats(FIXTURES / "three_types.jsonl")["scheme"] == "spans"
    assert "scheme        spans (JSON lines)" in format_stats(corpus_stats(FIXTURES / "three_types.jsonl"))
    assert read_corpus(FIXTURES / "three_types.bmes").labels == "bmes"


def test_max_errors_reads_on_and_lists_the_first_errors_by_line(write_file):
    """Line errors are found before the tag transitions (those need the file's scheme), yet the
    list is in line order; a bad line's sentence is not checked for transitions."""
    from nerkit.errors import ManyErrors

    path = write_file("在 O\n京 I-LOC\n\n" * 3 + "李 O\n四\n五 I-PER\n\n" + "在 O\n京 I-LOC\n\n" * 2)
    with pytest.raises(ManyErrors) as info:
        read_corpus(path, max_errors=4)
    assert [e.where for e in info.value.errors] == [f"{path}:{n}" for n in (2, 5, 8, 11)]
    assert info.value.total == 6  # 5 transitions (none in the sentence of line 11) and line 11
    assert_at(read_error(path), path, 11)  # by default the first found (a line error) ends the read


def test_repeated_lines_are_read_and_checked_as_the_first(write_file):
    """A line read before is taken as read then (the fast path of a character corpus): every copy
    lands in its sentence with its line number, and a repeated bad line is an error at each place."""
    from nerkit.errors import ManyErrors

    path = write_file("北 B-LOC\n京 E-LOC\n\n" * 3 + "北 B-LOC x\n京 E-LOC\n\n" * 2 + "北 B-LOC\n京 E-LOC\n")
    with pytest.raises(ManyErrors) as info:
        read_corpus(path, max_errors=5)
    assert [e.where for e in info.value.errors] == [f"{path}:10", f"{path}:13"]
    corpus = read_corpus(write_file("北 B-LOC\n京 E-LOC\n\n" * 3, "good.txt"))
    assert [(s.tokens, s.tags, s.line) for s in corpus.sentences] == [
        (["北", "京"], ["B-LOC", "E-LOC"], line) for line in (1, 4, 7)]


def test_a_limited_read_stops_at_its_last_sentence(write_file):
    """`limit` (data.limit): the first sentences as a whole read gives them, and the lines after the
    last are never looked at: a malformed line, an unknown tag, or M- after I- there is no error."""
    from nerkit.data.corpus import _all_lines, _lines

    good = "北 B-LOC\n京 I-LOC\n\n来 O\n\n王 B-PER\n芳 I-PER\n是 O\n\n"
    path = write_file(good)
    whole = [(s.tokens, s.tags, s.line) for s in read_corpus(path).sentences]
    for limit in (1, 2, 3, 4):
        assert [(s.tokens, s.tags, s.line) for s in read_corpus(path, limit=limit).sentences] == whole[:limit]
    bad = write_file(good + "北 B-LOC x y\n京 Q-LOC\n\n张 M-PER\n", "bad.bio")
    with pytest.raises(CorpusError):
        read_corpus(bad)
    corpus = read_corpus(bad, limit=3)
    assert [(s.tokens, s.tags, s.line) for s in corpus.sentences] == whole and corpus.scheme == "bio"
    for text in ("", "a", "a\n", "a\n\n", "ab\ncd\n\nef", "\n\n\nx\n", "abc\n" * 7):
        for chunk in range(1, 6):  # the text split a chunk at a time, as whole
            assert list(_lines(text, chunk)) == _all_lines(text), (text, chunk)


def test_max_errors_in_json_lines(write_file):
    from nerkit.errors import ManyErrors

    path = write_file('{"text": "张三"}\n{"text": "张三", "entities": []}\n{"txt": ""}\n', "bad.jsonl")
    with pytest.raises(ManyErrors) as info:
        read_corpus(path, max_errors=20)
    assert [e.where for e in info.value.errors] == [f"{path}:1", f"{path}:3"] and info.value.total == 2


# ---------------------------------------------------------------- normalisation


def test_normalize_maps_full_width_ascii_to_half_width():
    assert "".join(map(normalize_char, "Ａ１，张ｂ！")) == "A1,张b!"


@pytest.mark.parametrize("ch", ["㈱", "ﬁ", "…", "½"])
def test_normalize_keeps_characters_whose_nfkc_is_longer(ch):
    assert len(unicodedata.normalize("NFKC", ch)) > 1
    assert normalize_char(ch) == ch


@given(st.text())
def test_normalize_keeps_the_length_and_folds_what_it_can(text):
    out = "".join(map(normalize_char, text))
    assert len(out) == len(text)
    for a, b in zip(text, out):
        folded = unicodedata.normalize("NFKC", a)
        assert b == (folded if len(folded) == 1 else a)


# ---------------------------------------------------------------- splitting long sentences

SPLIT_CHARS = list("张三北京中国") + ["。", "！", "，", "、", "a"]
STRONG, WEAK = set("。！？!?；;…"), set("，,、：:）)」』”\"")


@st.composite
def long_sentences(draw) -> Sentence:
    n, spans = draw(span_sets(max_pieces=20).filter(lambda s: s[0] > 0))
    tokens = draw(st.lists(st.sampled_from(SPLIT_CHARS), min_size=n, max_size=n))
    return Sentence(tokens, spans_to_tags(n, spans, "bio"), line=draw(st.integers(0, 50)))


def break_rank(tokens: list[str], p: int) -> int:
    return 0 if tokens[p - 1] in STRONG else 1 if tokens[p - 1] in WEAK else 2


@settings(max_examples=300)
@given(long_sentences(), st.integers(1, 15))
def test_split_sentence_properties(sent, max_len):
    spans = sent.spans()
    starts = cut_points(sent.tokens, max_len, spans)
    pieces = split_sentence(sent, max_len)
    ends = starts[1:] + [len(sent)]
    assert starts[0] == 0 and starts == sorted(set(starts)) and len(pieces) == len(starts)
    assert [len(p) for p in pieces] == [end - start for start, end in zip(starts, ends)]
    # Never inside an entity.
    for cut in starts[1:]:
        assert not any(s.start < cut < s.end for s in spans), (cut, spans)
    # The pieces are the sentence, in order, with their lines.
    assert [t for p in pieces for t in p.tokens] == sent.tokens
    assert [t for p in pieces for t in p.tags] == sent.tags
    for piece, start in zip(pieces, starts):
        assert piece.line == (sent.line + start if sent.line else 0)
    shifted = [Span(s.start + start, s.end + start, s.type) for p, start in zip(pieces, starts) for s in p.spans()]
    assert shifted == spans
    # At most max_len, unless the piece holds an entity longer than that.
    for piece in pieces:
        if len(piece) > max_len:
            assert any(s.end - s.start > max_len for s in piece.spans()), (piece.tokens, piece.tags)
    # The best kind of break in reach is taken: sentence end, then clause break, then any point.
    for start, cut in zip(starts, starts[1:]):
        allowed = [p for p in range(start + 1, start + max_len + 1) if not any(s.start < p < s.end for s in spans)]
        if allowed:
            assert break_rank(sent.tokens, cut) == min(break_rank(sent.tokens, p) for p in allowed)
            if break_rank(sent.tokens, cut) == 2:
                assert cut == max(allowed)


def test_short_sentence_is_not_split():
    sent = Sentence(list("张三。"), ["B-PER", "I-PER", "O"], line=4)
    assert split_sentence(sent, 3) == [sent]
    assert cut_points(sent.tokens, 3) == [0]


def test_split_prefers_the_sentence_end():
    tokens = list("我爱北京。天安门，在这里")  # 。 at 4, ， at 8
    assert cut_points(tokens, 10) == [0, 5]
    assert cut_points(list("我爱北京天安门，在这里看"), 10) == [0, 8]


def test_entity_longer_than_max_len_stays_whole():
    tags = ["O", "B-ORG"] + ["I-ORG"] * 5 + ["O", "O"]
    pieces = split_sentence(Sentence(list("在中国人民银行好的"), tags), 3)
    assert [p.text for p in pieces] == ["在", "中国人民银行", "好的"]


# ---------------------------------------------------------------- statistics


def test_stats_of_a_fixture():
    stats = corpus_stats(FIXTURES / "three_types.bmes")
    assert stats["sentences"] == 2
    assert stats["characters"] == 13
    assert stats["entities"] == {"LOC": 1, "ORG": 1, "PER": 2}
    assert stats["entities_total"] == 4
    assert stats["scheme"] == "bmes"
    assert stats["length"]["max"] == 7
    assert stats["invalid_transitions"] == 0
    assert stats["known_as"] is None


def test_stats_count_invalid_transitions_without_failing():
    assert corpus_stats(FIXTURES / "invalid_transitions.bio")["invalid_transitions"] == 2


# The table of /work/shared/data/README.md, copied by hand: file, scheme, sentences, characters,
# entities per type, longest sentence, sha256.
README_TABLE = [
    ("msra/train_dev.char.bmes", "bmes", 46_364, 2_169_879, {"NR": 17_615, "NS": 36_517, "NT": 20_571}, 581,
     "98a5c331fa6e3e51858a3b9f98ae618b253947aaf7f39f9f51a3a8caa171431e"),
    ("msra/test.char.bmes", "bmes", 4_365, 172_601, {"NR": 1_973, "NS": 2_877, "NT": 1_331}, 1_475,
     "9cebc5ce1ea06477d1230d17be90daafa670e78f07eb628c27103af4a6e6dc3b"),
    ("peopledaily/example.train", "bio", 20_864, 979_180, {"PER": 8_144, "LOC": 16_571, "ORG": 9_277}, 574,
     "fbacf4110b131354270b7ff470c88eb84645f0ed8df30c3e409dde437cb45e70"),
    ("peopledaily/example.dev", "bio", 2_318, 109_870, {"PER": 884, "LOC": 1_951, "ORG": 984}, 568,
     "7d8e6fcd1745e6adcb99d90307d84c3a0f9f8ff5ee6fe62ca27646cb765fc38a"),
    ("peopledaily/example.test", "bio", 4_636, 219_197, {"PER": 1_864, "LOC": 3_658, "ORG": 2_185}, 577,
     "233299005f941a4b055e38aadcf3ee853e44bc1f88166078d3b52b26b77ea362"),
]


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.parametrize("row", README_TABLE, ids=[r[0] for r in README_TABLE])
def test_real_data_stats_match_the_readme(data_root, row):
    name, scheme, n_sentences, n_chars, entities, longest, sha256 = row
    path = data_root / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    stats = corpus_stats(path)
    assert stats["scheme"] == scheme
    assert stats["sentences"] == n_sentences
    assert stats["characters"] == n_chars
    assert stats["entities"] == entities
    assert stats["length"]["max"] == longest
    assert stats["sha256"] == sha256
    assert stats["known_as"]
    assert stats["invalid_transitions"] == 0  # the README: no orphan inside tags in these files
