"""A lexicon of a domain's own words, and how well a lexicon suits a corpus: `nerkit lexicon build`
mines words from raw text (nerkit.features.lexicon_mining), optionally with jieba's dictionary, and
writes a word list that `lexicon.source` reads; `nerkit lexicon coverage` counts the gold entities a
lexicon holds and how many of its lattice matches fall on entity boundaries.

Both read a training config as `nerkit train` does (`--config`): `build` mines the text of its
training split after the dev carve-out (never dev or test text, the rule every vocabulary of nerkit
keeps), `coverage` scores the config's lexicon on its dev and test splits; `nerkit bench` records the
same coverage for every run with a lexicon (`lexicon_record`)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from nerkit.config import Config, load_config
from nerkit.data.corpus import read_corpus
from nerkit.data.records import Sentence
from nerkit.errors import UserError
from nerkit.features.lexicon import Lexicon
from nerkit.features.lexicon_mining import (
    DEFAULT_MAX_LEN,
    DEFAULT_MIN_COHESION,
    DEFAULT_MIN_COUNT,
    DEFAULT_MIN_FREEDOM,
    TextCodes,
    discover,
)
from nerkit.files import atomic_file, check_input, check_output
from nerkit.log import progress_display


def check_new_output(out: str | Path, inputs: Iterable[str | Path], force: bool) -> None:
    """Refuse to write `out` over a file the user has (unless `force`) or over an input."""
    check_output(out, *inputs)
    if Path(out).exists() and not force:
        raise UserError("the file exists", where=str(out), fix="choose another --out, or pass --force to replace it")


def read_lines(paths: list[Path], desc: str) -> Iterator[str]:
    """The lines of plain UTF-8 text files, one at a time (a BOM and line ends removed), with a
    progress display over their bytes."""
    for path in paths:
        check_input(str(path), "--text", "no such file")
    shown = progress_display(desc, sum(p.stat().st_size for p in paths), "B", unit_scale=True)
    try:
        for path in paths:
            with path.open("rb") as handle:
                for number, raw in enumerate(handle, 1):
                    shown.update(len(raw))
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise UserError("not valid UTF-8", where=f"{path}:{number}",
                                        fix="convert the file to UTF-8") from None
                    yield (line.removeprefix("\ufeff") if number == 1 else line).rstrip("\r\n")
    finally:
        shown.close()


def training_split(config_path: str | Path, sets: Iterable[str] = ()) -> tuple[Config, list[str], int]:
    """The config (with `sets` applied) and the text of its training split, one sentence a line, as
    training takes it (`data.limit`, then the dev carve-out: nerkit.data.splits.train_and_dev), with
    the number of dev sentences left out. Whole sentences: neither cut at `data.max_len` (a cut is
    no word boundary) nor with `data.insert_spaces`' spaces (they would split words)."""
    from nerkit.data.splits import check_data_files, train_and_dev

    config = load_config(config_path, list(sets))
    check_data_files(config)
    _, train, dev = train_and_dev(config)
    return config, [s.text for s in train], 0 if config.data.dev else len(dev)


def build_lexicon(texts: list[Path], out: Path, *, config: str | Path | None = None, sets: Iterable[str] = (),
                  max_len: int = DEFAULT_MAX_LEN, min_count: int = DEFAULT_MIN_COUNT,
                  min_cohesion: float = DEFAULT_MIN_COHESION, min_freedom: float = DEFAULT_MIN_FREEDOM,
                  merge_jieba: bool = False, normalize: bool | None = None, force: bool = False) -> dict:
    """Mine the words of `texts` and of the training split of `config` (`training_split`) and write
    them to `out`, `word<TAB>count` per line (the count in the text), best score first; with
    `merge_jieba`, jieba's words not mined follow, with their count in the text (0 for most), most
    frequent first. `normalize`: None is the config's `data.normalize` (without a config: on).
    Returns a summary for the command line.

    Why `--config` rather than an `--exclude` of dev lines (as `nerkit lm adapt` has): a carved dev
    split exists only inside nerkit (a seeded shuffle of the training file), so a user could not
    write the lines to exclude without redoing the carve, and an exclusion by line would also drop
    training sentences that repeat a dev one. Reading the config, as spaCy's `init labels` and
    `debug data` read the corpora of theirs, mines exactly the sentences the model trains on."""
    if not texts and config is None:
        raise UserError("nothing to mine", fix="give --text FILE (raw text) or --config CONFIG (its training split)")
    if max_len < 2:
        raise UserError(f"--max-len must be 2 or more, got {max_len}", fix="words have two characters at least")
    if min_count < 1:
        raise UserError(f"--min-count must be 1 or more, got {min_count}", fix="set --min-count 1 or more")
    train_lines, dev_left_out, inputs = [], 0, list(texts)
    if config is not None:
        loaded, train_lines, dev_left_out = training_split(config, sets)
        normalize = loaded.data.normalize if normalize is None else normalize
        inputs += [config, *(f for f in (loaded.data.train, loaded.data.dev, loaded.data.test) if f)]
    normalize = True if normalize is None else normalize
    check_new_output(out, inputs, force)
    started = time.monotonic()
    text = TextCodes(normalize)
    for line in all_lines(texts, train_lines, "lexicon: reading"):
        text.add_line(line)
    shown = progress_display("lexicon: scoring n-grams", max_len, "length")
    try:
        words = discover(text, max_len, min_count, min_cohesion, min_freedom, step=lambda: shown.update(1))
    finally:
        shown.close()
    rows = [(c.word, c.count) for c in words]
    jieba_added = 0
    if merge_jieba:
        extra = jieba_counts(texts, train_lines, {c.word for c in words}, normalize)
        jieba_added = len(extra)
        rows += sorted(extra.items(), key=lambda item: (-item[1], item[0]))
    with atomic_file(out) as handle:
        handle.write("".join(f"{word}\t{count}\n" for word, count in rows).encode("utf-8"))
    return {"characters": len(text) - text.codes.count(0), "mined": len(words), "jieba": jieba_added,
            "words": len(rows), "seconds": round(time.monotonic() - started, 2), "out": str(out),
            "training_sentences": len(train_lines), "dev_left_out": dev_left_out}


