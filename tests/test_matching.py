"""Tests for nerkit.data.matching: the greedy longest match against a brute-force reference, how a
dictionary is read (word lists, `nerkit lexicon build`'s lists, labelled corpora, --map) and how a
string with two types is settled, `nerkit data match` end to end and its errors, DSNER's ds_pa.bio
reproduced from its dictionaries, and `hide_entities`."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from nerkit.data.corpus import read_corpus
from nerkit.data.matching import Matcher, hide_entities, mark, read_dictionary
from nerkit.data.records import Sentence
from nerkit.data.tags import Span, spans_to_tags


def naive_matches(text: str, words: dict[str, str | None]) -> list[tuple[int, int, str | None]]:
    """The rule as stated, by brute force: from the left, at each position try every end from the
    text's last character back, take the first string of the dictionary, go on after it."""
    found, i = [], 0
    while i < len(text):
        for end in range(len(text), i, -1):
            if text[i:end] in words:
                found.append((i, end, words[text[i:end]]))
                i = end
                break
        else:
            i += 1
    return found


def test_the_matcher_is_the_brute_force_longest_leftmost_match_on_random_texts():
    rng = random.Random(0)
    for _ in range(500):
        alphabet = "abcd"[:rng.randint(1, 4)]
        words = {"".join(rng.choices(alphabet, k=rng.randint(1, 5))): rng.choice(["PER", "LOC", None])
                 for _ in range(rng.randint(1, 8))}
        text = "".join(rng.choices(alphabet + "x", k=rng.randint(0, 30)))
        assert Matcher(words).find(text) == naive_matches(text, words), (text, words)


def test_the_leftmost_match_wins_over_a_longer_later_one_and_the_longest_at_a_place():
    words = {"张三": "PER", "三丰收": "ORG", "中": "LOC", "中国": "LOC", "中国人民银行": "ORG"}
    assert Matcher(words).find("张三丰收") == [(0, 2, "PER")]
    assert Matcher(words).find("中国人民银行和中国") == [(0, 6, "ORG"), (7, 9, "LOC")]


def sentence(text: str, spans=(), **kwargs) -> Sentence:
    return Sentence(list(text), spans_to_tags(len(text), list(spans), "bio"), **kwargs)


def test_mark_leaves_the_rest_unknown_or_o_and_keeps_each_sentence_s_place():
    texts = [sentence("我见张三和李四", [Span(0, 1, "PER")], line=3, document=1, extra={"id": 7})]
    matcher = Matcher({"张三": "PER", "李四": "PER"})
    marked, summary = mark(texts, matcher)
    [sent] = marked
    assert sent.spans() == [Span(2, 4, "PER"), Span(5, 7, "PER")]  # the text's own labels are ignored
    assert sent.unknown == [(0, 2), (4, 5)]
    assert (sent.line, sent.document, sent.extra) == (3, 1, {"id": 7})
    assert (summary.sentences, summary.characters, summary.known, summary.entities) == (1, 7, 4, {"PER": 2})
    [naive], summary = mark(texts, matcher, rest="o")
    assert naive.unknown is None and naive.spans() == sent.spans() and summary.known == 7


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_string_with_two_types_is_matched_but_left_unknown_and_counted(tmp_path):
    people = write(tmp_path, "people.txt", "张三\n李四\n")
    places = write(tmp_path, "places.txt", "李四\n张三丰\n")
    dictionary = read_dictionary([f"{people}:PER", f"{places}:LOC"])
    words = dictionary.words()
    assert words == {"张三": "PER", "李四": None, "张三丰": "LOC"}
    marked, summary = mark([sentence("李四和张三丰")], Matcher(words))
    assert marked[0].spans() == [Span(3, 6, "LOC")]
    assert marked[0].unknown == [(0, 3)]  # 李四 is unknown, and nothing inside it is marked
    assert summary.ambiguous == {"李四"} and summary.ambiguous_places == 1
    assert dictionary.words("majority")["李四"] is None  # one vote each: a tie stays unknown


def test_majority_takes_the_type_a_corpus_gives_a_string_most_often(tmp_path):
    corpus = write(tmp_path, "gold.jsonl", "".join(json.dumps({"text": "中国中国中国", "entities": [
        {"start": 0, "end": 2, "type": "NS"}, {"start": 2, "end": 4, "type": "NS"},
        {"start": 4, "end": 6, "type": "NT"}]}) + "\n"))
    dictionary = read_dictionary([str(corpus)], {"NS": "LOC", "NT": "ORG"})
    assert dictionary.votes["中国"] == Counter({"LOC": 2, "ORG": 1})
    assert dictionary.words()["中国"] is None
    assert dictionary.words("majority")["中国"] == "LOC"


