"""`nerkit lexicon build` and `coverage` (nerkit.features.lexicon_mining, nerkit.tools.resources.lexicon): words
recovered from a text made of known words, scores against a direct count, a coverage report counted
by hand, determinism, and an output file that is never overwritten without --force."""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest

from nerkit.features.lexicon import Lexicon
from nerkit.features.lexicon_mining import TextCodes, discover, is_word_char, score_ngrams

# No two words share a character, so every cross-word n-gram is a fragment to be left out.
VOCABULARY = ["北京", "大学", "心肌梗死", "糖尿病", "阿司匹林", "患者", "治疗", "CT"]


def synthetic_lines(seed: int = 0, lines: int = 200) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(VOCABULARY) for _ in range(rng.randint(3, 12))) + rng.choice("。，；")
            for _ in range(lines)]


def codes_of(lines: list[str]) -> TextCodes:
    text = TextCodes()
    for line in lines:
        text.add_line(line)
    return text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_build_recovers_exactly_the_words_the_text_is_made_of(seed):
    found = discover(codes_of(synthetic_lines(seed)), max_len=6, min_count=5, min_cohesion=2.0, min_freedom=1.0)
    assert sorted(c.word for c in found) == sorted(VOCABULARY)
    assert [c.word for c in found] == [c.word for c in sorted(found, key=lambda c: (-c.score, c.word))]


def naive_scores(lines: list[str], word: str) -> tuple[int, float, float]:
    """(count, cohesion, freedom) by direct counting, term by term as score_ngrams defines them: a
    line's edge is one neighbour symbol, p(x) = count(x) / word characters."""
    flat = "\x00" + "\x00".join(lines) + "\x00"
    n = sum(1 for ch in flat if ch != "\x00" and is_word_char(ch))

    def occurrences(x: str) -> list[int]:
        return [i for i in range(len(flat) - len(x) + 1) if flat[i:i + len(x)] == x]

    def entropy(neighbours: list[str]) -> float:
        total = len(neighbours)
        return -sum(neighbours.count(x) / total * math.log(neighbours.count(x) / total) for x in set(neighbours))

    at = occurrences(word)
    p = {x: len(occurrences(x)) / n for x in [word] + [word[:k] for k in range(1, len(word))]
         + [word[k:] for k in range(1, len(word))]}
    cohesion = min(math.log(p[word] / (p[word[:k]] * p[word[k:]])) for k in range(1, len(word)))
    freedom = min(entropy([flat[i - 1] for i in at]), entropy([flat[i + len(word)] for i in at]))
    return len(at), cohesion, freedom


def test_cohesion_and_freedom_equal_a_direct_count():
    lines = ["甲乙丙甲乙，丙丁甲乙丙", "乙丙丁 甲乙丙甲", "丁丁甲乙。乙丙", "甲乙丙丁甲乙丙丁"]
    scored = score_ngrams(codes_of(lines), max_len=4, min_count=1)
    every = {line[i:j] for line in lines for i in range(len(line)) for j in range(i + 2, min(i + 4, len(line)) + 1)}
    every = {w for w in every if all(is_word_char(c) for c in w)}
    assert {c.word for c in scored} == every
    for candidate in scored:
        count, cohesion, freedom = naive_scores(lines, candidate.word)
        assert candidate.count == count, candidate
        assert candidate.cohesion == pytest.approx(cohesion, abs=1e-9), candidate
        assert candidate.freedom == pytest.approx(freedom, abs=1e-9), candidate


def test_min_count_and_pieces_of_a_longer_word():
    found = {c.word: c for c in discover(codes_of(synthetic_lines(0)), min_count=1, min_cohesion=-100,
                                         min_freedom=-1)}
    assert "心肌梗" not in found and "肌梗死" not in found  # pieces that never occur outside 心肌梗死
    assert all(c.count >= 1 for c in found.values())
    rare = discover(codes_of(synthetic_lines(0, lines=3)), min_count=50, min_cohesion=-100, min_freedom=-1)
    assert rare == []


def test_build_writes_a_word_list_the_lattice_reads_and_is_deterministic(nerkit, write_file, tmp_path):
    text = write_file("\n".join(synthetic_lines(3)) + "\n", "text.txt")
    options = ["--min-count", "5", "--min-cohesion", "2", "--min-freedom", "1"]
    nerkit("lexicon", "build", "--text", str(text), "--out", str(tmp_path / "a.txt"), *options)
    nerkit("lexicon", "build", "--text", str(text), "--out", str(tmp_path / "b.txt"), *options)
    first = (tmp_path / "a.txt").read_bytes()
    assert first == (tmp_path / "b.txt").read_bytes()
    lexicon = Lexicon.from_source(str(tmp_path / "a.txt"))
    assert sorted(lexicon) == sorted(VOCABULARY)
    assert lexicon.freq("糖尿病") == text.read_text().count("糖尿病")


