"""nerkit.data.overlap: which lines of unlabelled text overlap a labelled set, against a brute-force
reference that compares every line with every sentence."""

from __future__ import annotations

import random

from nerkit.data.overlap import MIN_CHARS, OverlapIndex, remove_overlaps


def reference(lines: list[str], sentences: list[str], min_chars: int) -> tuple[list[bool], set[str]]:
    """Each line: does it contain a sentence or lie inside one (both at least min_chars, spaces ignored);
    and the sentences some line contains."""
    squeeze = lambda text: "".join(text.split())  # noqa: E731
    long = {squeeze(s) for s in sentences if len(squeeze(s)) >= min_chars}
    flags, found = [], set()
    for line in map(squeeze, lines):
        held = {s for s in long if s in line}
        found |= held
        flags.append(bool(held) or (len(line) >= min_chars and any(line in s for s in long)))
    return flags, found


def test_lines_that_hold_or_lie_inside_a_sentence_are_removed_as_brute_force_finds():
    rng = random.Random(3)
    alphabet = "甲乙丙丁戊己庚辛"  # few letters: many near misses
    sentences = ["".join(rng.choice(alphabet) for _ in range(rng.randint(4, 16))) for _ in range(60)]
    lines = []
    for _ in range(400):
        kind = rng.random()
        if kind < 0.3:  # a sentence inside other text, maybe with spaces in it
            s = rng.choice(sentences)
            cut = rng.randint(0, len(s))
            lines.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) + s[:cut] + " " + s[cut:])
        elif kind < 0.5:  # a piece of a sentence
            s = rng.choice(sentences)
            a = rng.randint(0, len(s) - 1)
            lines.append(s[a:rng.randint(a + 1, len(s))])
        else:
            lines.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))))
    for min_chars in (MIN_CHARS, 5):
        flags, found = reference(lines, sentences, min_chars)
        assert 20 < sum(flags) < len(lines) - 20  # the test holds both kinds
        kept, (report,) = remove_overlaps(lines, {"dev": sentences}, min_chars)
        assert kept == [line for line, flag in zip(lines, flags) if not flag]
        assert report.lines_removed == sum(flags) and report.found == len(found)
        index = OverlapIndex(sentences, min_chars)
        assert report.sentences == len(index.sentences) == len({s for s in sentences if len(s) >= min_chars})


def test_each_set_is_reported_on_its_own():
    dev, test = ["北京大学在海淀区的西边", "上海"], ["长江大桥今天正式通车了"]
    lines = ["昨天北京大学在海淀区的西边举行会议", "长江大桥今天正式通车", "与此无关的一行文字而已", "上海"]
    kept, reports = remove_overlaps(lines, {"dev": dev, "test": test})
    assert kept == ["与此无关的一行文字而已", "上海"]  # "上海" is shorter than MIN_CHARS: never compared
    assert [r.to_dict() for r in reports] == [
        {"set": "dev", "sentences": 1, "found_in_text": 1, "lines_removed": 1},
        {"set": "test", "sentences": 1, "found_in_text": 0, "lines_removed": 1}]


def test_lm_adapt_dry_run_reports_the_overlap_and_trains_nothing(tmp_path, nerkit):
    """`nerkit lm adapt --dry-run` prints what --exclude would take out of the text and what would
    train, loads no model (the --lm directory is empty) and writes no --out."""
    dev = tmp_path / "dev.bio"
    dev.write_text("".join(f"{c} O\n" for c in "新华社记者今天在北京报道") + "\n"
                   + "".join(f"{c} O\n" for c in "这句话不在文本里出现过") + "\n", encoding="utf-8")
    text = tmp_path / "text.txt"
    lines = ["据新华社记者今天在北京报道，会议开幕。", "新华社记者今天在北", "这是一行与开发集无关的普通文本。"]
    text.write_text("\n".join(lines + [f"第{i}行与评测集无关的文本内容" for i in range(17)]) + "\n", encoding="utf-8")
    lm, out = tmp_path / "lm", tmp_path / "out"
    lm.mkdir()
    shown = nerkit("lm", "adapt", "--lm", str(lm), "--text", str(text), "--exclude", str(dev), "--out", str(out),
                   "--dry-run").stdout
    assert f"{text}: 20 non-empty lines, 18 left" in shown
    assert f"| {dev} | 2 | 1 (50.0%) | 2 |" in shown
    assert "train on 17 lines and hold out 1 for the perplexity" in shown
    assert not out.exists()
