"""A dictionary as the only supervision (issue 57, `nerkit data match`): every dictionary string found
in a text is marked an entity and the rest left unknown (a partial label, `Sentence.unknown`) or read
as O (the naive reading); and `hide_entities`, which takes entities out of a complete corpus to
simulate the annotators who missed them. Torch-free.

How a text is marked: a greedy scan from left to right that takes, at each position, the longest
dictionary string starting there, marks it and goes on after its end; a position where none starts
is passed by one character. So of two overlapping strings the one that starts first wins, even when
the later one is longer (in 张三丰收 with 张三 and 三丰收 listed, 张三 is marked), and of strings
starting at one place the longest wins (中国 over 中). A string given two types (listed under both,
or labelled both in a corpus) is ambiguous: it is still matched, so nothing inside it is marked, but
it is marked no entity, and its characters are left unknown, since a partial label should not guess
(`--ambiguous majority` takes the type given it most often when one is). Under the naive reading
(`rest` "o") its characters are O, as every unmarked character is.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from nerkit.data.corpus import is_jsonl, read_corpus, write_corpus
from nerkit.data.records import Sentence, read_text, span_sentence, unknown_regions
from nerkit.data.tags import SCHEMES, Span, spans_to_tags
from nerkit.errors import CorpusError, UserError
from nerkit.files import check_output

# What the characters outside every match are: unknown (a partial label) or O (the naive reading,
# as DSNER's ds_fa.bio reads its dictionary's matches).
RESTS = ("unknown", "o")
# How a string given two types is settled: left unknown, or the type given it most often (a tie
# stays unknown). A word list's (word, type) line counts once, a corpus's entity once a place.
AMBIGUITIES = ("unknown", "majority")
# What the marked corpus is written as: a CoNLL tag scheme or JSON lines.
OUTPUTS = (*SCHEMES, "jsonl")

# Single characters are left out of a dictionary by default: the one-character entities of a
# corpus are abbreviations (中 for China, 美, 京), and each is an entity in few of the places it
# occurs (其中, 美丽, 北京 holds 京 inside a longer match but 京剧 does not), so matching them marks
# more wrong entities than right ones. `min_length` 1 keeps them.
DEFAULT_MIN_LENGTH = 2

_TYPE = re.compile(r"\S+")  # a type becomes tags (B-TYPE): no spaces
# The first line of a character-per-line corpus: a character, a separator, a tag (or UNK, unknown).
_CONLL_LINE = re.compile(r"\S[ \t]+(O|UNK|[BIMES]-\S+)\r?")
_WORD_LIST = ("a word list has a word a line, `word`, `word<TAB>TYPE`, or `word<TAB>count` as "
              "`nerkit lexicon build` writes it")


# ---------------------------------------------------------------------------------------------
# The dictionary


@dataclass
class Dictionary:
    """The strings to mark and the types given them, with how often each (`votes`); `skipped`: the
    strings left out for being shorter than the minimum length, `unmapped`: those left out for a
    type that no --map renames (with `only_mapped`)."""

    votes: dict[str, Counter] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    unmapped: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)  # the types as the files give them, before --map

    def words(self, ambiguous: str = "unknown") -> dict[str, str | None]:
        """Each string's type, None where it is ambiguous (`ambiguous`: one of AMBIGUITIES)."""
        words = {}
        for word, votes in self.votes.items():
            (first, most), *rest = votes.most_common(2)
            alone = not rest or (ambiguous == "majority" and most > rest[0][1])
            words[word] = first if alone else None
        return words


def parse_maps(maps: list[str]) -> dict[str, str]:
    """`--map OLD=NEW` options as a dict; a malformed one is a UserError."""
    renamed: dict[str, str] = {}
    for item in maps:
        old, sep, new = item.partition("=")
        if not sep or not _TYPE.fullmatch(old) or not _TYPE.fullmatch(new):
            raise UserError(f"--map {item}: expected OLD=NEW, two type names without spaces",
                            fix="write e.g. --map NR=PER (repeat --map for each type)")
        if renamed.get(old, new) != new:
            raise UserError(f"--map {item}: {old} is already mapped to {renamed[old]}", fix="map each type once")
        renamed[old] = new
    return renamed


