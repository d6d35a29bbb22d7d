"""Tests for nerkit.inference.evaluate: `score` equals an independent port of conlleval's chunk counting and
seqeval's default (conlleval-like) mode, and `nerkit eval --output` writes a file whose conlleval
score equals the `--json` figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from seqeval.metrics import f1_score, precision_score, recall_score

from nerkit.data.tags import Span, tags_to_spans
from nerkit.inference.evaluate import (
    ERROR_KINDS,
    errors,
    format_errors,
    format_table,
    score,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# ---------------------------------------------------------------------- conlleval, ported independently
# The chunk rules of conlleval.pl (CoNLL-2000) as extended to S- tags by the Python ports
# (sighsmile/conlleval): a chunk ends before a token when the previous one was E or S, on B|I -> B|S|O,
# or when the type changes; a chunk starts at B or S, at I|E after O|E|S, or when the type changes. A
# chunk counts as correct only if gold and guess start together with the same type and end together.
# BMES's M- is conlleval's I-.


def _split(tag: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return ("I" if prefix == "M" else prefix), kind


def end_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    return (prev_tag in ("E", "S")
            or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
            or (prev_tag != "O" and prev_type != type_))


def start_of_chunk(prev_tag, tag, prev_type, type_) -> bool:
    return (tag in ("B", "S")
            or (prev_tag in ("E", "S", "O") and tag in ("I", "E"))
            or (tag != "O" and prev_type != type_))


def conlleval(gold: list[list[str]], guess: list[list[str]]) -> dict:
    """{"correct", "found_gold", "found_guess"} overall and per type, as conlleval counts them."""
    counts = {"": [0, 0, 0]}  # type ("" = overall) -> [correct, found_gold, found_guess]

    def add(kind, i):
        for key in ("", kind):
            counts.setdefault(key, [0, 0, 0])[i] += 1

    for gold_tags, guess_tags in zip(gold, guess):
        in_correct = False
        last_gold, last_guess, last_gold_type, last_guess_type = "O", "O", "", ""
        for g_tag, p_tag in zip(gold_tags + ["O"], guess_tags + ["O"]):  # the boundary acts as "O O"
            gold_tag, gold_type = _split(g_tag)
            guess_tag, guess_type = _split(p_tag)
            end_gold = end_of_chunk(last_gold, gold_tag, last_gold_type, gold_type)
            end_guess = end_of_chunk(last_guess, guess_tag, last_guess_type, guess_type)
            start_gold = start_of_chunk(last_gold, gold_tag, last_gold_type, gold_type)
            start_guess = start_of_chunk(last_guess, guess_tag, last_guess_type, guess_type)
            if in_correct:
                if end_gold and end_guess and last_guess_type == last_gold_type:
                    in_correct = False
                    add(last_gold_type, 0)
                elif end_gold != end_guess or guess_type != gold_type:
                    in_correct = False
            if start_gold and start_guess and guess_type == gold_type:
                in_correct = True
            if start_gold:
                add(gold_type, 1)
            if start_guess:
                add(guess_type, 2)
            last_gold, last_guess, last_gold_type, last_guess_type = gold_tag, guess_tag, gold_type, guess_type
    return counts


def prf(correct: int, gold: int, guess: int) -> tuple[float, float, float]:
    p = correct / guess if guess else 0.0
    r = correct / gold if gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def nerkit_score(gold: list[list[str]], guess: list[list[str]]) -> dict:
    return score([tags_to_spans(t) for t in gold], [tags_to_spans(t) for t in guess])


def assert_equals_conlleval(gold, guess) -> dict:
    ours = nerkit_score(gold, guess)
    reference = conlleval(gold, guess)
    correct, found_gold, found_guess = reference[""]
    assert ours["counts"] == {"correct": correct, "predicted": found_guess, "gold": found_gold}
    for ours_value, ref_value in zip((ours["precision"], ours["recall"], ours["f1"]), prf(correct, found_gold, found_guess)):
        assert ours_value == pytest.approx(ref_value, abs=1e-4)
    for kind, (c, g, p) in reference.items():
        if kind:
            m = ours["per_type"][kind]
            assert (m["precision"], m["recall"], m["f1"]) == pytest.approx(prf(c, g, p), abs=1e-4)
            assert m["support"] == g
    assert set(ours["per_type"]) == {k for k in reference if k}
    return ours


# (name, gold sentences, guessed sentences)
HAND_MADE = [
    ("bio exact", [["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-LOC"]]),
    ("bio boundary errors", [["B-PER", "I-PER", "I-PER", "O", "B-LOC", "I-LOC"]],
     [["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"]]),
    ("orphan I- in the guess", [["O", "B-PER", "I-PER", "O"]], [["O", "I-PER", "I-PER", "O"]]),
    ("orphan I- at the start", [["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]),
    ("orphan I- in gold", [["O", "I-LOC", "O", "B-PER"]], [["O", "B-LOC", "O", "B-PER"]]),
    ("type switch inside an entity", [["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-LOC", "I-LOC"]]),
    ("type switch splits in two", [["B-PER", "B-LOC", "I-LOC"]], [["B-PER", "I-LOC", "I-LOC"]]),
    ("adjacent entities B B", [["B-PER", "B-PER", "I-PER"]], [["B-PER", "I-PER", "I-PER"]]),
    ("adjacent entities of different types", [["B-ORG", "I-ORG", "B-LOC", "I-LOC"]],
     [["B-ORG", "I-ORG", "B-LOC", "I-LOC"]]),
    ("entity at sentence end", [["O", "B-LOC", "I-LOC"], ["B-PER"]], [["O", "B-LOC", "I-LOC"], ["B-PER"]]),
    ("bioes exact", [["B-PER", "I-PER", "E-PER", "S-LOC", "O"]], [["B-PER", "I-PER", "E-PER", "S-LOC", "O"]]),
    ("bioes adjacent singles", [["S-PER", "S-PER", "B-LOC", "E-LOC"]], [["S-PER", "B-PER", "E-LOC", "E-LOC"]]),
    ("bioes E E and S I", [["B-PER", "E-PER", "E-PER", "S-ORG", "I-ORG", "E-ORG"]],
     [["B-PER", "E-PER", "O", "S-ORG", "B-ORG", "E-ORG"]]),
    ("bioes unclosed B", [["B-PER", "I-PER", "O", "B-LOC", "E-LOC"]], [["B-PER", "I-PER", "O", "B-LOC", "O"]]),
    ("bioes orphan E", [["O", "E-PER", "O"]], [["O", "S-PER", "O"]]),
    ("bmes exact", [["B-NR", "M-NR", "E-NR", "O", "S-NS"]], [["B-NR", "M-NR", "E-NR", "O", "S-NS"]]),
    ("bmes boundary and type errors", [["B-NT", "M-NT", "M-NT", "E-NT", "O", "B-NS", "E-NS"]],
     [["B-NT", "M-NT", "E-NT", "S-NT", "O", "B-NR", "E-NR"]]),
    ("bmes orphan M and type switch", [["O", "M-NR", "E-NR", "B-NS", "M-NT", "E-NT"]],
     [["O", "B-NR", "E-NR", "B-NS", "M-NS", "E-NS"]]),
    ("nothing guessed", [["B-PER", "I-PER"]], [["O", "O"]]),
    ("nothing in gold", [["O", "O", "O"]], [["B-PER", "O", "S-LOC"]]),
    ("no entities at all", [["O"]], [["O"]]),
    ("several sentences", [["B-PER", "O"], ["O", "S-LOC"], ["B-ORG", "E-ORG", "O"]],
     [["B-PER", "O"], ["S-LOC", "S-LOC"], ["B-ORG", "I-ORG", "E-ORG"]]),
]


@pytest.mark.parametrize("name, gold, guess", HAND_MADE, ids=[case[0] for case in HAND_MADE])
def test_score_equals_conlleval_on_hand_made_sequences(name, gold, guess):
    assert_equals_conlleval(gold, guess)


def test_the_conlleval_port_counts_what_conlleval_counts():
    # Known answers, so the port itself is pinned: an orphan I- opens a chunk, a type switch splits one.
    assert conlleval([["O", "I-PER", "I-PER"]], [["O", "B-PER", "I-PER"]])[""] == [1, 1, 1]
    assert conlleval([["B-PER", "I-LOC"]], [["B-PER", "I-PER"]])[""] == [0, 2, 1]
    assert conlleval([["S-PER", "S-PER"]], [["B-PER", "E-PER"]])[""] == [0, 2, 1]
    assert conlleval([["B-NR", "M-NR", "E-NR"]], [["B-NR", "M-NR", "E-NR"]])[""] == [1, 1, 1]
    result = nerkit_score([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "O", "O", "B-LOC"]])
    assert (result["precision"], result["recall"]) == (0.5, 0.5)


TYPES = ["PER", "LOC", "ORG-X"]  # a hyphen inside a type name too


def tag_sequences(prefixes: str):
    tag = st.one_of(st.just("O"), st.builds(lambda p, t: f"{p}-{t}", st.sampled_from(list(prefixes)), st.sampled_from(TYPES)))
    return st.lists(st.lists(tag, min_size=1, max_size=12), min_size=1, max_size=6)


@st.composite
def gold_and_guess(draw):
    prefixes = draw(st.sampled_from(["BI", "BIES", "BMES"]))
    gold = draw(tag_sequences(prefixes))
    guess = [draw(st.lists(st.sampled_from(["O"] + [f"{p}-{t}" for p in prefixes for t in TYPES]),
                           min_size=len(g), max_size=len(g))) for g in gold]
    # Half the time, make the guess a small edit of gold so that many chunks match.
    if draw(st.booleans()):
        guess = [[g_tag if draw(st.integers(0, 4)) else p_tag for g_tag, p_tag in zip(g, p)] for g, p in zip(gold, guess)]
    return gold, guess


@settings(max_examples=200, deadline=None)
@given(gold_and_guess())
def test_score_equals_conlleval_on_random_sequences(pair):
    assert_equals_conlleval(*pair)


def to_bioes(tags: list[str]) -> list[str]:
    return [("I" + t[1:]) if t.startswith("M-") else t for t in tags]


@settings(max_examples=200, deadline=None)
@given(gold_and_guess())
def test_score_equals_seqeval_default_mode(pair):
    gold, guess = ([to_bioes(t) for t in side] for side in pair)
    ours = nerkit_score(gold, guess)
    assert ours["precision"] == pytest.approx(precision_score(gold, guess, zero_division=0), abs=1e-4)
    assert ours["recall"] == pytest.approx(recall_score(gold, guess, zero_division=0), abs=1e-4)
    assert ours["f1"] == pytest.approx(f1_score(gold, guess, zero_division=0), abs=1e-4)


def test_score_counts_duplicate_spans_once_and_checks_lengths():
    assert nerkit_score([["B-PER"]], [["B-PER"]])["f1"] == 1.0
    with pytest.raises(ValueError):
        score([[]], [])


def test_format_table_shows_percentages_per_type_and_overall():
    table = format_table(nerkit_score([["B-PER", "O", "B-LOC"]], [["B-PER", "O", "O"]]))
    lines = table.splitlines()
    assert lines[0].split() == ["type", "precision", "recall", "f1", "support"]
    assert lines[-1].split() == ["overall", "100.00", "50.00", "66.67", "2"]
    assert any(line.split() == ["LOC", "0.00", "0.00", "0.00", "1"] for line in lines)


# ------------------------------------------------------------------------------- error breakdown


def test_errors_sorts_each_gold_entity_into_one_kind():
    gold = [[Span(0, 2, "PER"), Span(3, 5, "LOC"), Span(6, 9, "ORG"), Span(10, 12, "PER"), Span(13, 15, "LOC")],
            [Span(0, 3, "ORG")]]
    guess = [[Span(0, 2, "PER"),  # correct
              Span(3, 5, "ORG"),  # LOC with the right boundaries, wrong type
              Span(6, 8, "ORG"),  # ORG cut short
              Span(10, 13, "LOC"),  # PER overlapped by another type, other boundaries: both wrong
              Span(16, 18, "PER")],  # LOC at 13-15 missed; this one overlaps no gold entity: spurious
             [Span(0, 3, "LOC"), Span(1, 2, "ORG")]]  # same boundaries, other type wins over an inner ORG
    got = errors(gold, guess)
    assert got == {
        "LOC": {"correct": 0, "wrong_type": 1, "wrong_boundary": 0, "wrong_both": 0, "missed": 1, "spurious": 0},
        "ORG": {"correct": 0, "wrong_type": 1, "wrong_boundary": 1, "wrong_both": 0, "missed": 0, "spurious": 0},
        "PER": {"correct": 1, "wrong_type": 0, "wrong_boundary": 0, "wrong_both": 1, "missed": 0, "spurious": 1},
    }
    table = format_errors(got).splitlines()
    assert table[0].split() == ["type", "gold", "correct", "wrong", "type", "wrong", "boundary", "wrong", "both",
                                "missed", "spurious"]
    assert table[-1].split() == ["overall", "6", "1", "2", "1", "1", "1", "1"]
    with pytest.raises(ValueError):
        errors([[]], [])


@settings(max_examples=200, deadline=None)
@given(gold_and_guess())
def test_errors_account_for_every_gold_entity_and_agree_with_score(pair):
    gold, guess = ([tags_to_spans(t) for t in side] for side in pair)
    breakdown, metrics = errors(gold, guess), score(gold, guess)
    for type_, m in metrics["per_type"].items():
        kinds = breakdown.get(type_, dict.fromkeys(ERROR_KINDS, 0))
        assert sum(kinds[k] for k in ERROR_KINDS[:5]) == m["support"]
        assert kinds["correct"] == round(m["recall"] * m["support"])
    correct = sum(k["correct"] for k in breakdown.values())
    assert correct == metrics["counts"]["correct"]
    # a spurious prediction is a wrong one, and no wrong one that touches gold is called spurious
    spurious = sum(k["spurious"] for k in breakdown.values())
    touching = sum(1 for g, p in zip(gold, guess) for s in set(p)
                   if any(t.start < s.end and s.start < t.end for t in set(g)))
    assert spurious == metrics["counts"]["predicted"] - touching


def test_eval_errors_from_the_command_line_and_the_api(tiny_model_dir, monkeypatch, capfd):
    import nerkit

    data = str(FIXTURES / "tiny_dev.bio")
    code, out, err = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data", data,
                             "--json", "--errors")
    assert code == 0, err
    figures = json.loads(out)
    assert figures["errors"] == nerkit.load(tiny_model_dir).evaluate(data, with_errors=True)["errors"]
    for type_, kinds in figures["errors"].items():
        if type_ in figures["per_type"]:
            assert sum(kinds[k] for k in ERROR_KINDS[:5]) == figures["per_type"][type_]["support"]
    code, out, err = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data", data, "--errors")
    assert code == 0, err
    assert "wrong boundary" in out and out.splitlines()[-1].split()[0] == "overall"


# ------------------------------------------------------------------------------- nerkit eval --output


def read_eval_output(path: Path) -> tuple[list[list[str]], list[list[str]], list[str]]:
    gold, guess, chars = [[]], [[]], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line:
            if gold[-1]:
                gold.append([])
                guess.append([])
            continue
        char, g, p = line.split(" ")
        chars.append(char)
        gold[-1].append(g)
        guess[-1].append(p)
    return gold[:-1], guess[:-1], chars


@pytest.mark.parametrize("data", ["tiny_dev.bio", "tiny_dev.bmes"])
def test_eval_output_file_scores_as_the_json_says(tiny_model_dir, tmp_path, monkeypatch, capfd, data):
    output = tmp_path / "eval.txt"
    code, out, err = run_cli(monkeypatch, capfd, "eval", "--model", str(tiny_model_dir), "--data",
                             str(FIXTURES / data), "--json", "--output", str(output))
    assert code == 0, err
    figures = json.loads(out)
    gold, guess, chars = read_eval_output(output)
    corpus_chars = [line.split(" ")[0] for line in (FIXTURES / data).read_text(encoding="utf-8").splitlines() if line]
    assert chars == corpus_chars
    assert len(gold) == 16
    prefixes = {t[0] for s in gold + guess for t in s}
    assert prefixes <= (set("OBMES") if data.endswith(".bmes") else set("OBI"))  # the gold file's scheme
    correct, found_gold, found_guess = conlleval(gold, guess)[""]
    p, r, f = prf(correct, found_gold, found_guess)
    assert correct > 0 and found_guess > 0
    assert abs(100 * figures["precision"] - 100 * p) < 0.01
    assert abs(100 * figures["recall"] - 100 * r) < 0.01
    assert abs(100 * figures["f1"] - 100 * f) < 0.01


def test_by_length_scores_each_sentence_and_entity_length_on_its_own():
    from nerkit.inference.evaluate import by_length, length_buckets

    assert [label for label, _, _ in length_buckets((1, 2, 4))] == ["1", "2", "3-4", ">4"]
    gold = [[Span(0, 2, "PER")], [Span(0, 3, "ORG"), Span(5, 6, "LOC")], [Span(10, 12, "PER")]]
    predicted = [[Span(0, 2, "PER")], [Span(0, 3, "ORG"), Span(6, 7, "LOC")], [Span(10, 11, "PER")]]
    found = by_length(gold, predicted, [20, 60, 300], sentence_bounds=(50, 250), entity_bounds=(1, 2))
    rows = {r["length"]: r for r in found["sentence"]}
    assert list(rows) == ["1-50", "51-250", ">250", "1-250"]
    assert (rows["1-50"]["sentences"], rows["1-50"]["f1"]) == (1, 1.0)
    assert (rows["51-250"]["gold"], rows["51-250"]["precision"]) == (2, 0.5)
    assert (rows[">250"]["characters"], rows[">250"]["f1"]) == (300, 0.0)
    assert (rows["1-250"]["sentences"], rows["1-250"]["gold"], rows["1-250"]["recall"]) == (2, 3, 2 / 3)
    entities = {r["length"]: r for r in found["entity"]}
    assert (entities["1"]["gold"], entities["1"]["predicted"], entities["1"]["precision"]) == (1, 2, 0.0)
    assert (entities["2"]["gold"], entities["2"]["recall"], entities["2"]["precision"]) == (2, 0.5, 1.0)
    assert (entities[">2"]["gold"], entities[">2"]["f1"]) == (1, 1.0)


def test_eval_by_length_prints_and_returns_the_buckets(tiny_model_dir, nerkit):
    dev = FIXTURES / "tiny_dev.bio"
    table = nerkit("eval", "--model", str(tiny_model_dir), "--data", str(dev), "--by-length").stdout
    assert "sentence length" in table and "entity length" in table and "1-50" in table
    metrics = json.loads(nerkit("eval", "--model", str(tiny_model_dir), "--data", str(dev), "--by-length",
                                "--json").stdout)
    rows = metrics["by_length"]["sentence"]
    assert sum(r["gold"] for r in rows if r["length"] != "1-250") == metrics["counts"]["gold"]
    assert sum(r["predicted"] for r in metrics["by_length"]["entity"]) == metrics["counts"]["predicted"]
