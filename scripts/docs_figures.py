"""Redraw the README's example figures in docs/img/: the training curves and the attention of a tiny
TENER model trained for a few seconds on the test fixtures (tests/fixtures/tiny_*.bio), the
position-encoding curves, and (when headless Chromium is installed) a screenshot of the model's
`nerkit report` on the fixtures' dev file. Each PNG is reduced to a 64-colour palette to stay a
few tens of KB.

    python scripts/docs_figures.py [--out docs/img]

With `--compare ABSOLUTE_MODEL TENER_MODEL` it draws only docs/img/attention_compare.png, the first
layer of two trained models one under the other on one sentence, and prints how far each layer's
attention reaches (`nerkit.tools.reports.plot.attention_spread`) averaged over the first `--sentences` sentences
of at most 60 characters of the models' dev set (carved from train as in training).

    python scripts/docs_figures.py --compare runs/transformer runs/tener
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def shrink(path: Path, width: int) -> None:
    """Scale the PNG to `width` pixels and store it with a 64-colour palette."""
    from PIL import Image

    with Image.open(path) as opened:  # closed before the file is written over
        image = opened.convert("RGB")
    if image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("ABSOLUTE", "TENER"))
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--text", default="中国人民银行行长周小川在北京会见了美国财政部长。")
    args = parser.parse_args()
    if args.compare:
        return compare(args.compare, args.out, args.text, args.sentences)
    import torch
    from helpers import tiny_raw_config

    from nerkit.config import build_config
    from nerkit.tools.reports.plot import plot_attention, plot_curves, plot_positions
    from nerkit.training.loop import train

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-tener"
        config = build_config(tiny_raw_config(), "<tiny config>",
                              ["encoder.name=tener", "encoder.n_heads=2", "encoder.head_dim=8",
                               "encoder.num_layers=2", "train.epochs=12", "train.lr=0.005"])
        train(config, out=model, progress_bar=False)
        figures = [(plot_curves([model], args.out / "curves.png"), 900),
                   (plot_attention(model, "张三在北京大学读书。", args.out / "attention.png")[0], 700)]
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium:
            from helpers import TINY_DEV

            from nerkit.tools.reports.report import write_report

            page = Path(tmp) / "report.html"
            write_report(model, TINY_DEV, page)
            shot = args.out / "report.png"
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=1100,1500", f"--screenshot={shot}", page.as_uri()],
                           check=True, capture_output=True, timeout=120)
            figures.append((shot, 800))
        else:
            print("no chromium: docs/img/report.png left as it is")
    figures.append((plot_positions(64, args.out / "positions.png"), 900))
    for path, width in figures:
        shrink(path, width)
        print(f"{path}: {path.stat().st_size / 1024:.0f} KB")


def compare(models: list[Path], out: Path, text: str, sentences: int) -> None:
    """The attention of trained models side by side, and their spread over dev sentences."""
    import torch

    from nerkit.data.splits import read_splits
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.reports.plot import attention_maps, attention_spread, plot_attention

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    path, _ = plot_attention(models, text, out / "attention_compare.png", layer=1)
    shrink(path, 900)
    print(f"{path}: {path.stat().st_size / 1024:.0f} KB")
    for model in models:
        pipe = Pipeline.load(model)
        dev = [s.tokens for s in read_splits(pipe.config).dev if len(s.tokens) <= 60][:sentences]
        per_layer, sides = None, None
        for tokens in dev:
            _, layers = attention_maps(pipe, "".join(tokens))
            spread = [attention_spread(w, len(tokens)) for w in layers]
            per_layer = spread if per_layer is None else [(a + c, b + d) for (a, b), (c, d) in zip(per_layer, spread)]
            side = [direction(w, len(tokens)) for w in layers]
            sides = side if sides is None else [a + b for a, b in zip(sides, side)]
        uniform = sum((len(t) ** 2 - 1) / (3 * len(t)) for t in dev) / len(dev)  # mean |i - j| of uniform weights
        for i, (distance, near) in enumerate(per_layer):
            print(f"{model} ({pipe.config.encoder.name}) layer {i + 1}: mean attended distance "
                  f"{distance / len(dev):.2f} characters (uniform attention: {uniform:.2f}), "
                  f"{100 * near / len(dev):.1f}% within 2, over {len(dev)} dev sentences "
                  f"(mean length {sum(map(len, dev)) / len(dev):.1f})")
            heads = " ".join(f"{h + 1}: {before:.0f}/{itself:.0f}/{after:.0f}"
                             for h, (before, itself, after) in enumerate((100 * sides[i] / len(dev)).tolist()))
            print(f"    per head, % of the weight on the characters before / the character itself / after: {heads}")


def direction(weights, n: int):
    """Per head, the share of each query's attention on earlier characters, on itself and on later
    ones, averaged over the queries: (H, 3). `weights`: (H, L, L), rows the queries."""
    import torch

    w = weights[:, :n, :n]  # (H, n, n)
    i = torch.arange(n)
    before, itself = (i[None, :] < i[:, None]).float(), torch.eye(n)  # (n, n) each: key j against query i
    after = 1 - before - itself
    return torch.stack([(w * part).sum((1, 2)) / n for part in (before, itself, after)], dim=1)  # (H, 3)


if __name__ == "__main__":
    main()