def test_word_lists_lexicon_lists_and_corpora_are_dictionaries(tmp_path):
    typed = write(tmp_path, "typed.txt", "# a comment\n\n北京\tLOC\n新华社\tORG\nPUNG MUN LOON\tPER\n")
    # `nerkit lexicon build`'s `word<TAB>count`, under Lexicon.save's header
    lexicon = write(tmp_path, "lexicon.txt", "# nerkit lexicon: 2 words, sha256 00\n上海\t12\n广州\t0\n")
    bmes = write(tmp_path, "gold.bmes", "王 B-NR\n五 E-NR\n在 O\n京 S-NS\n\n")
    dictionary = read_dictionary([str(typed), f"{lexicon}:LOC", str(bmes)], {"NR": "PER"})
    assert dictionary.words() == {"北京": "LOC", "新华社": "ORG", "PUNG MUN LOON": "PER", "上海": "LOC",
                                  "广州": "LOC", "王五": "PER"}
    assert dictionary.skipped == {"京"} and dictionary.types == {"LOC", "ORG", "PER", "NR", "NS"}
    assert read_dictionary([str(bmes)], min_length=1).words() == {"王五": "NR", "京": "NS"}
    only = read_dictionary([str(bmes)], {"NR": "PER"}, only_mapped=True, min_length=1)
    assert only.words() == {"王五": "PER"} and only.unmapped == {"京"}


def test_hide_entities_removes_exactly_the_rounded_fraction_seeded_and_leaves_the_rest():
    rng = random.Random(1)
    sentences = []
    for line in range(40):
        spans = [Span(i, i + 2, rng.choice(["PER", "LOC"])) for i in range(0, 12, 3) if rng.random() < 0.6]
        sentences.append(sentence("甲乙丙丁戊己庚辛壬癸子丑", spans, line=line + 1))
    before = [(s.tags[:], s.spans()) for s in sentences]
    total = sum(len(s.spans()) for s in sentences)
    for fraction in (0.0, 0.25, 0.5, 1.0):
        hidden = hide_entities(sentences, fraction, seed=3)
        kept = [set(h.spans()) for h in hidden]
        assert total - sum(map(len, kept)) == round(fraction * total)
        assert all(k <= set(s.spans()) for k, s in zip(kept, sentences))  # only removals
        for h, s, k in zip(hidden, sentences, kept):
            assert h.tags == spans_to_tags(len(s), sorted(k, key=lambda x: x.start), "bio")  # the removed are O
            assert h is s or h.spans() != s.spans()  # a sentence that loses none is returned as it is
            assert (h.line, h.tokens) == (s.line, s.tokens)
    assert [(s.tags, s.spans()) for s in sentences] == before  # the input is not changed
    assert hide_entities(sentences, 0.3, seed=5) == hide_entities(sentences, 0.3, seed=5)
    assert hide_entities(sentences, 0.3, seed=5) != hide_entities(sentences, 0.3, seed=6)


def test_hide_entities_rebuilds_a_nested_sentence_from_the_entities_kept():
    from nerkit.data.records import span_sentence

    nested = span_sentence("北京大学医院", [Span(0, 2, "LOC"), Span(0, 4, "ORG"), Span(0, 6, "ORG")], 1)
    one = hide_entities([nested], 1 / 3, seed=0)[0]
    assert len(one.spans()) == 2 and set(one.spans()) < set(nested.spans())
    assert hide_entities([nested], 1.0, seed=0)[0].spans() == []
    with pytest.raises(ValueError):
        hide_entities([nested], 1.5, seed=0)


# ---------------------------------------------------------------------------------------------
# The command


def test_match_writes_jsonl_and_conll_with_the_unknown_regions(nerkit, tmp_path):
    names = write(tmp_path, "names.txt", "张三\n李四\t0\n")
    places = write(tmp_path, "places.txt", "北京\tLOC\n")
    text = write(tmp_path, "text.txt", "张三去北京\n\n没有名字\n李四\n")
    out = tmp_path / "out.jsonl"
    result = nerkit("data", "match", "--dict", f"{names}:PER", "--dict", places, "--text", text, "--out", out)
    assert result.stdout == (f"3 dictionary strings; 3 sentences, 11 characters: matched LOC 1, PER 2; 0 ambiguous "
                             f"strings (0 places) left unmarked; 54.5% of characters known; wrote {out}\n")
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records == [
        {"text": "张三去北京", "unknown": [[2, 3]],
         "entities": [{"start": 0, "end": 2, "type": "PER"}, {"start": 3, "end": 5, "type": "LOC"}]},
        {"text": "没有名字", "entities": [], "unknown": [[0, 4]]},
        {"text": "李四", "entities": [{"start": 0, "end": 2, "type": "PER"}]},
    ]
    conll = tmp_path / "out.bio"
    nerkit("data", "match", "--dict", f"{names}:PER", "--dict", places, "--text", text, "--out", conll)
    assert conll.read_text(encoding="utf-8").split("\n\n")[0].split("\n") == [
        "张 B-PER", "三 I-PER", "去 UNK", "北 B-LOC", "京 I-LOC"]
    again = read_corpus(conll).sentences
    assert [s.unknown for s in again] == [[(2, 3)], [(0, 4)], None]
    naive = tmp_path / "naive.bioes"
    nerkit("data", "match", "-d", f"{names}:PER", "-t", text, "-o", naive, "--rest", "o", "--to", "bioes")
    assert naive.read_text(encoding="utf-8").split("\n\n")[0].split("\n") == [
        "张 B-PER", "三 E-PER", "去 O", "北 O", "京 O"]


