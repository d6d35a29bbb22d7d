"""Word lists and lattice matching for FLAT (Li et al. 2020): a `Lexicon` read from jieba's bundled
dictionary, a plain word list or a word2vec vocabulary; `Lexicon.match` finds every lexicon word in a
text; `build_lattice` turns one sentence into FLAT's flat lattice (characters, then words).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nerkit.config import DROP_POLICIES
from nerkit.errors import UserError
from nerkit.files import atomic_write_text
from nerkit.data.word2vec import check_vector_file, is_vector_file, read_vector_words

# Optional (`pip install nerkit[fast]`). On jieba's dictionary it matches at about the speed of the
# pure-Python trie but takes ~6x less memory (21 vs 128 MiB); both give identical results.
try:
    import ahocorasick
except ImportError:
    ahocorasick = None


Backend = Literal["auto", "ahocorasick", "trie"]


DropPolicy = Literal[DROP_POLICIES]  # lexicon.drop's values, defined once in nerkit.config


# Single characters are already lattice nodes, so words start at two characters. There is no default
# cap on length: the 163 jieba words longer than 10 characters are mostly organisation names
# (中国人民解放军总参谋部), exactly what a lattice should offer an NER model, and a long word costs
# nothing unless it occurs (Aho-Corasick is linear in text + matches; the trie walk stops where the
# trie has no branch). Set `max_len` to keep junk phrases of a large vector vocabulary out.
DEFAULT_MIN_LEN = 2


DEFAULT_MAX_LEN = None


_WHITESPACE = re.compile(r"\s")


_TRIE_END = ""  # key marking "a word ends here"; never a character of the text


class Lexicon:
    """A set of words (each with an optional corpus frequency) that can be matched against text."""

    def __init__(
        self,
        words: Mapping[str, int | None] | Iterable[str],
        *,
        min_len: int = DEFAULT_MIN_LEN,
        max_len: int | None = DEFAULT_MAX_LEN,
        min_freq: int | None = None,
        source: str = "<memory>",
    ):
        """Keep the words that pass the filters. A word without a frequency passes `min_freq`;
        words containing whitespace are skipped (they could not be written to a word list)."""
        _check_filters(min_len, max_len, min_freq)
        if not isinstance(words, Mapping):
            words = dict.fromkeys(words)
        self.source = source
        self._freqs: dict[str, int | None] = {}
        for word, freq in words.items():
            if len(word) < min_len or (max_len is not None and len(word) > max_len):
                continue
            if min_freq is not None and freq is not None and freq < min_freq:
                continue
            if _WHITESPACE.search(word):
                continue
            self._freqs[word] = freq
        self.has_frequencies = any(freq is not None for freq in self._freqs.values())
        self._fingerprint: str | None = None
        self._automaton = None
        self._trie: dict | None = None

    # ---- constructors -------------------------------------------------------------------------

    @classmethod
    def from_jieba(cls, **filters) -> Lexicon:
        """jieba's bundled dictionary (`dict.txt`, lines `word freq pos`), found without importing
        jieba: its import prints to stderr and writes a cache file."""
        path = jieba_dict_path()
        return cls(_read_word_list(path), source="jieba", **filters)

    @classmethod
    def from_word_list(cls, path: str | Path, **filters) -> Lexicon:
        """One word per line, optionally followed by an integer frequency (further columns, such as
        a jieba part-of-speech tag, are ignored). Blank lines and comment lines (`#` alone or
        `# ...`) are skipped; `#话题` is a word."""
        return cls(_read_word_list(Path(path)), source=str(path), **filters)

    @classmethod
    def from_vectors(cls, path: str | Path, **filters) -> Lexicon:
        """The vocabulary of a word2vec file (text with or without its `N D` header, or binary;
        gzipped or not), as FLAT and Lattice LSTM use ctb.50d.vec. It is read by the vectors' own
        reader (nerkit.data.word2vec), which checks each row but does not parse its values."""
        return cls(dict.fromkeys(read_vector_words(path)), source=str(path), **filters)

    @classmethod
    def from_source(cls, source: str, min_len: int = DEFAULT_MIN_LEN, max_len: int | None = None,
                    min_freq: int | None = None) -> Lexicon:
        """`jieba`, a word2vec file (`.vec`, `.txt.gz`, ... with vectors on its lines), or a word list."""
        filters = {"min_len": min_len, "max_len": max_len, "min_freq": min_freq}
        if source == "jieba":
            return cls.from_jieba(**filters)
        path = Path(source)
        if not path.is_file():
            raise UserError("lexicon file not found", where=source,
                            fix="set lexicon.source to jieba, a word list, or a word2vec vector file; "
                            "`nerkit lexicon build --config CONFIG --out FILE` mines a word list from a config's "
                            "training split (`make cmeee-lexicon` writes configs/cmeee_flat_mined.yaml's)")
        if is_vector_file(path):
            return cls.from_vectors(path, **filters)
        return cls.from_word_list(path, **filters)

    @classmethod
    def from_config(cls, lexicon_config, source: str | None = None) -> Lexicon:
        """The lexicon a config's `lexicon:` section gives a lattice encoder (its source, or
        `source`, with its min_len / max_len / min_freq filters; 0 is no filter)."""
        lc = lexicon_config
        return cls.from_source(source or lc.source, lc.min_len, lc.max_len or None, lc.min_freq or None)

    @classmethod
    def load(cls, path: str | Path) -> Lexicon:
        """Read back a lexicon written by `save`, keeping every word in it."""
        return cls(_read_word_list(Path(path)), max_len=None, source=str(path))

    def save(self, path: str | Path) -> None:
        """Write a plain UTF-8 word list, `word\\tfreq` per line (`word` alone when there is no
        frequency), sorted by word; `Lexicon.load` and `Lexicon.from_word_list` read it back."""
        lines = [f"# nerkit lexicon: {len(self)} words, sha256 {self.fingerprint}\n"]
        for word in sorted(self._freqs):
            freq = self._freqs[word]
            lines.append(f"{word}\n" if freq is None else f"{word}\t{freq}\n")
        atomic_write_text(path, "".join(lines))

    # ---- the word set -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._freqs)

    def __contains__(self, word: object) -> bool:
        return word in self._freqs

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._freqs))

    def __repr__(self) -> str:
        return f"Lexicon({len(self)} words from {self.source}, sha256 {self.fingerprint[:12]})"

    def freq(self, word: str) -> int | None:
        """The word's frequency; None when the source gave none (or the word is absent)."""
        return self._freqs.get(word)

    @property
    def fingerprint(self) -> str:
        """sha256 (hex) of the sorted words, one per line: a saved model checks that it is given the
        lexicon it was trained with. Frequencies are not part of it."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for word in sorted(self._freqs):
                digest.update(word.encode("utf-8") + b"\n")
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    # ---- matching -----------------------------------------------------------------------------

    def match(self, text: str, *, backend: Backend = "auto") -> list[tuple[int, int, str]]:
        """Every occurrence of a lexicon word in `text` as `(start, end_exclusive, word)`, overlaps
        included, sorted by (start, end). `auto` uses pyahocorasick when installed, else the trie."""
        if backend not in ("auto", "ahocorasick", "trie"):
            raise UserError(f"unknown lexicon matcher {backend!r}", fix="use 'auto', 'ahocorasick' or 'trie'")
        if backend == "auto":
            backend = "ahocorasick" if ahocorasick is not None else "trie"
        if backend == "ahocorasick" and ahocorasick is None:
            raise UserError(
                "the 'ahocorasick' lexicon matcher needs pyahocorasick, which is not installed",
                fix="pip install pyahocorasick (or nerkit[fast]), or use matcher 'auto'",
            )
        if not self._freqs or not text:
            return []
        if backend == "ahocorasick":
            return self._match_automaton(text)
        return self._match_trie(text)

    def _match_automaton(self, text: str) -> list[tuple[int, int, str]]:
        if self._automaton is None:
            automaton = ahocorasick.Automaton()
            for word in self._freqs:
                automaton.add_word(word, word)
            automaton.make_automaton()
            self._automaton = automaton
        # iter() reports each match at its last character, ordered by end; re-sort by (start, end).
        found = [(last + 1 - len(word), last + 1, word) for last, word in self._automaton.iter(text)]
        found.sort()
        return found

    def _match_trie(self, text: str) -> list[tuple[int, int, str]]:
        if self._trie is None:
            root: dict = {}
            for word in self._freqs:
                node = root
                for char in word:
                    node = node.setdefault(char, {})
                node[_TRIE_END] = word
            self._trie = root
        found = []
        for start in range(len(text)):
            node = self._trie
            for end in range(start, len(text)):
                node = node.get(text[end])
                if node is None:
                    break
                word = node.get(_TRIE_END)
                if word is not None:
                    found.append((start, end + 1, word))
        return found  # already in (start, end) order


# ---- the FLAT lattice ---------------------------------------------------------------------------


@dataclass
class SentenceLattice:
    """FLAT's flat lattice of one sentence. Nodes are the n characters (node i is character i, not
    stored in `words`) followed by the matched words. `heads`/`tails` cover every node: a character
    has head = tail = its position; a word spanning characters s..e-1 has head s and tail e-1
    (inclusive, as in the paper)."""

    words: list[str]
    heads: list[int]  # (n + len(words),)
    tails: list[int]  # (n + len(words),)
    dropped: int  # words matched but left out by the `max_words` cap

    @property
    def num_chars(self) -> int:
        return len(self.heads) - len(self.words)

    @property
    def word_heads(self) -> list[int]:
        return self.heads[self.num_chars :]

    @property
    def word_tails(self) -> list[int]:
        return self.tails[self.num_chars :]

    def __len__(self) -> int:
        return len(self.heads)


def build_lattice(
    text: str,
    lexicon: Lexicon,
    max_words: int | None = None,
    drop: DropPolicy = "longest_first",
) -> SentenceLattice:
    """The lattice of `text`: its characters, then at most `max_words` matched words in (start, end)
    order. Over the cap, words are dropped deterministically: `longest_first` drops the longest
    (ties: later start first); `frequency` drops the least frequent (ties: longer first, then later
    start). With `frequency`, a word without a frequency counts as 0, and a lexicon without any
    frequency is refused up front, capped or not, so a bad config fails on the first sentence."""
    if drop not in DROP_POLICIES:
        raise UserError(f"unknown lattice drop policy {drop!r}", fix=f"use one of {', '.join(DROP_POLICIES)}")
    if drop == "frequency" and not lexicon.has_frequencies:
        raise UserError(
            f"lattice drop policy 'frequency' needs word frequencies, and the lexicon from "
            f"{lexicon.source} has none",
            fix="use drop 'longest_first', or a lexicon with frequencies (jieba or a word list with counts)",
        )
    if max_words is not None and max_words < 0:
        raise UserError(f"max_words must be >= 0 or null, got {max_words}", fix="set a non-negative cap")
    matches = lexicon.match(text)
    dropped = 0
    if max_words is not None and len(matches) > max_words:
        if drop == "longest_first":
            drop_order = sorted(matches, key=lambda m: (-(m[1] - m[0]), -m[0]))
        else:
            drop_order = sorted(matches, key=lambda m: (lexicon.freq(m[2]) or 0, -(m[1] - m[0]), -m[0]))
        dropped = len(matches) - max_words
        gone = set(drop_order[:dropped])
        matches = [m for m in matches if m not in gone]
    n = len(text)
    return SentenceLattice(
        words=[word for _, _, word in matches],
        heads=list(range(n)) + [start for start, _, _ in matches],
        tails=list(range(n)) + [end - 1 for _, end, _ in matches],
        dropped=dropped,
    )


# ---- reading files ------------------------------------------------------------------------------


def jieba_dict_path() -> Path:
    """Path of jieba's bundled `dict.txt`, located through the import system without importing."""
    spec = importlib.util.find_spec("jieba")
    if spec is None:
        raise UserError(
            "the default lexicon is jieba's dictionary, and jieba is not installed",
            fix="pip install jieba, or point the lexicon at a word list or a .vec file",
        )
    folders = list(spec.submodule_search_locations or [])
    if spec.origin:
        folders.append(str(Path(spec.origin).parent))
    for folder in folders:
        path = Path(folder) / "dict.txt"
        if path.is_file():
            return path
    raise UserError(
        f"jieba is installed but its dictionary dict.txt is not in {', '.join(folders)}",
        where=folders[0] if folders else None,
        fix="reinstall jieba (pip install --force-reinstall jieba)",
    )


