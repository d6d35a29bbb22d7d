"""Pictures: training curves from runs' `metrics.jsonl`, what sinusoidal position encodings tell
attention (and TENER's relative term), and the attention weights of a trained model on one sentence.

Figures are drawn with matplotlib (`pip install nerkit[report]`) in a font that has Chinese
characters (`cjk_font`), and written atomically as PNG or SVG, chosen by the file's suffix.
"""

from __future__ import annotations

import io
import json
import logging
from functools import lru_cache
from pathlib import Path

import torch

from nerkit.errors import UserError
from nerkit.files import atomic_write_bytes, check_output, read_json_lines

log = logging.getLogger(__name__)


IMAGE_FORMATS = ("png", "svg")


# Fonts with Chinese characters, preferred in this order where several are installed; any other
# installed font that has the probe character is used after these.
CJK_FAMILIES = ("WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Noto Sans CJK SC", "Noto Sans SC",
                "Source Han Sans SC", "Source Han Sans CN", "Sarasa Gothic SC", "SimHei", "Microsoft YaHei",
                "PingFang SC", "Heiti SC", "Droid Sans Fallback", "AR PL UMing CN", "Noto Sans CJK JP")


PROBE = "中"


FONT_FIX = "install one: `make fonts` (Debian: apt-get install fonts-wqy-microhei)"


def load_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise UserError("drawing figures needs matplotlib", fix="pip install 'nerkit[report]'") from None
    return matplotlib  # figures are matplotlib.figure.Figure objects: no pyplot, no backend chosen


def _has_glyph(path: str, char: str = PROBE) -> bool:
    from matplotlib.ft2font import FT2Font

    try:
        return ord(char) in FT2Font(path).get_charmap()
    except (OSError, RuntimeError, ValueError):
        return False


@lru_cache(maxsize=1)
def cjk_font() -> tuple[str, str] | None:
    """(family name, file) of an installed font with Chinese characters, or None. The system's font
    directories are scanned afresh (matplotlib's own cache may predate the font's installation)."""
    load_matplotlib()
    from matplotlib import font_manager

    files = sorted(set(font_manager.findSystemFonts()))
    named = []
    for path in files:
        try:
            named.append((font_manager.FontProperties(fname=path).get_name(), path))
        except (OSError, RuntimeError, ValueError):
            continue
    rank = {family: i for i, family in enumerate(CJK_FAMILIES)}
    for name, path in sorted(named, key=lambda np: (rank.get(np[0], len(rank)), np[1])):
        if _has_glyph(path):
            font_manager.fontManager.addfont(path)
            return name, path
    return None


def style(text: str = "") -> dict:
    """rcParams for every nerkit figure: the Chinese font first, matplotlib's own after it (for
    Latin letters and symbols it lacks); without a Chinese font matplotlib's, and a warning when
    the figure's `text` needs one."""
    found = cjk_font()
    if found is None:
        if any(ord(c) > 0x2E7F for c in text):  # CJK blocks and beyond
            log.warning(f"no font with Chinese characters found: they will show as empty boxes; {FONT_FIX}")
        families = ["DejaVu Sans"]
    else:
        families = [found[0], "DejaVu Sans"]
    return {"font.family": "sans-serif", "font.sans-serif": families, "axes.unicode_minus": False,
            "svg.fonttype": "path", "figure.dpi": 100}


def image_format(out: str | Path) -> str:
    fmt = Path(out).suffix.lower().lstrip(".")
    if fmt not in IMAGE_FORMATS:
        raise UserError(f"cannot tell the image format from {Path(out).name!r}", where=str(out),
                        fix="name a .png or .svg file")
    return fmt


def figure_bytes(figure, fmt: str) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # a canvas of its own, outside pyplot (and any interactive backend)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
    return buffer.getvalue()