def all_lines(texts: list[Path], train_lines: list[str], desc: str) -> Iterator[str]:
    """The lines of the text files, then the training split's."""
    if texts:
        yield from read_lines(texts, desc)
    yield from train_lines


def jieba_counts(texts: list[Path], train_lines: list[str], mined: set[str], normalize: bool) -> dict[str, int]:
    """jieba's dictionary words (of two characters or more) not in `mined`, each with its count in
    the texts as the lattice matches it."""
    jieba = Lexicon.from_jieba()
    counts = Counter()
    codes = TextCodes(normalize)  # only for its normalisation
    for line in all_lines(texts, train_lines, "lexicon: counting jieba's words"):
        counts.update(word for _, _, word in jieba.match(codes.normalized(line)))
    return {word: counts[word] for word in jieba if word not in mined}


# ---- coverage -----------------------------------------------------------------------------------


def lexicon_coverage(words: str | Path, data: Path, normalize: bool = True, repair: bool = False) -> dict:
    """How well the lexicon `words` fits the corpus `data` (`coverage_of`), with their names."""
    lexicon = Lexicon.from_source(str(words))
    corpus = read_corpus(data, repair=repair, repair_option="pass --repair")
    return {"lexicon": str(words), "words": len(lexicon), "single_character_words": single_character_words(lexicon),
            "corpus": str(data), **coverage_of(lexicon, corpus.sentences, normalize)}


def single_character_words(lexicon: Lexicon) -> int:
    """How many words of the lexicon are one character: without any, no entity of one character can
    be held."""
    return sum(len(word) == 1 for word in lexicon)


def coverage_of(lexicon: Lexicon, sentences: list[Sentence], normalize: bool) -> dict:
    """Entities: how many gold entities (by type; nested ones too) are a word of the lexicon,
    exactly (`HELD`), and how many are a single character. Matches: every occurrence of a lexicon
    word in the sentences' text, as FLAT's lattice takes them (`Lexicon.match`, no cap), and how
    many are exactly an entity, start where an entity starts, end where one ends, both, or cross an
    entity (overlap it without either holding the other: a lattice node that contradicts the gold
    boundary)."""
    codes = TextCodes(normalize)
    types: dict[str, Counter] = {}
    matches = Counter()
    characters = 0
    for sentence in sentences:
        text = codes.normalized(sentence.text)  # one character per token, as the reader checks
        characters += len(text)
        spans = sentence.spans()
        for span in spans:
            counted = types.setdefault(span.type, Counter())
            counted["entities"] += 1
            counted["held"] += text[span.start:span.end] in lexicon
            counted["single_character"] += span.end - span.start == 1
        _count_matches(lexicon.match(text), spans, matches, types)
    total = Counter()
    for counted in types.values():
        total.update(counted)
    return {"sentences": len(sentences), "characters": characters,
            "entities": {"total": total["entities"], "held": total["held"], "single_character": total["single_character"],
                         "by_type": {t: {"entities": c["entities"], "held": c["held"], "matched": c["matched"]}
                                     for t, c in sorted(types.items())}},
            "matches": {key: matches[key] for key in ("total", "exact", "start", "end", "both", "crossing")}}


def source_sha256(source: str) -> str:
    """sha256 of the file a lexicon source names (jieba: its bundled dict.txt), as `sha256sum` gives."""
    from nerkit.data.stats import sha256_file
    from nerkit.features.lexicon import jieba_dict_path

    return sha256_file(jieba_dict_path() if source == "jieba" else source)


def lexicon_record(lexicon: Lexicon, source: str, splits: dict[str, list[Sentence] | None], normalize: bool) -> dict:
    """What a record says of a run's lexicon: its source and that file's sha256, its words (after
    lexicon.min_len / max_len / min_freq) and their sha256 (`Lexicon.fingerprint`, the one a model
    directory checks), and its coverage of each split (`coverage_of`; a split that is None is left
    out)."""
    return {"source": source, "sha256": source_sha256(source), "words": len(lexicon),
            "single_character_words": single_character_words(lexicon), "words_sha256": lexicon.fingerprint,
            "coverage": {name: coverage_of(lexicon, sentences, normalize)
                         for name, sentences in splits.items() if sentences is not None}}