def test_match_keeps_a_corpus_s_sentences_and_ignores_its_labels(nerkit, tmp_path):
    gold = write(tmp_path, "gold.bio", "张 B-PER\n三 I-PER\n\n-DOCSTART- O\n\n去 O\n北 B-LOC\n京 I-LOC\n\n")
    out = tmp_path / "out.jsonl"
    nerkit("data", "match", "--dict", f"{write(tmp_path, 'd.txt', '北京')}:GPE", "--text", gold, "--out", out)
    marked = read_corpus(out).sentences
    assert [(s.text, s.spans(), s.unknown, s.document) for s in marked] == [
        ("张三", [], [(0, 2)], 0), ("去北京", [Span(1, 3, "GPE")], [(0, 1)], 1)]


@pytest.mark.parametrize("case, args, where, words", [
    ("missing file", ["--dict", "{tmp}/absent.txt:PER"], "{tmp}/absent.txt", "no such file"),
    ("empty dictionary", ["--dict", "{tmp}/empty.txt:PER"], "{tmp}/empty.txt", "the dictionary is empty"),
    ("only short strings", ["--dict", "{tmp}/short.txt:PER"], "{tmp}/short.txt",
     "the dictionary is empty (left out: 1 shorter than 2 characters)"),
    ("a word without a type", ["--dict", "{tmp}/names.txt"], "{tmp}/names.txt:2", "the word '张三' has no type"),
    ("three columns", ["--dict", "{tmp}/bad.txt:PER"], "{tmp}/bad.txt:3", "expected `word` or `word<TAB>TYPE`"),
    ("a --map without =", ["--dict", "{tmp}/names.txt:PER", "--map", "NR"], None, "--map NR: expected OLD=NEW"),
    ("a --map of no type", ["--dict", "{tmp}/names.txt:PER", "--map", "NR=PER"], None,
     "--map NR=PER: no dictionary has the type NR (their types: PER)"),
    ("a type on a corpus", ["--dict", "{tmp}/gold.bio:PER"], None, "a labelled corpus gives its entities their own"),
    ("writing over the text", ["--dict", "{tmp}/names.txt:PER", "--out", "{tmp}/text.txt"], "{tmp}/text.txt",
     "is the input file"),
    ("writing over a dictionary", ["--dict", "{tmp}/names.txt:PER", "--out", "{tmp}/names.txt"], "{tmp}/names.txt",
     "is the input file"),
])
def test_match_errors_are_one_line_naming_the_file_and_the_fix(nerkit, tmp_path, case, args, where, words):
    write(tmp_path, "empty.txt", "# nothing\n\n")
    write(tmp_path, "short.txt", "张\n")
    write(tmp_path, "names.txt", "# names\n张三\n")
    write(tmp_path, "bad.txt", "张三\n李四\n王五\tPER\tx\n")
    write(tmp_path, "gold.bio", "张 B-PER\n三 I-PER\n\n")
    write(tmp_path, "text.txt", "张三\n")
    args = [a.format(tmp=tmp_path) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out.jsonl")]
    result = nerkit("data", "match", "--text", tmp_path / "text.txt", *args, check=False)
    assert result.returncode == 2, result
    prefix = "nerkit: error: " + (f"{where.format(tmp=tmp_path)}: " if where else "")
    assert result.stderr.startswith(prefix) and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "; " in result.stderr  # one line, with its fix
    assert not (tmp_path / "out.jsonl").exists()
    assert (tmp_path / "text.txt").read_text(encoding="utf-8") == "张三\n"


def test_ds_pa_is_the_dsner_dictionaries_matched_on_its_own_text(data_root, tmp_path):
    """DSNER's ds_pa.bio (Yang et al. 2018) marks its two person dictionaries' matches: matching both on its
    text gives its 4,475 entities, all identical; person.dict alone finds 4,113 of them and nothing else."""
    news = data_root / "dsner-news"
    gold = read_corpus(news / "ds_pa.bio").sentences
    both = [news / "person.dict", news / "additional-names.dict"]
    for dicts, found in (([news / "person.dict"], 4113), (both, 4475)):
        marked, _ = mark(gold, Matcher(read_dictionary([f"{d}:PER" for d in dicts]).words()))
        pairs = [(set(g.spans()), set(m.spans())) for g, m in zip(gold, marked)]
        assert sum(len(g & m) for g, m in pairs) == found
        assert sum(len(g - m) for g, m in pairs) == 4475 - found
        assert sum(len(m - g) for g, m in pairs) == 0
    assert [g.unknown for g in gold] == [m.unknown for m in marked]  # the same characters unknown