def _save(draw, out: str | Path, text: str, *args, **kwargs) -> Path:
    """Check `out`, draw the figure (whose labels hold `text`) under nerkit's style and write it
    atomically."""
    fmt = image_format(out)
    check_output(out)
    matplotlib = load_matplotlib()
    with matplotlib.rc_context(style(text)):
        data = figure_bytes(draw(*args, **kwargs), fmt)
    atomic_write_bytes(out, data)
    return Path(out)


# ----------------------------------------------------------------------------- training curves


def read_history(run_dir: str | Path) -> list[dict]:
    """The records of a run's `metrics.jsonl`, one per epoch (a `partial` one for an epoch a limit cut)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not Path(run_dir).is_dir():
        raise UserError("no such directory" if not Path(run_dir).exists() else "not a directory", where=str(run_dir),
                        fix="check the path: pass the --out directory of `nerkit train`")
    if not path.is_file():
        raise UserError("no metrics.jsonl here", where=str(run_dir), fix="pass a directory written by `nerkit train`")
    records = []
    what, fix = "a metrics record (JSON with epoch, loss, lr and dev_f1)", "the file is damaged; it is written by `nerkit train`"
    for number, record in read_json_lines(path, what, fix):
        try:
            float(record["epoch"]), float(record["loss"]), float(record["lr"]), float(record["dev_f1"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"not {what}", where=f"{path}:{number}", fix=fix) from None
        records.append(record)
    if not records:
        raise UserError("metrics.jsonl holds no epoch yet", where=str(path))
    return records


def epoch_position(record: dict) -> float:
    """Where a record sits on the epoch axis: its epoch, or for a partial one the fraction of the
    epoch's batches that were run (epoch 3 cut after 30 of 40 batches is 2.75)."""
    if record.get("partial") and record.get("of_batches"):
        return record["epoch"] - 1 + record["batches"] / record["of_batches"]
    return float(record["epoch"])


def curves_figure(run_dirs: list[str | Path], labels: list[str] | None = None):
    """Loss, learning rate and dev F1 per epoch, one line per run; partial epochs are hollow points.
    A fine-tuned language model's own rate (`lm_lr`, its own parameter group) is a dashed line of
    the run's colour beside the rate of the rest; epochs are whole numbers on the axis."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    histories = [read_history(d) for d in run_dirs]
    names = labels or _run_labels(run_dirs)
    figure = Figure(figsize=(13, 3.6))
    axes = figure.subplots(1, 3)
    panels = (("loss", "training loss", 1.0), ("lr", "learning rate", 1.0), ("dev_f1", "dev F1 (%)", 100.0))
    any_partial = any_lm_rate = False
    for (key, title, factor), ax in zip(panels, axes):
        for index, (name, records) in enumerate(zip(names, histories)):
            color = f"C{index % 10}"
            points = sorted((epoch_position(r), factor * r[key], bool(r.get("partial"))) for r in records)
            ax.plot([p[0] for p in points], [p[1] for p in points], "-o", color=color, markersize=4, label=name)
            cut = [p for p in points if p[2]]
            if cut:
                any_partial = True
                ax.plot([p[0] for p in cut], [p[1] for p in cut], "o", markersize=8, markerfacecolor="white",
                        markeredgecolor=color, markeredgewidth=1.5)
            if key == "lr" and any("lm_lr" in r for r in records):
                own = sorted((epoch_position(r), r["lm_lr"]) for r in records if "lm_lr" in r)
                ax.plot([p[0] for p in own], [p[1] for p in own], linestyle="--", marker="o", color=color, markersize=3,
                        label=f"{name}: language model")
                any_lm_rate = True
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 1.5 between epochs 1 and 2
        ax.grid(alpha=0.3)
    axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    handles, _ = axes[0].get_legend_handles_labels()
    if any_lm_rate:
        handles.append(Line2D([], [], linestyle="--", color="gray", label="learning rate: the language model's"))
    if any_partial:
        handles.append(Line2D([], [], linestyle="", marker="o", markersize=8, markerfacecolor="white",
                              markeredgecolor="gray", label="partial epoch (a limit cut it short)"))
    figure.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), frameon=False,
                  bbox_to_anchor=(0.5, -0.02 - 0.06 * ((len(handles) - 1) // 4)))
    figure.tight_layout(rect=(0, 0.1 + 0.06 * ((len(handles) - 1) // 4), 1, 1))
    return figure


def _run_labels(run_dirs: list[str | Path]) -> list[str]:
    """Each run's directory name, or its path as given where two names are the same."""
    names = [Path(d).name or str(d) for d in run_dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, run_dirs)]