def split_spec(spec: str) -> tuple[Path, str | None]:
    """`FILE[:TYPE]` as the file and the type given after it (None if none). A file whose own name
    has a colon is taken whole when it exists."""
    path, sep, typ = spec.rpartition(":")
    if not sep or Path(spec).exists() or "/" in typ:
        return Path(spec), None
    if not _TYPE.fullmatch(typ):
        raise UserError(f"--dict {spec}: the type after the colon is {typ!r}", fix="write --dict FILE:TYPE, e.g. "
                        "names.txt:PER, a type without spaces")
    return Path(path), typ


def looks_like_corpus(path: Path) -> bool:
    """Whether a file is a labelled corpus (JSON lines by its name, .jsonl or .json, or a
    character-per-line file by its first line) rather than a word list or plain text."""
    if is_jsonl(path):
        return True
    with path.open("rb") as handle:
        for raw in handle:
            line = raw.decode("utf-8", "replace").removeprefix("\ufeff").rstrip("\n")
            if line.strip():
                return bool(_CONLL_LINE.fullmatch(line))
    return False


def _check_file(path: Path, option: str) -> None:
    if not path.exists():
        raise CorpusError("no such file", where=str(path), fix=f"check the path given to {option} (and NERKIT_DATA)")
    if not path.is_file():
        raise CorpusError("is not a regular file", where=str(path), fix=f"give {option} a file")


def read_dictionary(specs: list[str], maps: dict[str, str] | None = None, only_mapped: bool = False,
                    min_length: int = DEFAULT_MIN_LENGTH) -> Dictionary:
    """The dictionary of the `--dict FILE[:TYPE]` specs: word lists (`word`, `word<TAB>TYPE`, or
    `nerkit lexicon build`'s `word<TAB>count`; a line without a type takes the one after the file's
    name) and labelled corpora (their entities, with their types). `maps` renames types; with
    `only_mapped`, an entry whose type no map names is dropped. Strings shorter than `min_length`
    are counted and left out. An empty result, or a map of a type no file has, is a UserError."""
    maps = maps or {}
    dictionary = Dictionary()
    for spec in specs:
        path, typ = split_spec(spec)
        _check_file(path, "--dict")
        if looks_like_corpus(path):
            if typ is not None:
                raise UserError(f"--dict {spec}: a labelled corpus gives its entities their own types",
                                where=str(path), fix=f"drop :{typ}, and rename its types with --map OLD=NEW")
            entries = _corpus_entries(path)
        else:
            entries = _word_list_entries(path, typ)
        for word, old in entries:
            dictionary.types.add(old)
            if len(word) < min_length:
                dictionary.skipped.add(word)
            elif only_mapped and old not in maps:
                dictionary.unmapped.add(word)
            else:
                dictionary.votes.setdefault(word, Counter())[maps.get(old, old)] += 1
    missing = sorted(set(maps) - dictionary.types)
    if missing:
        raise UserError(f"--map {missing[0]}={maps[missing[0]]}: no dictionary has the type {missing[0]} "
                        f"(their types: {', '.join(sorted(dictionary.types)) or 'none'})",
                        fix="map a type the dictionaries have")
    if not dictionary.votes:
        left = f"{len(dictionary.skipped):,} shorter than {min_length} characters" if dictionary.skipped else ""
        if dictionary.unmapped:
            left += f"{', ' if left else ''}{len(dictionary.unmapped):,} of a type no --map names"
        raise UserError(f"the dictionary is empty{f' (left out: {left})' if left else ''}",
                        where=", ".join(str(split_spec(s)[0]) for s in specs),
                        fix="give --dict a word list or a labelled corpus with entities"
                            + (" (--min-length 1 keeps single characters)" if dictionary.skipped else ""))
    return dictionary


def _word_list_entries(path: Path, typ: str | None) -> list[tuple[str, str]]:
    """The (word, type) pairs of a word list, each once. Only a tab separates columns: a word may
    hold spaces (the names of DSNER's additional-names.dict do). Blank lines and comment lines (`#`
    alone or `# ...`, as `Lexicon.save` writes its header) are skipped."""
    entries: dict[tuple[str, str], None] = {}
    for number, line in enumerate(read_text(path).split("\n"), 1):
        stripped = line.strip()
        if not stripped or stripped == "#" or stripped.startswith("# "):
            continue
        fields = [f.strip() for f in line.removesuffix("\r").split("\t")]
        where = f"{path}:{number}"
        if len(fields) > 2 or not all(fields) or (len(fields) == 2 and not _TYPE.fullmatch(fields[1])):
            raise CorpusError(f"expected `word` or `word<TAB>TYPE` (a type without spaces), found "
                              f"{line.strip()[:80]!r}", where=where, fix=_WORD_LIST)
        word, given = fields[0], typ
        if len(fields) == 2 and not (fields[1].isascii() and fields[1].isdigit()):  # a count says no type
            given = fields[1]
        if given is None:
            raise CorpusError(f"the word {word!r} has no type", where=where,
                              fix=f"give every word's type after the file name, --dict {path}:TYPE, or in a "
                                  "second column, `word<TAB>TYPE`")
        entries[word, given] = None
    return list(entries)