def test_build_refuses_an_existing_file_without_force(nerkit, write_file, tmp_path):
    text = write_file("\n".join(synthetic_lines(0)) + "\n", "text.txt")
    out = write_file("my own words\n", "words.txt")
    refused = nerkit("lexicon", "build", "--text", str(text), "--out", str(out), check=False)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "exists" in refused.stderr and "--force" in refused.stderr
    assert out.read_text() == "my own words\n"
    refused = nerkit("lexicon", "build", "--text", str(text), "--out", str(text), "--force", check=False)
    assert refused.returncode == 2 and "input" in refused.stderr  # never over what it reads
    nerkit("lexicon", "build", "--text", str(text), "--out", str(out), "--force", "--min-cohesion", "2")
    assert "北京\t" in out.read_text()


def test_normalisation_is_the_featurisers():
    text = codes_of(["ＣＴ检查\u3000患者"])
    assert text.normalized("ＣＴ检查\u3000患者") == "CT检查 患者"
    assert "".join(text.chars[c] for c in text.codes) == "CT检查 患者"


CORPUS = "北 B-ORG\n京 I-ORG\n大 I-ORG\n学 I-ORG\n在 O\n北 B-LOC\n京 I-LOC\n\n张 B-PER\n三 I-PER\n去 O\n上 B-LOC\n海 I-LOC\n\n"


def test_coverage_counts_a_corpus_by_hand(nerkit, write_file):
    corpus = write_file(CORPUS, "corpus.bio")
    words = write_file("北京\t3\n大学\n上海\n京大\n三去上\n", "words.txt")
    report = json.loads(nerkit("lexicon", "coverage", str(words), "--data", str(corpus), "--json").stdout)
    assert report["entities"]["total"] == 4 and report["entities"]["held"] == 2
    assert report["entities"]["by_type"] == {"LOC": {"entities": 2, "held": 2, "matched": 2},
                                             "ORG": {"entities": 1, "held": 0, "matched": 0},
                                             "PER": {"entities": 1, "held": 0, "matched": 0}}
    # 北京大学在北京: 北京 京大 大学 北京; 张三去上海: 三去上 上海
    assert report["matches"] == {"total": 6, "exact": 2, "start": 3, "end": 3, "both": 2, "crossing": 1}
    table = nerkit("lexicon", "coverage", str(words), "--data", str(corpus)).stdout
    assert "overall" in table and "cross an entity" in table


def test_coverage_says_what_held_means_and_that_a_lexicon_without_one_character_words_holds_none(nerkit, write_file):
    """Issue 55: "held" was not defined in the output, and a mined lexicon (no word of one character)
    can never hold an entity of one character: the table says so, with their share, its ceiling."""
    corpus = write_file(CORPUS + "京 B-LOC\n是 O\n\n", "corpus.bio")  # a fifth entity, of one character
    words = write_file("北京\n上海\n", "words.txt")
    table = nerkit("lexicon", "coverage", str(words), "--data", str(corpus)).stdout
    assert "held: a gold entity whose text is exactly a word of the lexicon" in table
    assert ("20.00% of entities (1 of 5) are a single character and cannot be held by this lexicon "
            "(it has no single-character words)") in table
    report = json.loads(nerkit("lexicon", "coverage", str(words), "--data", str(corpus), "--json").stdout)
    assert report["entities"]["single_character"] == 1 and report["single_character_words"] == 0
    without = nerkit("lexicon", "coverage", str(words), "--data", str(write_file(CORPUS, "two.bio"))).stdout
    assert "single character" not in without and "held: a gold entity" in without


def test_merge_jieba_appends_its_words_with_their_count_in_the_text(nerkit, write_file, tmp_path):
    text = write_file("\n".join(synthetic_lines(0)) + "\n", "text.txt")
    out = tmp_path / "merged.txt"
    nerkit("lexicon", "build", "--text", str(text), "--out", str(out), "--min-cohesion", "2", "--merge-jieba")
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    words = [word for word, _ in rows]
    assert sorted(words[:len(VOCABULARY)]) == sorted(VOCABULARY)  # the mined words first
    assert len(words) == len(set(words)) and "中华人民共和国" in words
    counts = {word: int(count) for word, count in rows}
    assert counts["中华人民共和国"] == 0 and counts["北京大学"] == text.read_text().count("北京大学")


# ---- from a config's training split ---------------------------------------------------------------

