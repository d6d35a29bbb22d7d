"""Training character, bigram and word vectors from your own text with gensim (`nerkit vectors train`),
held-out text kept out of them, and exporting the character vectors that jieba ships (Baidu LAC)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from nerkit.data.text import bigrams
from nerkit.errors import UserError
from nerkit.files import check_output, check_output_directory
from nerkit.pretrained.paddle import jieba_lac_files, read_paddle_tensor
from nerkit.data.word2vec import _WHITESPACE, write_word2vec_text

KINDS = ("char", "bichar", "word")  # what `train_vectors` trains, each written as KIND.vec




# ---- text for training --------------------------------------------------------------------------


_CONLL_LINE = re.compile(r"^\S+[ \t]+(?:\S+[ \t]+)*(?:O|[BIMES]-\S+)$")


def read_texts(path: str | Path) -> list[str]:
    """The texts of one training file. A nerkit corpus gives its sentences (JSON lines by the
    extension .jsonl/.json; CoNLL char-per-line when each of its first 50 non-blank lines is
    `token ... TAG` with an O or B-/I-/M-/E-/S- tag); any other file is plain UTF-8 text, one text per
    non-blank line."""
    from nerkit.data.corpus import read_corpus
    from nerkit.data.records import _decode, _read_bytes, text_lines

    path, data = _read_bytes(path)
    text = _decode(path, data)
    if path.suffix in (".jsonl", ".json"):
        return [s.text for s in read_corpus(path).sentences]
    sample = [line.rstrip("\r") for line in text.split("\n", 400)[:400] if line.strip()][:50]
    if sample and all(_CONLL_LINE.match(line) for line in sample):
        return [s.text for s in read_corpus(path, strict=False).sentences]
    return [line.strip() for line in text_lines(text)]


def text_key(text: str) -> str:
    """A sentence as held-out filtering compares it: whitespace removed, each character NFKC-folded
    when that keeps it one character (so １９９８ and 1998, or ， and , compare equal)."""
    return "".join(chars_of(text, normalize=True))


class HeldOut:
    """Dev and test sentences that vector training text must not contain, be part of, or share a
    long run of characters with.

    A text is rejected when, compared by `text_key`, it contains a held-out sentence of at least
    `min_len` characters, is itself part of a held-out sentence (any length), or shares a run of
    `run` characters with one (a held-out sentence cut or joined differently, as MSRA and People's
    Daily cut the same 1998 articles). Shorter held-out "sentences" (MSRA's test set has lines such
    as 同胞们 or a bare name) are not evidence that a text comes from the test set, and would reject
    every text that mentions them.
    """

    def __init__(self, sentences: Iterable[str], min_len: int = 5, run: int = 25):
        from nerkit.features.lexicon import Lexicon

        keys = {text_key(s) for s in sentences} - {""}
        self.min_len, self.run = min_len, run
        self._joined = "\n".join(sorted(keys))  # `key in joined` <=> key is part of a held-out sentence
        self._lexicon = Lexicon(keys, min_len=max(2, min_len), max_len=None, source="held-out sentences")
        self._single = {k for k in keys if len(k) == 1 and min_len <= 1}
        self._runs = {k[i:i + run] for k in keys for i in range(len(k) - run + 1)}

    @classmethod
    def from_files(cls, paths: Iterable[str | Path], **options) -> "HeldOut":
        """The sentences of dev or test files (corpora or plain text, as `read_texts` reads them)."""
        return cls([text for path in paths for text in read_texts(path)], **options)

    def rejects(self, text: str) -> bool:
        key = text_key(text)
        if not key:
            return False
        if key in self._joined:
            return True
        if self._single and any(char in self._single for char in key):
            return True
        if any(key[i:i + self.run] in self._runs for i in range(len(key) - self.run + 1)):
            return True
        return bool(self._lexicon.match(key))

    def filter(self, texts: list[str]) -> tuple[list[str], int]:
        """The texts it does not reject, and how many it rejected."""
        kept = [t for t in texts if not self.rejects(t)]
        return kept, len(texts) - len(kept)


# ---- training -----------------------------------------------------------------------------------


_MAX_TOKENS = 10_000  # gensim silently cuts a longer sentence: cut it into pieces instead


class _Sentences:
    """A re-iterable corpus for gensim: `tokenize(text)` for each text, in pieces of at most 10,000."""

    def __init__(self, texts: list[str], tokenize: Callable[[str], list[str]]):
        self.texts, self.tokenize = texts, tokenize

    def __iter__(self) -> Iterator[list[str]]:
        for text in self.texts:
            tokens = self.tokenize(text)
            for start in range(0, len(tokens), _MAX_TOKENS):
                yield tokens[start:start + _MAX_TOKENS]


def chars_of(text: str, normalize: bool = False) -> list[str]:
    """A text's characters as vector tokens: whitespace dropped (a corpus has no whitespace tokens),
    each NFKC-folded with `normalize` exactly as the featuriser does under `data.normalize`."""
    from nerkit.data.text import normalize_char

    return [normalize_char(c) if normalize else c for c in text if not c.isspace()]


def segment(texts: list[str], normalize: bool = False) -> list[str]:
    """Each text cut into words by jieba (its default dictionary, HMM on) as the words of
    `train_vectors` are: space-joined, whitespace dropped."""
    try:
        import jieba
    except ImportError:
        raise UserError("word vectors need jieba to cut the text into words", fix="pip install jieba") from None
    tokenizer = jieba.Tokenizer()
    logger = logging.getLogger("jieba")
    level = logger.level
    logger.setLevel(logging.WARNING)  # jieba announces its dictionary loading on stderr
    try:
        tokenizer.initialize()
    finally:
        logger.setLevel(level)
    segmented = []
    for text in texts:
        text = "".join(chars_of(text, normalize)) if normalize else text
        segmented.append(" ".join(w for w in tokenizer.cut(text) if w.strip() and not _WHITESPACE.search(w)))
    return segmented


def train_vectors(
    text_files: list[str | Path],
    out_dir: str | Path,
    dim: int = 50,
    word_dim: int | None = None,
    window: int = 5,
    min_count: int = 5,
    epochs: int = 5,
    seed: int = 1,
    workers: int = 1,
    sg: bool = True,
    kinds: Iterable[str] = KINDS,
    normalize: bool = False,
    held_out: HeldOut | None = None,
    force: bool = False,
) -> dict:
    """Train word2vec (gensim; skip-gram with negative sampling unless `sg` is False) character,
    character-bigram and jieba-word vectors on the texts of `text_files` (see `read_texts`) and
    write them as word2vec text to `out_dir`/char.vec, bichar.vec, word.vec.

    Characters and bigrams are exactly the featuriser's (`chars_of`, `nerkit.data.text.bigrams`, so
    the last character of a text also gets `c + "</s>"`). `word_dim` defaults to `dim`. Texts that
    `held_out` rejects are left out. With one worker a seed gives identical files on every run.
    Returns what was trained: per file the texts read and rejected, per kind its vocabulary size,
    dimension, tokens and path. A non-empty `out_dir` is written into only with `force`, and only
    if it holds nothing but vector files.
    """
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise UserError(f"unknown vector kind(s) {', '.join(unknown) or '(none given)'}", fix=f"choose from {', '.join(KINDS)}")
    word_dim = dim if word_dim is None else word_dim
    for name, value in (("dim", dim), ("word_dim", word_dim), ("window", window), ("min_count", min_count),
                        ("epochs", epochs), ("workers", workers)):
        if not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a positive integer, not {value!r}")
    if not text_files:
        raise UserError("no text files given", fix="pass at least one plain text file or corpus")
    check_output_directory(out_dir, force, own=holds_only_vectors, inputs=text_files,
                           what="a directory of vector files")
    try:
        from gensim.models import Word2Vec
    except ImportError:
        raise UserError("training vectors needs gensim, which is not installed",
                        fix="pip install 'nerkit[vectors]' (or pip install gensim)") from None

    texts: list[str] = []
    report: dict = {"files": [], "kinds": {}}
    for path in text_files:
        read = read_texts(path)
        kept, rejected = held_out.filter(read) if held_out is not None else (read, 0)
        texts.extend(kept)
        report["files"].append({"path": str(path), "texts": len(read), "rejected": rejected})
    if not any(chars_of(t) for t in texts):
        raise UserError("the text files hold no characters to train on",
                        where=", ".join(str(p) for p in text_files), fix="give files with text")

    tokenizers: dict[str, Callable[[str], list[str]]] = {
        "char": lambda t: chars_of(t, normalize),
        "bichar": lambda t: bigrams(chars_of(t, normalize)),
    }
    word_texts: list[str] = []
    if "word" in kinds:
        word_texts = segment(texts, normalize)
        tokenizers["word"] = str.split
    out_dir = Path(out_dir)
    for kind in kinds:
        corpus = _Sentences(word_texts if kind == "word" else texts, tokenizers[kind])
        model = Word2Vec(vector_size=word_dim if kind == "word" else dim, window=window, min_count=min_count,
                         sg=int(sg), negative=5, epochs=epochs, seed=seed, workers=workers)
        model.build_vocab(corpus)
        if not model.wv.index_to_key:
            raise UserError(f"no {kind} occurs {min_count} times or more: nothing to train",
                            fix="give more text or lower min_count")
        model.train(corpus, total_examples=model.corpus_count, epochs=model.epochs)
        path = out_dir / f"{kind}.vec"
        write_word2vec_text(path, list(model.wv.index_to_key), model.wv.vectors)
        report["kinds"][kind] = {"path": str(path), "vectors": len(model.wv.index_to_key),
                                 "dim": model.wv.vector_size, "tokens": model.corpus_total_words}
    return report


def holds_only_vectors(directory: Path) -> bool:
    """Whether `directory` holds nothing but word2vec files, as `train_vectors` writes."""
    return all(path.is_file() and path.suffix == ".vec" for path in directory.iterdir())


def export_jieba(out_path: str | Path) -> dict:
    """Write the character embeddings of Baidu's LAC-small model (jieba's `paddle` mode) as
    word2vec text: one line per character of its `word.dic` (`id<TAB>char`); the pseudo-tokens OOV,
    OOV_NUM, OOV_ALPHA, OOV_ALNUM and OOV_HANZ and rows no character names are left out."""
    check_output(out_path)
    tensor_path, dict_path = jieba_lac_files()
    table = read_paddle_tensor(tensor_path)
    if table.ndim != 2:
        raise UserError(f"expected a 2-d embedding table, found shape {table.shape}", where=str(tensor_path))
    words, rows, skipped = [], [], []
    for number, line in enumerate(dict_path.read_text(encoding="utf-8").split("\n"), 1):
        if not line:
            continue
        row, _, word = line.partition("\t")
        if not row.isdigit() or not word or int(row) >= len(table):
            raise UserError(f"expected `id<TAB>character` with an id below {len(table)}, found {line!r}",
                            where=f"{dict_path}:{number}")
        if word.startswith("OOV") or _WHITESPACE.search(word):
            skipped.append(word)
            continue
        words.append(word)
        rows.append(int(row))
    write_word2vec_text(out_path, words, table[rows].astype(np.float32))
    return {"path": str(out_path), "source": str(tensor_path), "table": list(table.shape), "vectors": len(words),
            "dim": int(table.shape[1]), "skipped": skipped}