def plot_curves(run_dirs: list[str | Path], out: str | Path) -> Path:
    """`nerkit plot curves`: the runs' curves on one figure, written to `out` (.png or .svg)."""
    for d in run_dirs:  # every run is readable before anything is drawn
        read_history(d)
    return _save(curves_figure, out, "".join(_run_labels(run_dirs)), run_dirs)


# ----------------------------------------------------------------------------- confidence


def reliability_figure(calibration: dict):
    """How honest the entity scores are (`nerkit.inference.evaluate.calibration`): the share of
    entities right against their mean score per score bin (on the diagonal when honest, the bins'
    sizes as bars), and precision, recall and F1 against the minimum score kept."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 3.8))
    left, right = figure.subplots(1, 2)
    bins = [b for b in calibration["bins"] if b["count"]]
    left.plot([0, 1], [0, 1], ":", color="grey", label="honest")
    left.plot([b["mean_score"] for b in bins], [b["accuracy"] for b in bins], "-o", color="C0",
              label=f"entities (ECE {calibration['ece']:.3f})")
    counts = left.twinx()
    counts.bar([(b["low"] + b["high"]) / 2 for b in bins], [b["count"] for b in bins], width=0.08, alpha=0.2,
               color="C0")
    counts.set_ylabel("entities in the bin")
    left.set(xlim=(0, 1), ylim=(0, 1), xlabel="score", ylabel="share right", title="reliability")
    left.legend(loc="upper left")
    rows = calibration["thresholds"]
    for key, color in (("precision", "C1"), ("recall", "C2"), ("f1", "C3")):
        right.plot([r["threshold"] for r in rows], [100 * r[key] for r in rows], "-o", color=color, markersize=3,
                   label=key)
    right.set(xlabel="minimum score kept", ylabel="%", title="by threshold")
    right.legend()
    figure.tight_layout()
    return figure


def reliability_curves_figure(curves: list[tuple[str, dict]]):
    """Several reliability curves on one diagram: (label, calibration) each, its ECE in the legend."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 5))
    ax = figure.subplots()
    ax.plot([0, 1], [0, 1], ":", color="grey", label="honest")
    for index, (label, found) in enumerate(curves):
        bins = [b for b in found["bins"] if b["count"]]
        ax.plot([b["mean_score"] for b in bins], [b["accuracy"] for b in bins], marker="o",
                linestyle="solid" if index % 2 == 0 else "dashed", color=f"C{index // 2}", markersize=3,
                label=f"{label}: ECE {found['ece']:.3f}")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="score", ylabel="share right", title="reliability of entity scores")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def read_calibrations(path: str | Path) -> list[tuple[str, dict]]:
    """The calibrations a file holds: `nerkit eval --calibration --json`'s output (one, labelled by
    the file's name), or records of calibrated models, one a line with `test` and `test_after`
    (two each: before and after the temperature)."""
    from nerkit.files import check_input

    fix = "pass the output of `nerkit eval --calibration --json`, or calibration records"
    check_input(str(path), "FILE", "no such file", fix=fix)
    text = Path(path).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
        if isinstance(whole, dict) and isinstance(whole.get("calibration"), dict):
            return [(Path(path).stem, whole["calibration"])]
    except json.JSONDecodeError:
        pass
    curves = []
    for _, r in read_json_lines(path, "a calibration record", fix):
        try:
            name = f"{r['dataset']} {r['model']}"
            curves += [(f"{name}, T 1", r["test"]["calibration"]),
                       (f"{name}, T {r['fit']['temperature']:.2f}", r["test_after"]["calibration"])]
        except (KeyError, TypeError):
            raise UserError("not a calibration record", where=str(path), fix=fix) from None
    return curves