def _corpus_entries(path: Path) -> list[tuple[str, str]]:
    """A labelled corpus's entities as (string, type), one per place it is marked."""
    corpus = read_corpus(path, repair_option=f"repair it first: `nerkit data validate {path} --repair OUT`")
    return [(sent.text[s.start:s.end], s.type) for sent in corpus.sentences for s in sent.spans()]


# ---------------------------------------------------------------------------------------------
# Matching


class Matcher:
    """The greedy longest-match scan of a dictionary (the module's docstring says how it settles
    overlaps). For each first character it keeps the lengths of the strings starting with it,
    longest first, so a position costs one lookup unless a string starts with its character."""

    def __init__(self, words: dict[str, str | None]):
        self.words = words
        lengths: dict[str, set[int]] = {}
        for word in words:
            lengths.setdefault(word[0], set()).add(len(word))
        self.lengths = {char: sorted(found, reverse=True) for char, found in lengths.items()}

    def find(self, text: str) -> list[tuple[int, int, str | None]]:
        """The matches in `text`: (start, end exclusive, type or None if ambiguous), in order."""
        found, words, lengths = [], self.words, self.lengths
        i, n = 0, len(text)
        while i < n:
            for length in lengths.get(text[i], ()):
                if i + length <= n and text[i:i + length] in words:
                    found.append((i, i + length, words[text[i:i + length]]))
                    i += length
                    break
            else:
                i += 1
        return found


@dataclass
class MatchSummary:
    """What marking a text found: its sentences and characters, the entities marked by type, the
    ambiguous strings (distinct) and their places, and the characters known (marked, or O); and
    of the dictionary (`noted`), its strings and those left out."""

    strings: int = 0
    short: int = 0  # strings shorter than `min_length`, left out
    min_length: int = DEFAULT_MIN_LENGTH
    unmapped: int = 0  # strings left out for a type no --map names
    sentences: int = 0
    characters: int = 0
    entities: Counter = field(default_factory=Counter)
    ambiguous: set[str] = field(default_factory=set)
    ambiguous_places: int = 0
    known: int = 0

    def noted(self, dictionary: Dictionary, min_length: int) -> MatchSummary:
        self.strings, self.min_length = len(dictionary.votes), min_length
        self.short, self.unmapped = len(dictionary.skipped), len(dictionary.unmapped)
        return self

    def line(self) -> str:
        """The one-line summary `nerkit data match` prints."""
        left = f", {self.short:,} shorter than {self.min_length} left out" if self.short else ""
        if self.unmapped:
            left += f", {self.unmapped:,} of an unmapped type dropped"
        by_type = ", ".join(f"{t} {n:,}" for t, n in sorted(self.entities.items())) or "none"
        share = self.known / self.characters if self.characters else 1.0
        return (f"{self.strings:,} dictionary strings{left}; "
                f"{self.sentences:,} sentences, {self.characters:,} characters: matched {by_type}; "
                f"{len(self.ambiguous):,} ambiguous strings ({self.ambiguous_places:,} places) left unmarked; "
                f"{share:.1%} of characters known")


def mark(texts: list[Sentence], matcher: Matcher, rest: str = "unknown") -> tuple[list[Sentence], MatchSummary]:
    """`texts` marked with the matcher's entities (their own tags and entities ignored), each keeping
    its line, document and extra keys; with `rest` "unknown" every character outside an entity is
    unknown (`Sentence.unknown`), with "o" it is O."""
    summary, marked = MatchSummary(), []
    for sent in texts:
        text = sent.text
        spans = []
        for start, end, typ in matcher.find(text):
            if typ is None:
                summary.ambiguous.add(text[start:end])
                summary.ambiguous_places += 1
            else:
                spans.append(Span(start, end, typ))
                summary.entities[typ] += 1
        unknown = None
        if rest == "unknown":
            known = [False] * len(text)
            for span in spans:
                known[span.start:span.end] = [True] * (span.end - span.start)
            unknown = unknown_regions(known)
            summary.known += sum(s.end - s.start for s in spans)
        else:
            summary.known += len(text)
        summary.sentences += 1
        summary.characters += len(text)
        marked.append(Sentence(list(text), spans_to_tags(len(text), spans, "bioes"), sent.line, sent.document,
                               extra=sent.extra, unknown=unknown))
    return marked, summary


