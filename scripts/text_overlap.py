"""How much of an unlabelled text overlaps evaluation sets: the report `nerkit lm adapt --exclude`
makes before it trains, without training (nerkit.data.overlap). Prints a Markdown table.

    python scripts/text_overlap.py --text msra_train.txt --exclude configs/msra_lm_crf.yaml
    python scripts/text_overlap.py --text pd_train.txt --exclude $NERKIT_DATA/peopledaily/example.dev \\
        --exclude $NERKIT_DATA/peopledaily/example.test
"""

from __future__ import annotations

import argparse
import time

from nerkit.data.overlap import MIN_CHARS, remove_overlaps
from nerkit.tools.lm_adapt import exclusion_sets, read_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", action="append", required=True, help="unlabelled text, one passage a line")
    parser.add_argument("--exclude", action="append", required=True, help="a labelled corpus or a config")
    parser.add_argument("--min-chars", type=int, default=MIN_CHARS)
    args = parser.parse_args()
    started = time.perf_counter()
    lines = read_lines(args.text)
    kept, reports = remove_overlaps(lines, exclusion_sets(args.exclude), args.min_chars)
    print(f"text: {', '.join(args.text)}: {len(lines):,} non-empty lines, {len(kept):,} kept "
          f"(sentences and lines under {args.min_chars} characters not compared; {time.perf_counter() - started:.0f} s)\n")
    print("| set | sentences compared | of them in the text | lines taken out |")
    print("|---|---:|---:|---:|")
    for r in reports:
        print(f"| {r.name} | {r.sentences:,} | {r.found:,} ({100 * r.found / max(1, r.sentences):.1f}%) | {r.lines_removed:,} |")


if __name__ == "__main__":
    main()