def plot_reliability(files: list[str | Path], out: str | Path) -> Path:
    """`nerkit plot reliability`: the reliability curves of the files (`read_calibrations`) on one diagram."""
    curves = [c for f in files for c in read_calibrations(f)]
    return _save(reliability_curves_figure, out, "", curves)


def loop_figure(records: list[dict]):
    """`nerkit bench loop`'s test F1 (and dev F1, dashed) against the sentences annotated, one panel
    per config, one line per strategy: the mean over the seeds, the band their lowest and highest.
    Where a loop asked for spans (`--unit span`), every loop is drawn against its cost in characters
    (fixed cost per question included) and, in a second panel, against the characters labelled
    alone, one line per unit and strategy, and a full-data run (`--full`) as a dotted level."""
    from matplotlib.figure import Figure

    from nerkit.tools.bench.loop import FULL, record_key

    by_cost = any(record_key(r)[0] != "sentence" for r in records)
    axis_names = {"sentences": "sentences annotated", "cost": "characters labelled, with the cost per question",
                  "characters": "characters labelled"}
    xs = ("cost", "characters") if by_cost else ("sentences",)
    configs = sorted({Path(r["config"]).stem for r in records})
    panels = [(config, x) for config in configs for x in xs]
    figure = Figure(figsize=(5.5 * len(panels), 3.8))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (config, x_key) in zip(axes, panels):
        mine = [r for r in records if Path(r["config"]).stem == config]
        loops = sorted({record_key(r)[:2] for r in mine} - {FULL})
        for index, loop in enumerate(loops):
            rounds = sorted({r["round"] for r in mine if record_key(r)[:2] == loop})
            rows = [[r for r in mine if record_key(r)[:2] == loop and r["round"] == k] for k in rounds]
            x = [sum(r[x_key] for r in row) / len(row) for row in rows]
            name = f"{loop[0]}, {loop[1]}" if by_cost else loop[1]
            for key, line in (("test_f1", "-o"), ("dev_f1", "--")):
                values = [[100 * (r[key] or 0) for r in row] for row in rows]
                ax.plot(x, [sum(v) / len(v) for v in values], line, color=f"C{index}", markersize=4,
                        label=f"{name} ({key.split('_')[0]})")
                if key == "test_f1":
                    ax.fill_between(x, [min(v) for v in values], [max(v) for v in values], color=f"C{index}",
                                    alpha=0.15)
        full = [100 * (r["test_f1"] or 0) for r in mine if record_key(r)[:2] == FULL]
        if full:
            ax.axhline(sum(full) / len(full), color="grey", linestyle=":", label="full data (test)")
        seeds = len({r["seed"] for r in mine})
        ax.set(xlabel=axis_names[x_key], ylabel="F1 (%)", title=f"{config} ({seeds} seeds)")
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def plot_loop(results: str | Path, out: str | Path) -> Path:
    """`nerkit plot loop`: the F1 curves of a `nerkit bench loop` results.jsonl, written to `out`."""
    from nerkit.files import check_input

    check_input(str(results), "RESULTS", "no such file", fix="pass the results.jsonl of `nerkit bench loop`")
    records = [r for _, r in read_json_lines(results, "a loop record", "pass the results.jsonl of `nerkit bench loop`")]
    if not records or any(k not in r for r in records for k in ("config", "strategy", "round", "test_f1")):
        raise UserError("not the results of `nerkit bench loop`", where=str(results),
                        fix="pass the results.jsonl of `nerkit bench loop`")
    return _save(loop_figure, out, "", records)