def read_texts(path: Path) -> tuple[list[Sentence], str]:
    """The texts to mark and how their file was read: a labelled corpus's sentences (its labels
    to be ignored; `looks_like_corpus`), else plain text, a sentence a line (blank lines skipped)."""
    _check_file(path, "--text")
    if looks_like_corpus(path):
        corpus = read_corpus(path, strict=False, texts_only=True)
        return corpus.sentences, corpus.format
    texts = []
    for number, line in enumerate(read_text(path).split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            texts.append(Sentence(list(line), ["O"] * len(line), number))
    if not texts:
        raise CorpusError("the file has no text", where=str(path), fix="give --text one sentence a line")
    return texts, "inline"  # one sentence a line, as inline markup is: where a token's line is


def match_corpus(specs: list[str], text: Path, out: Path, to: str | None = None, rest: str = "unknown",
                 maps: list[str] = (), only_mapped: bool = False, ambiguous: str = "unknown",
                 min_length: int = DEFAULT_MIN_LENGTH) -> MatchSummary:
    """`nerkit data match`: mark `text` with the dictionary of `specs` (`read_dictionary`) and
    write it to `out` as `to` (OUTPUTS; default jsonl for .jsonl or .json, else BIO)."""
    renamed = parse_maps(list(maps))
    check_output(out, text, *(split_spec(s)[0] for s in specs))  # before the work: never over an input
    dictionary = read_dictionary(specs, renamed, only_mapped, min_length)
    texts, fmt = read_texts(text)
    marked, summary = mark(texts, Matcher(dictionary.words(ambiguous)), rest)
    write_corpus(out, marked, to or ("jsonl" if is_jsonl(out) else "bio"), text, fmt)
    return summary.noted(dictionary, min_length)


# ---------------------------------------------------------------------------------------------
# The unlabelled entity problem, simulated


def hide_entities(sentences: list[Sentence], fraction: float, seed: int) -> list[Sentence]:
    """`sentences` with round(fraction * total) of all their entities removed, the removed ones
    becoming O: a corpus that looks complete but is not. The entities are drawn uniformly over the
    whole corpus with `random.Random(seed)` (the same seed, the same ones); a sentence that loses
    none is returned as it is, the others as new Sentences (the input is not changed)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"the fraction of entities to hide must be within [0, 1], got {fraction}")
    spans = [sent.spans() for sent in sentences]
    places = [(i, j) for i, found in enumerate(spans) for j in range(len(found))]
    hidden: dict[int, set[int]] = {}
    for i, j in random.Random(seed).sample(places, round(fraction * len(places))):
        hidden.setdefault(i, set()).add(j)
    out = list(sentences)
    for i, gone in hidden.items():
        sent = sentences[i]
        kept = [span for j, span in enumerate(spans[i]) if j not in gone]
        if sent.nested:  # the tags are an outer projection: rebuilt from the entities kept
            rebuilt = span_sentence(sent.text, kept, sent.line)
            out[i] = replace(sent, tags=rebuilt.tags, entities=rebuilt.entities)
        else:
            tags = list(sent.tags)
            for j in gone:
                tags[spans[i][j].start:spans[i][j].end] = ["O"] * (spans[i][j].end - spans[i][j].start)
            out[i] = replace(sent, tags=tags)
    return out


def keep_types(sentences: list[Sentence], types) -> list[Sentence]:
    """`sentences` with the entities of `types` alone, the others removed and read as O (not marked
    unknown): a corpus labelled for some types, as the continual-NER protocol gives each step of
    adding types (`nerkit bench grow`). A sentence that loses none is returned as it is."""
    out = []
    for sent in sentences:
        spans = sent.spans()
        kept = [span for span in spans if span.type in types]
        if len(kept) == len(spans):
            out.append(sent)
            continue
        rebuilt = span_sentence(sent.text, kept, sent.line)
        out.append(replace(sent, tags=rebuilt.tags, entities=rebuilt.entities))
    return out
