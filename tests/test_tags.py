"""nerkit.data.tags, the one home of the tag-scheme rules, against the tests' independent reference:
the transition table (the CRF's masks), `transition_problems` (corpus checking) and `continues`
(stitching, inserted spaces) agree with the schemes' definitions on every short path."""

from __future__ import annotations

import itertools

import pytest
from scheme_reference import is_valid_path

from nerkit.data.tags import (
    Span,
    continues,
    scheme_tags,
    transition_problems,
    transition_table,
)

TAG_SETS = {
    "bio": scheme_tags(["LOC", "PER"], "bio"),
    "bioes": scheme_tags(["LOC", "PER"], "bioes"),
    "bmes": scheme_tags(["LOC", "PER"], "bmes"),
    "hyphen-type": ["S-ORG-X", "B-LOC", "O", "E-ORG-X", "I-LOC", "B-ORG-X", "E-LOC", "I-ORG-X", "S-LOC"],
}


def table_allows(tags: list[str], path: list[str]) -> bool:
    start_ok, trans_ok, end_ok = transition_table(tags)
    ids = [tags.index(t) for t in path]
    return (start_ok[ids[0]] and end_ok[ids[-1]]
            and all(trans_ok[a][b] for a, b in zip(ids, ids[1:])))


@pytest.mark.parametrize("name", TAG_SETS)
def test_the_transition_table_is_the_schemes_definition(name):
    tags = TAG_SETS[name]
    for length in (1, 2, 3):
        for path in itertools.product(tags, repeat=length):
            assert table_allows(tags, list(path)) == is_valid_path(tags, list(path)), path


@pytest.mark.parametrize("name", ["bio", "bioes", "bmes"])
def test_transition_problems_finds_exactly_the_invalid_paths(name):
    tags = TAG_SETS[name]
    for length in (1, 2, 3):
        for path in itertools.product(tags, repeat=length):
            assert (not list(transition_problems(list(path), name))) == is_valid_path(tags, list(path)), path


def test_continues_is_true_only_inside_an_entity():
    assert [continues(t) for t in ["O", "B-X", "I-X", "M-X", "E-X", "S-X"]] == [False, False, True, True, True, False]


def test_the_table_refuses_what_is_not_a_tag_set():
    with pytest.raises(ValueError, match="empty"):
        transition_table([])
    with pytest.raises(ValueError, match="duplicate"):
        transition_table(["O", "O"])
    with pytest.raises(ValueError, match="unknown tag 'X-PER'"):
        transition_table(["O", "X-PER"])


def test_a_span_is_written_one_way():
    assert Span(0, 2, "PER").to_dict("张三在") == {"start": 0, "end": 2, "type": "PER", "text": "张三"}
    assert Span(1, 3, "LOC").to_dict() == {"start": 1, "end": 3, "type": "LOC"}