def grow_figure(records: list[dict]):
    """`nerkit bench grow`'s test micro-F1 over the types so far against the step, one panel per
    order of types, one line per method (the mean over the seeds)."""
    from matplotlib.figure import Figure

    from nerkit.tools.bench.grow import METHODS, latest

    found = latest(records)
    orders = sorted({k[0] for k in found})
    figure = Figure(figsize=(5.0 * len(orders), 3.6))
    axes = figure.subplots(1, len(orders), squeeze=False)[0]
    for ax, order in zip(axes, orders):
        mine = {k: r for k, r in found.items() if k[0] == order}
        for index, method in enumerate(m for m in METHODS if any(k[1] == m for k in mine)):
            steps = sorted({k[2] for k in mine if k[1] == method})
            values = [[100 * r["test_f1"] for k, r in mine.items() if k[1] == method and k[2] == s] for s in steps]
            ax.plot(steps, [sum(v) / len(v) for v in values], "-o", color=f"C{index}", markersize=4, label=method)
        labels = {k[2]: "+" + ",".join(r["new_types"]) for k, r in mine.items()}
        ax.set_xticks(sorted(labels), [labels[s] for s in sorted(labels)])
        ax.set(xlabel="step (types added)", ylabel="test micro-F1, types so far (%)", title=order)
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def plot_grow(results: str | Path, out: str | Path) -> Path:
    """`nerkit plot grow`: the F1 by step of a `nerkit bench grow` results.jsonl, written to `out`."""
    from nerkit.files import check_input

    fix = "pass the results.jsonl of `nerkit bench grow`"
    check_input(str(results), "RESULTS", "no such file", fix=fix)
    records = [r for _, r in read_json_lines(results, "a grow record", fix)]
    if not records or any(k not in r for r in records for k in ("order", "method", "step", "test_f1", "new_types")):
        raise UserError("not the results of `nerkit bench grow`", where=str(results), fix=fix)
    return _save(grow_figure, out, "", records)


# ----------------------------------------------------------------------------- position encodings


def position_scores(dim: int, max_distance: int = 50, projections: int = 3, seed: int = 0) -> dict:
    """What attention can read of the offset k = j - i between two positions, for k in
    -max_distance..max_distance, with nerkit's own sinusoids and relative term:

    `absolute`: P_i . P_{i+k}, the same for k and -k (no sense of direction);
    `projected`: (W_q P_i) . (W_k P_{i+k}) for `projections` random W_q, W_k (N(0, 1/dim)): even the
    distance fades;
    `relative`: TENER's (q_i + v) . R_{i-j} for a random query, `RelativePositions.logits` of
    relative.py: R_{-k} is not R_k (sine is odd), so a key k after the query scores otherwise
    than one k before it."""
    from nerkit.model.encoders.attention import sinusoid
    from nerkit.model.encoders.relative import RelativePositions

    if dim < 2 or dim % 2:
        raise UserError(f"--dim must be an even number of at least 2, not {dim}")
    offsets = torch.arange(-max_distance, max_distance + 1)  # (K,) with K = 2 * max_distance + 1
    encodings = sinusoid(torch.arange(0, 2 * max_distance + 1), dim)  # (K, dim): positions 0..2m, i = m
    query = encodings[max_distance]  # (dim,)
    generator = torch.Generator().manual_seed(seed)
    projected = []
    for _ in range(projections):
        w_q = torch.randn(dim, dim, generator=generator, dtype=torch.float64) / dim ** 0.5
        w_k = torch.randn(dim, dim, generator=generator, dtype=torch.float64) / dim ** 0.5
        projected.append((encodings @ w_k.T) @ (w_q @ query))  # (K,)
    positions = RelativePositions(1, dim, learned_table=False, position_bias=True).double()
    with torch.no_grad():
        torch.nn.init.normal_(positions.position_bias, generator=generator)
        q = torch.randn(1, 1, len(offsets), dim, generator=generator, dtype=torch.float64)  # (B, H, L, d)
        relative = positions.logits(q)[0, 0, max_distance]  # (L,): query i = m against keys j = 0..2m
    return {"offsets": offsets.tolist(), "absolute": (encodings @ query).tolist(),
            "projected": [p.tolist() for p in projected], "relative": relative.tolist()}