def config_coverage(config_path: str | Path, sets: Iterable[str] = (), words: str | None = None) -> dict:
    """The lexicon of a training config (or `words`, filtered by its lexicon section) on the
    config's dev split (carved as training carves it) and test split: `lexicon_record`."""
    from nerkit.data.splits import TRAIN_REPAIR_OPTION, check_data_files, read_gold, train_and_dev

    config = load_config(config_path, list(sets))
    check_data_files(config)
    source = words or config.lexicon.source
    lexicon = Lexicon.from_config(config.lexicon, source)
    _, _, dev = train_and_dev(config)
    test = read_gold(config.data.test, config.data.repair, TRAIN_REPAIR_OPTION).sentences if config.data.test else None
    return {"config": str(config_path), **lexicon_record(lexicon, source, {"dev": dev, "test": test},
                                                          config.data.normalize)}


def _count_matches(found: list[tuple[int, int, str]], spans, matches: Counter, types: dict[str, Counter]) -> None:
    starts = {s.start for s in spans}
    ends = {s.end for s in spans}
    exact = {(s.start, s.end): s.type for s in spans}
    for start, end, _ in found:
        matches["total"] += 1
        kind = exact.get((start, end))
        if kind is not None:
            matches["exact"] += 1
            types[kind]["matched"] += 1
        matches["start"] += start in starts
        matches["end"] += end in ends
        matches["both"] += start in starts and end in ends
        matches["crossing"] += any(s.start < start < s.end < end or start < s.start < end < s.end for s in spans)


# What "held" means, printed under the tables.
HELD = ("held: a gold entity whose text is exactly a word of the lexicon (only a held entity can be one node of "
        "FLAT's lattice)")


def format_coverage(report: dict) -> str:
    """The report as two tables: entities held by type, then the matches' boundaries. Under the first,
    when the lexicon has no word of one character, the share of entities that are one character: no
    such lexicon can hold them."""
    from nerkit.inference.evaluate import _rule_table

    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:.2f}" if whole else "-"

    entities = report["entities"]
    rows = [("type", "entities", "held", "held %")]
    for kind, c in entities["by_type"].items():
        rows.append((kind, str(c["entities"]), str(c["held"]), pct(c["held"], c["entities"])))
    rows.append(("overall", str(entities["total"]), str(entities["held"]), pct(entities["held"], entities["total"])))
    held = _rule_table(rows)
    if entities["single_character"] and not report["single_character_words"]:
        held += (f"\n{pct(entities['single_character'], entities['total'])}% of entities "
                 f"({entities['single_character']:,} of {entities['total']:,}) are a single character and cannot "
                 "be held by this lexicon (it has no single-character words)")
    m = report["matches"]
    match_rows = [("lexicon matches", "count", "% of matches")]
    for key, label in (("total", "all"), ("exact", "exactly an entity"), ("start", "start at an entity start"),
                       ("end", "end at an entity end"), ("both", "both"), ("crossing", "cross an entity")):
        match_rows.append((label, str(m[key]), pct(m[key], m["total"])))
    head = (f"{report['lexicon']}: {report['words']:,} words; {report['corpus']}: {report['sentences']:,} sentences, "
            f"{report['characters']:,} characters, {m['total'] / max(report['characters'], 1):.2f} matches per character")
    return "\n\n".join([head, held, _rule_table(match_rows, total=False)])


def format_config_coverage(report: dict) -> str:
    """`config_coverage`'s report: `format_coverage`'s tables for each split."""
    return "\n\n".join(format_coverage({"lexicon": report["source"], "words": report["words"],
                                         "single_character_words": report["single_character_words"],
                                         "corpus": f"{report['config']} {split} split", **coverage})
                        for split, coverage in report["coverage"].items())


def coverage_report(words: str | None, data: Path | None, config: Path | None, sets: Iterable[str] = (),
                    normalize: bool = True, repair: bool = False) -> dict:
    """`nerkit lexicon coverage`: of a corpus file (`lexicon_coverage`) or of a config's dev and test
    splits (`config_coverage`), exactly one of `data` and `config`."""
    if (data is None) == (config is None):
        raise UserError("give one of --data CORPUS and --config CONFIG",
                        fix="--data scores a corpus file; --config a training config's dev and test splits")
    if config is not None:
        return config_coverage(config, sets, words)
    if words is None:
        raise UserError("which lexicon? give WORDS (a word list, a word2vec file or jieba)",
                        fix="e.g. nerkit lexicon coverage jieba --data dev.jsonl")
    return lexicon_coverage(words, data, normalize=normalize, repair=repair)


def format_report(report: dict) -> str:
    """`coverage_report`'s report as tables, then what "held" means."""
    tables = format_config_coverage(report) if "config" in report else format_coverage(report)
    return f"{tables}\n\n{HELD}"
