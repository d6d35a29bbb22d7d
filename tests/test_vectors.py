"""Static vectors (nerkit/vectors.py): reading every file format and its defects, row normalisation,
coverage, training on a tiny corpus, jieba's LAC export, and the held-out (dev/test) filter."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from nerkit.data.text import bigrams
from nerkit.errors import UserError
from nerkit.pretrained.paddle import jieba_lac_files, read_paddle_tensor
from nerkit.data.word2vec import Vectors, read_vectors, write_word2vec_text
from nerkit.pretrained.vectors import check_dim, coverage, normalize_rows
from nerkit.tools.resources.vectors import HeldOut, export_jieba, read_texts, train_vectors

REPO = Path(__file__).resolve().parent.parent
WORDS = ["中", "国", "</s>", "北京"]
MATRIX = np.array([[0.5, -1.25, 3.0], [1e-3, 2.5e4, -0.0625], [0.0, 0.0, 0.0], [-7.5, 0.125, 1.0]], dtype=np.float32)


def text_lines(header: bool = True, trailing_space: bool = False) -> str:
    end = " \n" if trailing_space else "\n"
    lines = [f"{w} " + " ".join(repr(float(v)) for v in row) + end for w, row in zip(WORDS, MATRIX)]
    return (f"{len(WORDS)} {MATRIX.shape[1]}\n" if header else "") + "".join(lines)


def binary_bytes(newline_after_record: bool = True) -> bytes:
    records = [w.encode("utf-8") + b" " + row.astype("<f4").tobytes() + (b"\n" if newline_after_record else b"")
               for w, row in zip(WORDS, MATRIX)]
    return f"{len(WORDS)} {MATRIX.shape[1]}\n".encode() + b"".join(records)


def assert_same(vectors: Vectors) -> None:
    assert vectors.words == WORDS
    assert vectors.matrix.dtype == np.float32 and vectors.dim == 3
    np.testing.assert_array_equal(vectors.matrix, MATRIX)


# ---- reading: formats ---------------------------------------------------------------------------


@pytest.mark.parametrize("header", [True, False])
@pytest.mark.parametrize("trailing_space", [True, False])
def test_text_with_and_without_header(write_file, header, trailing_space):
    assert_same(read_vectors(write_file(text_lines(header, trailing_space), "v.txt")))


def test_fasttext_vec_and_bom_and_blank_lines(write_file):
    # fastText writes a header and a space after the last value; a BOM and blank lines are harmless.
    assert_same(read_vectors(write_file("\ufeff" + text_lines(True, True) + "\n\n", "wiki.zh.vec")))


def test_gzipped_text_whatever_its_name(write_file):
    data = gzip.compress(text_lines().encode("utf-8"))
    assert_same(read_vectors(write_file(data, "v.txt.gz")))
    assert_same(read_vectors(write_file(data, "v.vec")))  # recognised by its magic bytes


@pytest.mark.parametrize("newline", [True, False])  # the C tool ends records with "\n", gensim does not
def test_binary(write_file, newline):
    assert_same(read_vectors(write_file(binary_bytes(newline), "v.bin")))
    assert_same(read_vectors(write_file(gzip.compress(binary_bytes(newline)), "v.bin.gz")))


def test_gensim_files_round_trip(tmp_path):
    gensim = pytest.importorskip("gensim.models")
    kv = gensim.KeyedVectors(3)
    kv.add_vectors(WORDS, MATRIX)
    for binary in (True, False):
        path = tmp_path / f"g{binary}.w2v"
        kv.save_word2vec_format(str(path), binary=binary)
        assert_same(read_vectors(path))


def test_write_then_read(tmp_path):
    path = tmp_path / "out" / "v.vec"
    write_word2vec_text(path, WORDS, MATRIX)
    assert path.read_text(encoding="utf-8").startswith("4 3\n中 0.5 -1.25 3\n")
    assert_same(read_vectors(path))
    rng = np.random.default_rng(0)
    random = rng.standard_normal((50, 7)).astype(np.float32)
    write_word2vec_text(path, [f"w{i}" for i in range(50)], random)
    np.testing.assert_allclose(read_vectors(path).matrix, random, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="whitespace"):
        write_word2vec_text(path, ["a b"], np.zeros((1, 2)))


def test_dimension_comes_from_the_file(write_file):
    vectors = read_vectors(write_file("a 1 2 3 4 5\nb 6 7 8 9 10\n", "v.txt"))
    assert vectors.dim == 5 and len(vectors) == 2
    check_dim(vectors, 5, "embeddings.char_dim")
    check_dim(vectors, None, "embeddings.char_dim")
    with pytest.raises(UserError) as error:
        check_dim(vectors, 50, "embeddings.char_dim")
    # which width is the file's and which the config's (issue 41: the message did not say)
    assert "the vector file has dimension 5, but the config's embeddings.char_dim is 50" in str(error.value)
    assert str(error.value).startswith(str(vectors.path))


def test_one_dimensional_vectors_are_not_mistaken_for_a_header(write_file):
    vectors = read_vectors(write_file("12 5\n13 7\n", "v.txt"))  # words "12" and "13", one value each
    assert vectors.words == ["12", "13"] and vectors.matrix.tolist() == [[5.0], [7.0]]


def test_duplicate_words_keep_the_first_vector(write_file):
    vectors = read_vectors(write_file("3 2\na 1 2\nb 3 4\na 5 6\n", "v.txt"))
    assert vectors.words == ["a", "b"] and vectors.duplicates == 1
    assert vectors.matrix.tolist() == [[1, 2], [3, 4]]


def test_many_lines_are_parsed_in_blocks(tmp_path):
    rng = np.random.default_rng(1)
    matrix = rng.standard_normal((70_000, 2)).astype(np.float32)  # more than one block of 65,536 lines
    path = tmp_path / "big.vec"
    write_word2vec_text(path, [f"w{i}" for i in range(len(matrix))], matrix, digits=9)
    np.testing.assert_array_equal(read_vectors(path).matrix, matrix)


# ---- reading: defects ---------------------------------------------------------------------------


def error_of(path) -> str:
    with pytest.raises(UserError) as error:
        read_vectors(path)
    return str(error.value)


def test_missing_and_empty_files(write_file, tmp_path):
    assert error_of(tmp_path / "nope.vec").startswith(f"{tmp_path / 'nope.vec'}: vector file not found")
    for content in ("", "\n\n", "0 50\n"):
        path = write_file(content, "empty.vec")
        assert error_of(path).startswith(f"{path}: the file holds no vectors")


@pytest.mark.parametrize("content, line, message", [
    ("a 1 2 3\nb 1 2\n", 2, "expected 3 values after the word, found 2"),
    ("2 3\na 1 2 3\nb 1 2 3 4\n", 3, "expected 3 values after the word, found 4"),
    ("a 1 2 3\nb 1 x 3\n", 2, "the value 'x' is not a finite number"),
    ("a 1 2 3\nb 1 nan 3\n", 2, "the value 'nan' is not a finite number"),
    ("a 1 2 3\nb 1 1e39 3\n", 2, "'1e39' is not a finite number"),  # overflows float32
    ("a 1 2 3\n 1 2 3\n", 2, "starts with a space"),
    ("a\n", 1, "a word without values"),
    ("3 3\na 1 2 3\nb 1 2 3\n", 1, "the header announces 3 vectors but the file holds 2"),
    # tabs once read as a word without values: "found 0"
    ("2 3\na\t1\t2\t3\nb\t1\t2\t3\n", 2, "expected 3 values after the word, found a line of 4 tab-separated fields"),
    ("a\t1\t2\t3\n", 1, "expected values after the word, found a line of 4 tab-separated fields"),
])
def test_malformed_text_names_file_and_line(write_file, content, line, message):
    path = write_file(content, "bad.vec")
    text = error_of(path)
    assert text.startswith(f"{path}:{line}: ") and message in text, text
    assert "; " in text  # and says how to fix it


def test_a_tab_inside_a_word_with_its_values_is_still_a_word(write_file):
    vectors = read_vectors(write_file("a\tb 1 2\nc 3 4\n", "tab.vec"))
    assert vectors.words == ["a\tb", "c"]


def test_tab_separated_vectors_say_to_replace_the_tabs(write_file):
    assert "replace the tabs with spaces" in error_of(write_file("a\t1\t2\n", "tabs.vec"))


def test_non_utf8_text_names_its_line(write_file):
    path = write_file("a 1 2\n".encode() + "b 1 2\n".encode("gbk") + "中 3 4\n".encode("gbk"), "gbk.vec")
    assert error_of(path).startswith(f"{path}:3: bytes at column 1 are not UTF-8")


def test_damaged_gzip(write_file):
    path = write_file(gzip.compress(text_lines().encode())[:-12], "cut.vec.gz")
    assert "damaged gzip file" in error_of(path)


def test_truncated_binary(write_file):
    path = write_file(binary_bytes()[:-5], "cut.bin")
    assert error_of(path).startswith(f"{path}: record 4: the header announces 4 vectors but the file ends at record 4")
    path = write_file(binary_bytes() + b"extra 1234567890123", "long.bin")
    assert "follow the 4 vectors the header announces" in error_of(path)


def test_user_errors_reach_the_cli_as_user_errors(tmp_path):
    from typer.testing import CliRunner

    from nerkit.cli.vectors import vectors_app

    result = CliRunner().invoke(vectors_app, ["train", "--text", str(tmp_path / "none.txt"), "--out", str(tmp_path / "out")])
    assert isinstance(result.exception, UserError) and "no such file" in str(result.exception)


# ---- arithmetic ---------------------------------------------------------------------------------


def test_normalize_rows():
    out = normalize_rows(MATRIX)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), [1, 1, 0, 1], rtol=1e-6)
    assert out[2].tolist() == [0, 0, 0]  # a zero row stays zero, no NaN
    np.testing.assert_allclose(out[0] * np.linalg.norm(MATRIX[0]), MATRIX[0], rtol=1e-6)  # same direction
    np.testing.assert_array_equal(MATRIX[0], [0.5, -1.25, 3.0])  # the input is left alone


def test_coverage_arithmetic():
    counts = Counter({"a": 3, "b": 2, "c": 1, "d": 0})
    found = coverage(counts, ["a", "c", "z"])
    assert (found.types, found.types_found, found.occurrences, found.occurrences_found) == (3, 2, 6, 4)
    assert found.type_rate == pytest.approx(2 / 3) and found.occurrence_rate == pytest.approx(4 / 6)
    assert str(found) == "types 2/3 (66.67%), occurrences 4/6 (66.67%)"
    assert coverage(Counter(), ["a"]).type_rate == 0.0


# ---- training -----------------------------------------------------------------------------------

PLAIN = "我爱北京天安门。\n天安门上太阳升。\n\n  北京 欢迎你  \n"
CONLL = "张 B-PER\n三 I-PER\n在 O\n北 B-LOC\n京 I-LOC\n。 O\n\n上 B-LOC\n海 I-LOC\n"


def test_read_texts_tells_corpora_from_plain_text(write_file):
    assert read_texts(write_file(PLAIN, "plain.txt")) == ["我爱北京天安门。", "天安门上太阳升。", "北京 欢迎你"]
    assert read_texts(write_file(CONLL, "c.bio")) == ["张三在北京。", "上海"]
    assert read_texts(write_file('{"text": "张三在北京", "entities": []}\n', "c.jsonl")) == ["张三在北京"]
    assert read_texts(write_file("我 爱\n你 们\n", "pairs.txt")) == ["我 爱", "你 们"]  # not tags: plain text


def train_tiny(tmp_path, out_name="out", **options):
    plain = tmp_path / "plain.txt"
    plain.write_text(PLAIN, encoding="utf-8")
    conll = tmp_path / "c.bio"
    conll.write_text(CONLL, encoding="utf-8")
    options = {"dim": 8, "window": 2, "min_count": 1, "epochs": 2, "seed": 3, **options}
    return train_vectors([plain, conll], tmp_path / out_name, **options), tmp_path / out_name


def test_train_vectors_tokens_are_the_featurisers(tmp_path):
    pytest.importorskip("gensim")
    import jieba

    report, out = train_tiny(tmp_path, word_dim=6)
    texts = ["我爱北京天安门。", "天安门上太阳升。", "北京欢迎你", "张三在北京。", "上海"]
    chars = {c for t in texts for c in t}
    pairs = {b for t in texts for b in bigrams(list(t))}
    assert {"门。", "。</s>", "你</s>", "海</s>"} <= pairs
    words = {w for t in ["我爱北京天安门。", "天安门上太阳升。", "北京 欢迎你", "张三在北京。", "上海"]
             for w in jieba.cut(t) if w.strip()}
    for kind, expected, dim in (("char", chars, 8), ("bichar", pairs, 8), ("word", words, 6)):
        vectors = read_vectors(out / f"{kind}.vec")
        assert set(vectors.words) == expected, kind
        assert vectors.dim == dim and report["kinds"][kind]["vectors"] == len(expected)
    assert report["kinds"]["char"]["tokens"] == sum(len(t) for t in texts)
    assert [f["texts"] for f in report["files"]] == [3, 2]


@pytest.mark.slow
def test_train_vectors_is_reproducible(tmp_path):
    pytest.importorskip("gensim")
    _, first = train_tiny(tmp_path, "a", kinds=["char", "bichar"])
    _, second = train_tiny(tmp_path, "b", kinds=["char", "bichar"])
    _, other_seed = train_tiny(tmp_path, "c", kinds=["char"], seed=4)
    assert (first / "char.vec").read_bytes() == (second / "char.vec").read_bytes()
    assert (first / "bichar.vec").read_bytes() == (second / "bichar.vec").read_bytes()
    assert (first / "char.vec").read_bytes() != (other_seed / "char.vec").read_bytes()
    # ... and in another process with another string hash seed (gensim once seeded vectors by hash()).
    script = ("import sys; from pathlib import Path; from tests.test_vectors import train_tiny; "
              "train_tiny(Path(sys.argv[1]), 'd', kinds=['char'])")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, env=env, cwd=REPO)
    assert (first / "char.vec").read_bytes() == (tmp_path / "d" / "char.vec").read_bytes()


def test_train_vectors_leaves_held_out_text_out(tmp_path):
    pytest.importorskip("gensim")
    report, out = train_tiny(tmp_path, kinds=["char"], held_out=HeldOut(["天安门上太阳升。"]))
    assert [f["rejected"] for f in report["files"]] == [1, 0]
    assert "升" not in read_vectors(out / "char.vec").words


def test_train_vectors_refuses_bad_settings(tmp_path):
    with pytest.raises(UserError, match="epochs must be a positive integer"):
        train_tiny(tmp_path, epochs=0)
    with pytest.raises(UserError, match="unknown vector kind"):
        train_tiny(tmp_path, kinds=["chars"])


# ---- the held-out filter ------------------------------------------------------------------------


def test_held_out_filter_removes_a_planted_test_sentence():
    test_sentences = ["中国足球队在１９９８年世界杯上表现出色。", "同胞们", "李鹏总理会见了外宾。"]
    held_out = HeldOut(test_sentences)
    texts = [
        "新华社消息，中国足球队在1998年世界杯上表现出色。教练说……",  # contains one (digits folded)
        "中国足球队 在１９９８年世界杯上表现出色。",  # the sentence itself, with a space
        "会见了外宾",  # part of a test sentence
        "同胞们",  # a short test sentence, itself
        "同胞们、朋友们，新年好！",  # contains only a short (< 5 characters) test sentence: kept
        "李鹏总理会见了外宾",  # part of one (no final 。)
        "今天天气很好。",
        "据悉，中国足球队在１９９８年世界杯上表现",  # 18 characters of one, cut differently
    ]
    kept, removed = held_out.filter(texts)
    assert kept == ["同胞们、朋友们，新年好！", "今天天气很好。", "据悉，中国足球队在１９９８年世界杯上表现"]
    assert removed == 5
    assert HeldOut(test_sentences, min_len=2).rejects("同胞们、朋友们，新年好！")
    assert HeldOut(test_sentences, run=15).rejects("据悉，中国足球队在１９９８年世界杯上表现")


# ---- jieba's LAC characters ---------------------------------------------------------------------


def test_paddle_tensor_layout(tmp_path):
    table = np.arange(12, dtype="<f4").reshape(3, 4)
    desc = bytes([0x08, 5, 0x12, 2, 3, 4])  # data type FP32, dims [3, 4] packed
    lod = struct.pack("<Q", 16) + struct.pack("<QQ", 0, 3)  # one LoD level of two offsets
    data = struct.pack("<IQ", 0, 1) + lod + struct.pack("<Ii", 0, len(desc)) + desc + table.tobytes()
    (tmp_path / "t").write_bytes(data)
    np.testing.assert_array_equal(read_paddle_tensor(tmp_path / "t"), table)
    (tmp_path / "t").write_bytes(data[:-4])
    with pytest.raises(UserError, match="needs 48 bytes of data, the file holds 44"):
        read_paddle_tensor(tmp_path / "t")


def test_export_jieba(tmp_path):
    try:
        jieba_lac_files()
    except UserError as error:
        pytest.skip(f"jieba's LAC-small files are not installed: {error}")
    report = export_jieba(tmp_path / "lac.vec")
    assert report["table"] == [20941, 128] and report["dim"] == 128
    assert report["vectors"] == 20941 - 1 - len(report["skipped"])  # row 20939 has no character
    vectors = read_vectors(tmp_path / "lac.vec")
    assert (len(vectors), vectors.dim) == (report["vectors"], 128)
    assert {"OOV", "OOV_HANZ", "\u3000"} <= set(report["skipped"]) and "中" in vectors.words
    norms = np.linalg.norm(vectors.matrix, axis=1)
    assert 1 < np.median(norms) < 20 and np.isfinite(norms).all()
    # Not garbage: among frequent characters (larger norms), 北's nearest are directions, 猫's animals.
    index = vectors.index()
    common = norms > np.median(norms)
    unit = normalize_rows(vectors.matrix)

    def nearest(char, k=5):
        scores = np.where(common, unit @ unit[index[char]], -1)
        return [vectors.words[i] for i in np.argsort(-scores)[1:k + 1]]

    assert {"南", "东", "西"} & set(nearest("北")) and {"狗", "鸡", "虎", "熊"} & set(nearest("猫"))


def test_train_vectors_keeps_the_tail_of_a_very_long_line(tmp_path):
    pytest.importorskip("gensim")
    long_line = "天地玄黄" * 2500 + "宇宙洪荒"  # 10,004 characters: gensim alone would cut it at 10,000
    (tmp_path / "long.txt").write_text(long_line + "\n", encoding="utf-8")
    train_vectors([tmp_path / "long.txt"], tmp_path / "out", dim=4, min_count=1, epochs=1, kinds=["char"])
    assert set(read_vectors(tmp_path / "out" / "char.vec").words) == set("天地玄黄宇宙洪荒")