def positions_figure(dim: int, max_distance: int = 50):
    from matplotlib.figure import Figure

    scores = position_scores(dim, max_distance)
    k = scores["offsets"]
    figure = Figure(figsize=(13, 3.6))
    axes = figure.subplots(1, 3, sharex=True)
    axes[0].plot(k, scores["absolute"], color="C0")
    axes[0].set_title(f"$P_i \\cdot P_{{i+k}}$ (d = {dim}): symmetric")
    for n, p in enumerate(scores["projected"]):
        axes[1].plot(k, p, color=f"C{n + 1}", label=f"random $W_q, W_k$ #{n + 1}")
    axes[1].set_title("$P_i^T W_q^T W_k P_{i+k}$: distance fades")
    axes[1].legend(fontsize=8, frameon=False)
    relative = scores["relative"]
    axes[2].plot(k, relative, color="C4", label="$(q_i + v) \\cdot R_{i-j}$, key after at k > 0")
    axes[2].plot(k, relative[::-1], color="C4", linestyle=":", alpha=0.7, label="the same, mirrored")
    axes[2].set_title("TENER's relative term: direction-aware")
    axes[2].legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, -0.45), frameon=False)
    for ax in axes:
        ax.set_xlabel("k = j - i")
        ax.axvline(0, color="gray", linewidth=0.5)
        ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def plot_positions(dim: int, out: str | Path, max_distance: int = 50) -> Path:
    """`nerkit plot positions`: the three panels of `position_scores`, written to `out`."""
    if max_distance < 1:
        raise UserError(f"--max-distance must be at least 1, not {max_distance}")
    position_scores(dim, 1)  # a bad --dim fails before anything is written
    return _save(positions_figure, out, "", dim, max_distance)


# ----------------------------------------------------------------------------- attention maps


def attention_maps(pipe, text: str) -> tuple[list[str], list[torch.Tensor]]:
    """The attention weights of `pipe`'s model on `text`: the node labels (its characters, then for
    FLAT the lattice's words) and per layer a (H, L, L) tensor, rows the queries."""
    from nerkit.features.batch import collate
    from nerkit.model.encoders.attention import MultiHeadAttention, recorded_attention

    name = pipe.config.encoder.name
    if not any(isinstance(m, MultiHeadAttention) for m in pipe.model.modules()):
        raise UserError(f"the model's encoder ({name}) has no attention weights to show",
                        fix="plot a model whose encoder.name is transformer, tener or flat")
    if not text:
        raise UserError("--text is empty", fix="pass one sentence")
    if pipe.config.data.max_len and len(text) > pipe.config.data.max_len:
        raise UserError(f"the text has {len(text)} characters, more than the model reads at once "
                        f"(data.max_len {pipe.config.data.max_len})", fix="pass a shorter sentence")
    tokens = list(text)
    units = pipe.featurizer.units(tokens)
    words = units.lattice.words if units.lattice is not None else []
    labels = ["␣" if c.isspace() else c for c in tokens] + list(words)
    batch = collate([pipe.featurizer.example(tokens)]).to(pipe.device)
    pipe.model.eval()
    with torch.inference_mode(), recorded_attention(pipe.model) as recorded:
        pipe.model.emissions(batch)
    # (1, H, L', L') each; L' may hold one padded word slot (a sentence without lattice words)
    layers = [w[0, :, :len(labels), :len(labels)].float().cpu() for w in recorded]  # (H, L, L) each
    return labels, layers


MAX_FIGURE_INCHES = 60  # 6,000 pixels a side at 100 dpi