def unique_word(i: int) -> str:
    """Two characters no other sentence has."""
    return chr(0x4E00 + 2 * i) + chr(0x4E01 + 2 * i)


def write_split_corpus(tmp_path, sentences: int = 40, first: int = 0):
    """A JSON-lines corpus whose sentence i is `w。w` with its own word w (an entity, type x), and a
    config that carves 25% of it as dev with a seed."""
    lines = [json.dumps({"text": f"{unique_word(i)}。{unique_word(i)}", "entities": [{"start": 0, "end": 2, "type": "x"}]},
                        ensure_ascii=False) for i in range(first, first + sentences)]
    corpus = tmp_path / f"corpus{first}.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return corpus


def split_config(tmp_path, train, test) -> "Path":
    config = tmp_path / "config.yaml"
    config.write_text(f"data:\n  train: {train}\n  test: {test}\n  dev_split: 0.25\n  split_seed: 5\n"
                      "lexicon:\n  source: words.txt\n", encoding="utf-8")
    return config


def test_build_from_a_config_mines_its_training_split_and_never_a_dev_or_test_line(nerkit, tmp_path):
    from nerkit.config import load_config
    from nerkit.data.splits import read_splits

    train, test = write_split_corpus(tmp_path), write_split_corpus(tmp_path, 10, first=100)
    config = split_config(tmp_path, train, test)
    out = tmp_path / "mined.txt"
    shown = nerkit("lexicon", "build", "--config", str(config), "--out", str(out), "--min-count", "2",
                   "--min-freedom", "0").stdout
    assert "30 training sentences" in shown and "10 dev sentences left out" in shown
    mined = set(Lexicon.from_source(str(out)))
    splits = read_splits(load_config(config))
    assert mined == {s.text[:2] for s in splits.train}  # every training word, and nothing else
    assert not mined & {s.text[:2] for s in splits.dev + splits.test}
    # --set reaches the carve: another seed, another dev split left out
    nerkit("lexicon", "build", "--config", str(config), "--set", "data.split_seed=6", "--out", str(out), "--force",
           "--min-count", "2", "--min-freedom", "0")
    reseeded = read_splits(load_config(config, ["data.split_seed=6"]))
    assert set(Lexicon.from_source(str(out))) == {s.text[:2] for s in reseeded.train} != mined


def test_build_needs_a_text_or_a_config_and_never_writes_over_the_corpus(nerkit, tmp_path):
    refused = nerkit("lexicon", "build", "--out", str(tmp_path / "w.txt"), check=False)
    assert refused.returncode == 2 and "--config" in refused.stderr and "--text" in refused.stderr
    train = write_split_corpus(tmp_path)
    config = split_config(tmp_path, train, write_split_corpus(tmp_path, 10, first=100))
    refused = nerkit("lexicon", "build", "--config", str(config), "--out", str(train), "--force", check=False)
    assert refused.returncode == 2 and "input" in refused.stderr
    assert train.read_text(encoding="utf-8").startswith('{"text"')


def test_coverage_of_a_config_scores_its_dev_and_test_splits(nerkit, tmp_path):
    from nerkit.config import load_config
    from nerkit.data.splits import read_splits

    train, test = write_split_corpus(tmp_path), write_split_corpus(tmp_path, 10, first=100)
    config = split_config(tmp_path, train, test)
    splits = read_splits(load_config(config))
    # The config's word list (relative to where nerkit runs) holds two dev words and one test word.
    words = [splits.dev[0].text[:2], splits.dev[1].text[:2], splits.test[0].text[:2]]
    (tmp_path / "words.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    import os

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        report = json.loads(nerkit("lexicon", "coverage", "--config", str(config), "--json").stdout)
        table = nerkit("lexicon", "coverage", "--config", str(config)).stdout
    finally:
        os.chdir(here)
    assert report["source"] == "words.txt" and report["words"] == 3
    assert report["sha256"] == hashlib.sha256((tmp_path / "words.txt").read_bytes()).hexdigest()
    dev, test = report["coverage"]["dev"], report["coverage"]["test"]
    assert (dev["sentences"], dev["entities"]["total"], dev["entities"]["held"]) == (10, 10, 2)
    assert dev["matches"] == {"total": 4, "exact": 2, "start": 2, "end": 2, "both": 2, "crossing": 0}  # w。w
    assert (test["sentences"], test["entities"]["held"], test["matches"]["total"]) == (10, 1, 2)
    assert "dev split" in table and "test split" in table and table.count("held: a gold entity") == 1
    refused = nerkit("lexicon", "coverage", "jieba", "--config", str(config), "--data", str(test), check=False)
    assert refused.returncode == 2 and "one of --data" in refused.stderr