def check_source_file(path: str, setting: str, head: int = 20) -> None:
    """Raise the UserError that `Lexicon.from_source` would raise on the first `head` lines or
    records of the file `path` (the value of the config key `setting`): a cheap look that tells a
    word list or a word2vec file from junk before a run reads its corpora."""
    if is_vector_file(path):
        check_vector_file(path, setting, head)
        return
    try:
        _read_word_list(Path(path), head)
    except UserError as error:
        raise UserError(f"{setting}: {error.message}", where=error.where, fix=error.fix) from None


def _check_filters(min_len: int, max_len: int | None, min_freq: int | None) -> None:
    if min_len < 2:
        raise UserError(
            f"lexicon min_len must be >= 2, got {min_len}",
            fix="single characters are lattice nodes already; set min_len to 2 or more",
        )
    if max_len is not None and max_len < min_len:
        raise UserError(f"lexicon max_len {max_len} is below min_len {min_len}",
                        fix="raise max_len or set it to null")
    if min_freq is not None and min_freq < 0:
        raise UserError(f"lexicon min_freq must be >= 0, got {min_freq}",
                        fix="set a non-negative count or null")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) pairs of a UTF-8 file, gunzipped when it starts with the gzip magic
    bytes. Lines are decoded one at a time so that a decoding error names its line."""
    try:
        with path.open("rb") as probe:
            gzipped = probe.read(2) == b"\x1f\x8b"
        handle = gzip.open(path, "rb") if gzipped else path.open("rb")
    except OSError as error:
        raise UserError(f"cannot read lexicon file: {error.strerror or error}", where=str(path),
                        fix="check the path") from error
    lineno = 0
    with handle:
        try:
            for lineno, raw in enumerate(handle, 1):
                line = raw.decode("utf-8")
                yield lineno, line.removeprefix("\ufeff") if lineno == 1 else line
        except UnicodeDecodeError as error:
            raise UserError("not valid UTF-8", where=f"{path}:{lineno}",
                            fix="convert the file to UTF-8") from error
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:
            raise UserError(f"damaged gzip file ({error})", where=str(path),
                            fix="the file may be truncated; download or compress it again") from error


def _read_word_list(path: Path, limit: int | None = None) -> dict[str, int | None]:
    """`word [freq [ignored...]]` lines (the first `limit` of them); a repeated word keeps its
    largest frequency."""
    freqs: dict[str, int | None] = {}
    for lineno, line in _lines(path):
        if limit is not None and lineno > limit:
            break
        fields = line.split()
        if not fields or fields[0] == "#":
            continue
        word, freq = fields[0], None
        if len(fields) > 1:
            if not _is_count(fields[1]):
                raise UserError(
                    f"the second column of a word list is a frequency, found {fields[1]!r}",
                    where=f"{path}:{lineno}",
                    fix="write `word` or `word<TAB>count` with a non-negative integer count",
                )
            freq = int(fields[1])
        if word in freqs:
            old = freqs[word]
            freq = freq if old is None else old if freq is None else max(old, freq)
        freqs[word] = freq
    return freqs


def _is_count(token: str) -> bool:
    return token.isascii() and token.isdigit()