def attention_figure(labels: list[str], grid: list[list[tuple[str, torch.Tensor]]], chars: int):
    """Heatmaps, `grid[row][column]` = (title, (L, L) weights, rows the queries); `chars`: how many
    of the `labels` are characters (FLAT's lattice words follow them)."""
    from matplotlib.figure import Figure

    rows, columns, length = len(grid), len(grid[0]), len(labels)
    cell = max(2.6, 0.28 * length)  # inches per heatmap: room for a label per row and column
    cell = min(cell, MAX_FIGURE_INCHES / max(rows, columns))
    size = max(5.0, min(10.0, 0.6 * 72 * cell / length))  # points
    figure = Figure(figsize=(cell * columns + 1.5, cell * rows + 0.8), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax_row, maps in zip(axes, grid):
        for ax, (title, weights) in zip(ax_row, maps):
            image = ax.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(length), labels, fontsize=size)
            ax.set_yticks(range(length), labels, fontsize=size)
            for word in ax.get_xticklabels()[chars:]:  # FLAT's words read downwards, characters stay upright
                word.set_rotation(90)
            if chars < length:  # FLAT: a line between the characters and the lattice words
                ax.axhline(chars - 0.5, color="white", linewidth=0.8)
                ax.axvline(chars - 0.5, color="white", linewidth=0.8)
            ax.set_title(title, fontsize=9)
            ax.tick_params(length=0)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight (rows: queries)")
    return figure


def attention_spread(weights: torch.Tensor, chars: int) -> tuple[float, float]:
    """How far one layer's attention reaches, over its character queries and character keys (FLAT's
    word nodes left out, each row's character weights renormalised), averaged over heads and
    queries: the mean distance |i - j| in characters, and the share of the weight within two
    characters of the query. Absolute attention spreads over the sentence; TENER's concentrates."""
    w = weights[:, :chars, :chars]  # (H, L, L)
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-12)
    position = torch.arange(chars, dtype=w.dtype)
    distance = (position[None, :] - position[:, None]).abs()  # (L, L)
    mean_distance = (w * distance).sum(-1).mean().item()
    near = (w * (distance <= 2)).sum(-1).mean().item()
    return mean_distance, near


def plot_attention(model_dirs: str | Path | list[str | Path], text: str, out: str | Path, layer: int = 0,
                   head: int = 0, device: str = "cpu") -> tuple[Path, list[dict]]:
    """`nerkit plot attention`: the attention on `text` of every layer (a row each) and head (a
    column each) of each model, models one under the other, or only of `layer` and / or `head`
    (counted from 1; 0: all), written to `out`. Returns the path and, per model and layer drawn,
    its `attention_spread` (mean distance, share within two characters)."""
    from nerkit.inference.pipeline import Pipeline

    image_format(out)
    check_output(out)
    model_dirs = [model_dirs] if isinstance(model_dirs, (str, Path)) else list(model_dirs)
    grid, spread, labels = [], [], None
    for model_dir in model_dirs:
        pipe = Pipeline.load(model_dir, device=device)
        nodes, weights = attention_maps(pipe, text)
        if labels is not None and nodes != labels:
            raise UserError(f"{model_dir}: its lattice gives this text other nodes than {model_dirs[0]}'s, so their "
                            "maps do not line up", fix="plot a FLAT model on its own, or beside FLAT models of the same lexicon")
        labels = nodes
        n_layers, n_heads = len(weights), weights[0].size(0)
        if layer > n_layers or head > n_heads:
            raise UserError(f"{model_dir}: the model has {n_layers} layers of {n_heads} heads: there is no "
                            f"layer {layer}, head {head}", fix=f"choose --layer 1..{n_layers} and --head 1..{n_heads} (0: all)")
        name = f"{Path(model_dir).name} ({pipe.config.encoder.name}), " if len(model_dirs) > 1 else ""
        for i in range(n_layers):
            if layer not in (0, i + 1):
                continue
            grid.append([(f"{name}layer {i + 1}, head {j + 1}", weights[i][j]) for j in range(n_heads) if head in (0, j + 1)])
            distance, near = attention_spread(weights[i], len(text))
            spread.append({"model": str(model_dir), "encoder": pipe.config.encoder.name, "layer": i + 1,
                           "mean_distance": distance, "within_2": near})
    if len(model_dirs) > 1 and len({len(row) for row in grid}) > 1:
        raise UserError("the models have different numbers of heads, so their maps do not line up in one grid",
                        fix="choose one head with --head N")
    return _save(attention_figure, out, "".join(labels), labels, grid, len(text)), spread
