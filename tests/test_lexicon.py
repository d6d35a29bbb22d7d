"""Tests for nerkit.features.lexicon: reading word lists, matching (both backends against brute force) and
FLAT lattices with their word cap."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nerkit.features.lexicon as lexicon_module
from nerkit.errors import UserError
from nerkit.features.lexicon import Lexicon, build_lattice

BACKENDS = ["ahocorasick", "trie"]
needs_ahocorasick = pytest.mark.skipif(lexicon_module.ahocorasick is None,
                                       reason="pyahocorasick not installed")


def brute_force_matches(text: str, words: set[str]) -> list[tuple[int, int, str]]:
    return [
        (start, end, text[start:end])
        for start in range(len(text))
        for end in range(start + 2, len(text) + 1)
        if text[start:end] in words
    ]


def backend_param(name: str):
    return pytest.param(name, marks=needs_ahocorasick) if name == "ahocorasick" else name


# ---- jieba ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_jieba_dict_is_read_without_importing_jieba():
    # A fresh interpreter: other tests (or plugins) may have imported jieba into this one.
    script = textwrap.dedent(
        """
        import json, sys
        from nerkit.features.lexicon import Lexicon
        lexicon = Lexicon.from_jieba()
        print(json.dumps({
            "imported": "jieba" in sys.modules,
            "size": len(lexicon),
            "common": ["中国" in lexicon, "北京" in lexicon],
            "single_chars": sum(len(word) < 2 for word in lexicon),
            "freq": lexicon.freq("中国"),
            "matches": lexicon.match("北京是中国的首都"),
        }))
        """
    )
    repo = Path(lexicon_module.__file__).parents[1]  # importable even when nerkit is not installed
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                            cwd=repo)
    report = json.loads(result.stdout)
    assert report["imported"] is False
    assert result.stderr == ""  # jieba's import would print "Building prefix dict..."
    assert report["size"] > 300_000
    assert report["common"] == [True, True]
    assert report["single_chars"] == 0
    assert report["freq"] > 1000
    assert [0, 2, "北京"] in report["matches"] and [3, 5, "中国"] in report["matches"]
    assert [6, 8, "首都"] in report["matches"]


def test_missing_jieba_is_a_user_error(monkeypatch):
    real_find_spec = lexicon_module.importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "jieba" else real_find_spec(name, *args)

    monkeypatch.setattr(lexicon_module.importlib.util, "find_spec", find_spec)
    with pytest.raises(UserError, match="jieba is not installed") as caught:
        Lexicon.from_jieba()
    assert "pip install jieba" in caught.value.fix


# ---- word lists -----------------------------------------------------------------------------------


def test_word_list(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text(
        "\ufeff# a comment\n"
        "#\n"
        "\n"
        "北京\t120\n"
        "中国 300 ns\n"  # jieba user-dict style: the part-of-speech column is ignored
        "首都\n"
        "北京 90\n"  # repeated: the larger frequency wins
        "#话题\n"  # a hashtag word, not a comment
        "京\t5\n",  # one character: below min_len
        encoding="utf-8",
    )
    lexicon = Lexicon.from_word_list(path)
    assert list(lexicon) == sorted(["北京", "中国", "首都", "#话题"])
    assert [lexicon.freq(w) for w in ("北京", "中国", "首都")] == [120, 300, None]
    assert lexicon.has_frequencies
    assert lexicon.source == str(path)


@pytest.mark.parametrize("count", ["lots", "1.5", "-3", "²"])
def test_word_list_with_a_bad_frequency_names_the_line(tmp_path, count):
    path = tmp_path / "words.txt"
    path.write_text(f"北京 12\n中国 {count}\n", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        Lexicon.from_word_list(path)
    assert caught.value.where == f"{path}:2"


def test_unreadable_files_are_user_errors(tmp_path):
    with pytest.raises(UserError) as caught:
        Lexicon.from_word_list(tmp_path / "missing.txt")
    assert caught.value.where == str(tmp_path / "missing.txt")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("北京\n".encode() + "café\n".encode("latin-1"))
    with pytest.raises(UserError, match="UTF-8") as caught:
        Lexicon.from_word_list(latin1)
    assert caught.value.where == f"{latin1}:2"


# ---- word2vec vocabularies ------------------------------------------------------------------------


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("gzipped", [True, False])
def test_vector_vocabulary(tmp_path, header, gzipped):
    # Trailing spaces as in ctb.50d.vec; `</s>` is a word too (it never matches Chinese text).
    lines = ["北京 0.1 -0.2 3e-4 ", "中国 1 2 3", "</s> 0 0 0", "的 0.5 0.5 0.5"]
    text = "\n".join(([f"{len(lines)} 3"] if header else []) + lines) + "\n"
    path = tmp_path / ("ctb.vec.gz" if gzipped else "ctb.vec")
    path.write_bytes(gzip.compress(text.encode()) if gzipped else text.encode())
    lexicon = Lexicon.from_vectors(path)
    assert list(lexicon) == sorted(["北京", "中国", "</s>"])
    assert not lexicon.has_frequencies


@pytest.mark.parametrize("gzipped", [True, False])
def test_a_binary_word2vec_file_is_a_lexicon_source(tmp_path, gzipped):
    """Issue 41: the file that worked as embeddings.word_vectors was told to "convert to UTF-8" as
    lexicon.source; both now go through one reader (nerkit.data.word2vec)."""
    import numpy as np

    words = ["北京", "中国", "北京", "的"]  # a repeated word keeps its first record
    records = b"".join(w.encode() + b" " + np.arange(3, dtype="<f4").tobytes() + b"\n" for w in words)
    data = f"{len(words)} 3\n".encode() + records
    path = tmp_path / "w2v.bin"
    path.write_bytes(gzip.compress(data) if gzipped else data)
    for lexicon in (Lexicon.from_source(str(path)), Lexicon.from_vectors(path)):
        assert list(lexicon) == sorted(["北京", "中国"])
    path.write_bytes(data[: len(data) - 8])  # cut inside the last record
    with pytest.raises(UserError, match="the file ends at record 4"):
        Lexicon.from_source(str(path))


def test_the_lexicon_reads_vectors_with_the_vectors_reader():
    source = Path(lexicon_module.__file__).read_text(encoding="utf-8")
    assert "from nerkit.data.word2vec import" in source
    assert "def _read_vector" not in source and "_looks_like_vectors" not in source


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("北京 0.1 0.2\n中国 0.3\n", 2),  # a column missing
        ("2 2\n北京 0.1 0.2\n中国 0.3 0.4 0.5\n", 3),  # more columns than the header says
        ("北京 0.1 0.2\n中国 0.3 x\n", 2),  # not a number
        ("北京\n", 1),  # a word list, not vectors
        ("3 2\n北京 0.1 0.2\n中国 0.3 0.4\n", 1),  # truncated: fewer vectors than announced
    ],
)
def test_malformed_vector_file_names_the_line(tmp_path, content, where):
    path = tmp_path / "bad.vec"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError) as caught:
        Lexicon.from_vectors(path)
    assert caught.value.where == f"{path}:{where}"
    assert caught.value.fix


def test_truncated_gzip_is_a_user_error(tmp_path):
    path = tmp_path / "cut.vec.gz"
    whole = gzip.compress("".join(f"词{i} {i / 7:.6f} {i / 3:.6f}\n" for i in range(2000)).encode())
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="gzip"):
        Lexicon.from_vectors(path)


# ---- filters --------------------------------------------------------------------------------------


def test_length_and_frequency_filters():
    words = {"京": 9, "北京": 1, "中国": 50, "北京市": None, "中华人民共和国": 7, "有 空": 3}
    assert set(Lexicon(words)) == {"北京", "中国", "北京市", "中华人民共和国"}  # no spaces, no single chars
    assert set(Lexicon(words, min_len=3)) == {"北京市", "中华人民共和国"}
    assert set(Lexicon(words, max_len=3)) == {"北京", "中国", "北京市"}
    # A word without a frequency (北京市) passes min_freq.
    assert set(Lexicon(words, min_freq=5)) == {"中国", "北京市", "中华人民共和国"}
    assert set(Lexicon(["北京", "上海"], min_freq=5)) == {"北京", "上海"}


@pytest.mark.parametrize("filters", [{"min_len": 1}, {"min_len": 4, "max_len": 3}, {"min_freq": -1}])
def test_bad_filters_are_user_errors(filters):
    with pytest.raises(UserError):
        Lexicon(["北京"], **filters)


# ---- matching -------------------------------------------------------------------------------------

# A small alphabet makes overlapping and nested matches common; 𠀀 lies outside the BMP.
ALPHABET = "ab中𠀀"
small_words = st.sets(st.text(ALPHABET, min_size=1, max_size=5), max_size=12)
small_texts = st.text(ALPHABET, max_size=40)


@settings(max_examples=150, deadline=None)
@given(words=small_words, texts=st.lists(small_texts, min_size=1, max_size=4))
def test_match_equals_brute_force_on_both_backends(words, texts):
    lexicon = Lexicon(words)
    kept = {word for word in words if len(word) >= 2}
    for text in texts:
        expected = brute_force_matches(text, kept)
        assert lexicon.match(text, backend="trie") == expected
        if lexicon_module.ahocorasick is not None:
            assert lexicon.match(text, backend="ahocorasick") == expected


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_match_is_sorted_by_start_then_end(backend):
    lexicon = Lexicon(["中国", "中国人", "国人", "人民", "中国人民"])
    assert lexicon.match("中国人民", backend=backend) == [
        (0, 2, "中国"),
        (0, 3, "中国人"),
        (0, 4, "中国人民"),
        (1, 3, "国人"),
        (2, 4, "人民"),
    ]
    assert lexicon.match("", backend=backend) == []
    assert Lexicon([]).match("中国", backend=backend) == []


def test_without_pyahocorasick_auto_falls_back_to_the_trie(monkeypatch):
    monkeypatch.setattr(lexicon_module, "ahocorasick", None)
    lexicon = Lexicon(["中国", "国人"])
    assert lexicon.match("中国人") == [(0, 2, "中国"), (1, 3, "国人")]
    with pytest.raises(UserError, match="pyahocorasick"):
        lexicon.match("中国人", backend="ahocorasick")
    with pytest.raises(UserError, match="unknown lexicon matcher"):
        lexicon.match("中国人", backend="regex")


# ---- lattices -------------------------------------------------------------------------------------


def test_lattice_heads_and_tails():
    lattice = build_lattice("重庆人和药店", Lexicon(["重庆", "人和药店", "药店", "和药"]))
    assert lattice.words == ["重庆", "人和药店", "和药", "药店"]
    assert lattice.num_chars == 6 and len(lattice) == 10
    assert lattice.heads == [0, 1, 2, 3, 4, 5, 0, 2, 3, 4]
    assert lattice.tails == [0, 1, 2, 3, 4, 5, 1, 5, 4, 5]  # inclusive ends
    assert lattice.word_heads == [0, 2, 3, 4] and lattice.word_tails == [1, 5, 4, 5]
    assert lattice.dropped == 0


# 南京市长江大桥 (7 chars) against this lexicon matches, in (start, end) order:
#   南京 (0,2) f=50   南京市 (0,3) f=20   京市 (1,3) f=1   市长 (2,4) f=30
#   长江 (3,5) f=40   长江大桥 (3,7) f=10   大桥 (5,7) f=30
CAP_LEXICON = {"南京": 50, "南京市": 20, "京市": 1, "市长": 30, "长江": 40, "长江大桥": 10, "大桥": 30}


@pytest.mark.parametrize(
    ("drop", "max_words", "kept"),
    [
        # longest first: 长江大桥 (4), then the 3-char 南京市; the 2-char words by later start first.
        ("longest_first", 5, ["南京", "京市", "市长", "长江", "大桥"]),
        ("longest_first", 3, ["南京", "京市", "市长"]),
        # least frequent first: 京市 (1), 长江大桥 (10), 南京市 (20); then 30 vs 30: 大桥 (later start) goes.
        ("frequency", 4, ["南京", "市长", "长江", "大桥"]),
        ("frequency", 3, ["南京", "市长", "长江"]),
        ("frequency", 7, ["南京", "南京市", "京市", "市长", "长江", "长江大桥", "大桥"]),
        ("longest_first", 0, []),
    ],
)
def test_lattice_cap(drop, max_words, kept):
    text = "南京市长江大桥"
    lattice = build_lattice(text, Lexicon(CAP_LEXICON), max_words=max_words, drop=drop)
    assert lattice.words == kept
    assert lattice.dropped == 7 - len(kept)
    assert [text[h : t + 1] for h, t in zip(lattice.heads[7:], lattice.tails[7:])] == kept


def test_frequency_ties_drop_longer_words_first():
    lattice = build_lattice("南京市", Lexicon({"南京": 5, "南京市": 5, "京市": 5}), max_words=2, drop="frequency")
    assert lattice.words == ["南京", "京市"]


@settings(max_examples=100, deadline=None)
@given(
    words=st.dictionaries(st.text("ab中", min_size=2, max_size=4), st.integers(0, 3), max_size=10),
    text=st.text("ab中", max_size=30),
    max_words=st.integers(0, 8),
    drop=st.sampled_from(["longest_first", "frequency"]),
)
def test_lattice_cap_keeps_the_words_the_policy_prefers(words, text, max_words, drop):
    words = {**words, "ab": None, "中中": 2}  # a word without a frequency counts as 0
    lexicon = Lexicon(words)
    matches = lexicon.match(text)
    lattice = build_lattice(text, lexicon, max_words=max_words, drop=drop)
    kept = list(zip(lattice.heads[len(text) :], [t + 1 for t in lattice.tails[len(text) :]], lattice.words))
    assert lattice.heads[: len(text)] == lattice.tails[: len(text)] == list(range(len(text)))
    assert len(kept) == min(max_words, len(matches))
    assert lattice.dropped == len(matches) - len(kept)
    assert kept == [m for m in matches if m in kept]  # a subsequence, still in (start, end) order

    def keep_priority(match):  # higher keeps; the policy's drop order reversed
        start, end, word = match
        if drop == "longest_first":
            return (-(end - start), -start)
        return (words[word] or 0, -(end - start), -start)

    for gone in set(matches) - set(kept):
        assert all(keep_priority(gone) < keep_priority(k) for k in kept)


def test_lattice_rejects_bad_settings():
    with pytest.raises(UserError, match="needs word frequencies"):
        build_lattice("南京", Lexicon(["南京"]), drop="frequency")
    with pytest.raises(UserError, match="drop policy"):
        build_lattice("南京", Lexicon(["南京"]), drop="shortest")
    with pytest.raises(UserError, match="max_words"):
        build_lattice("南京", Lexicon(["南京"]), max_words=-1)


# ---- save, load, fingerprint ----------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    lexicon = Lexicon({"北京": 12, "中国": None, "#话题": 3, "中华人民共和国中央人民政府": 2})
    path = tmp_path / "lexicon.txt"
    lexicon.save(path)
    loaded = Lexicon.load(path)
    assert list(loaded) == list(lexicon)
    assert [loaded.freq(w) for w in lexicon] == [lexicon.freq(w) for w in lexicon]
    assert loaded.fingerprint == lexicon.fingerprint
    assert path.read_text(encoding="utf-8").splitlines()[1:] == [
        "#话题\t3",
        "中华人民共和国中央人民政府\t2",
        "中国",
        "北京\t12",
    ]


def test_fingerprint_depends_on_the_words_only():
    words = ["北京", "中国", "首都"]
    fingerprint = Lexicon(words).fingerprint
    assert Lexicon(list(reversed(words))).fingerprint == fingerprint
    assert Lexicon({"北京": 1, "中国": 2, "首都": 3}).fingerprint == fingerprint
    assert Lexicon(words + ["上海"]).fingerprint != fingerprint
    assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0
