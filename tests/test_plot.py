"""`nerkit plot`: each command writes an image of the expected format and size with ink on it;
Chinese labels are drawn with the font's own glyphs (not empty boxes); the position curves say
what the figure claims; the attention recorder changes nothing and sees every layer; a model
without attention is a user error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib", reason="nerkit[report] (matplotlib) is not installed")

from nerkit.errors import UserError  # noqa: E402
from nerkit.tools.reports.plot import cjk_font, epoch_position, position_scores  # noqa: E402

needs_cjk_font = pytest.mark.skipif(cjk_font() is None, reason="no font with Chinese characters installed "
                                    "(`make fonts` installs fonts-wqy-microhei)")


def read_png(path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(str(path))  # (H, W, 4) floats in [0, 1]


def inked(image: np.ndarray) -> float:
    """The fraction of pixels that are not (near) white."""
    return float((image[..., :3].min(axis=-1) < 0.9).mean())


def write_history(directory, records):
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return directory


def record(epoch, loss, f1, **extra):
    return {"epoch": epoch, "step": 10 * epoch, "loss": loss, "lr": 0.01 / epoch, "dev_f1": f1, **extra}


# ----------------------------------------------------------------------------- curves


def test_curves_of_two_runs_make_one_png_with_ink(tmp_path, nerkit):
    a = write_history(tmp_path / "runs" / "a", [record(1, 9.0, 0.2), record(2, 5.0, 0.5), record(3, 4.0, 0.6)])
    b = write_history(tmp_path / "runs" / "b", [record(1, 8.0, 0.3),
                                                record(2, 6.0, 0.4, partial=True, batches=3, of_batches=4)])
    out = tmp_path / "curves.png"
    result = nerkit("plot", "curves", str(a), str(b), "--out", str(out))
    assert str(out) in result.stdout
    image = read_png(out)
    assert image.shape[:2] == (360, 1300)  # 13 x 3.6 inches at 100 dpi: three panels side by side, uncropped
    assert 0.01 < inked(image) < 0.5


def test_every_run_is_in_the_legend_and_partial_epochs_are_hollow(tmp_path):
    from nerkit.tools.reports.plot import curves_figure

    a = write_history(tmp_path / "x" / "run", [record(1, 9.0, 0.2), record(2, 5.0, 0.5)])
    b = write_history(tmp_path / "y" / "run", [record(1, 8.0, 0.3), record(2, 7.0, 0.4),
                                               record(3, 6.0, 0.5, partial=True, batches=1, of_batches=4)])
    figure = curves_figure([a, b])
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert legend[:2] == [str(a), str(b)] and "partial" in legend[2]  # same names: the paths tell them apart
    for ax in figure.axes:
        hollow = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white"]
        assert [list(line.get_xdata()) for line in hollow] == [[2.25]]
    f1 = [line for line in figure.axes[2].get_lines() if line.get_label() == str(b)][0]
    assert list(f1.get_ydata()) == pytest.approx([30.0, 40.0, 50.0])


def test_the_rate_panel_shows_both_rates_of_a_fine_tuned_lm_and_whole_epochs(tmp_path):
    """Issue 41: with a fine-tuned LM at its own rate the panel showed one rate of two, and the
    epoch axis of a short run read 1.0, 1.5, 2.0."""
    from nerkit.tools.reports.plot import curves_figure

    run = write_history(tmp_path / "lm", [record(1, 9.0, 0.2, lm_lr=2e-4), record(2, 5.0, 0.5, lm_lr=1e-4)])
    plain = write_history(tmp_path / "plain", [record(1, 9.0, 0.2), record(2, 5.0, 0.5)])
    figure = curves_figure([run, plain])
    rates = {line.get_label(): list(line.get_ydata()) for line in figure.axes[1].get_lines()}
    assert rates == {str(run.name): [0.01, 0.005], f"{run.name}: language model": [2e-4, 1e-4],
                     str(plain.name): [0.01, 0.005]}
    assert any("language model" in t.get_text() for t in figure.legends[0].get_texts())
    figure.canvas.draw()
    for ax in figure.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_partial_epoch_sits_at_its_fraction_of_batches():
    assert epoch_position(record(3, 1.0, 0.5, partial=True, batches=30, of_batches=40)) == 2.75
    assert epoch_position(record(3, 1.0, 0.5)) == 3.0


def test_curves_as_svg_and_the_errors_a_user_can_fix(tmp_path, nerkit):
    run = write_history(tmp_path / "run", [record(1, 9.0, 0.2)])
    svg = tmp_path / "c.svg"
    nerkit("plot", "curves", str(run), "--out", str(svg))
    assert svg.read_text(encoding="utf-8").lstrip().startswith(("<?xml", "<svg"))
    bad = nerkit("plot", "curves", str(run), "--out", str(tmp_path / "c.jpg"), check=False)
    assert bad.returncode == 2 and ".png or .svg" in bad.stderr
    missing = nerkit("plot", "curves", str(tmp_path / "nothing"), "--out", str(svg), check=False)
    assert missing.returncode == 2 and missing.stderr == f"nerkit: error: {tmp_path / 'nothing'}: no such directory; " \
                                                         "check the path: pass the --out directory of `nerkit train`\n"
    (tmp_path / "empty").mkdir()
    empty = nerkit("plot", "curves", str(tmp_path / "empty"), "--out", str(svg), check=False)
    assert empty.returncode == 2 and "no metrics.jsonl here" in empty.stderr
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n', encoding="utf-8")
    broken = nerkit("plot", "curves", str(run), "--out", str(tmp_path / "d.png"), check=False)
    assert broken.returncode == 2 and "metrics.jsonl:1" in broken.stderr
    assert not (tmp_path / "d.png").exists()


# ----------------------------------------------------------------------------- positions


def test_position_scores_say_what_the_figure_claims():
    scores = position_scores(64, max_distance=20)
    k = np.array(scores["offsets"])
    absolute = np.array(scores["absolute"])
    middle = len(k) // 2
    # P_i . P_{i+k} is symmetric in k and largest at k = 0 (|P|^2 = dim / 2).
    np.testing.assert_allclose(absolute, absolute[::-1], atol=1e-9)
    assert absolute[middle] == pytest.approx(32.0) and absolute.argmax() == middle
    # TENER's relative term tells k from -k.
    relative = np.array(scores["relative"])
    assert np.abs(relative - relative[::-1]).max() > 1e-3
    # Through random projections the peak at k = 0 is gone (for at least one of them).
    assert any(np.argmax(p) != middle for p in scores["projected"])


def test_positions_png(tmp_path, nerkit):
    out = tmp_path / "positions.png"
    nerkit("plot", "positions", "--dim", "32", "--out", str(out))
    image = read_png(out)
    assert image.shape[:2] == (360, 1300)  # 13 x 3.6 inches at 100 dpi
    assert 0.01 < inked(image) < 0.5
    odd = nerkit("plot", "positions", "--dim", "33", "--out", str(out), check=False)
    assert odd.returncode == 2 and "even" in odd.stderr


# ----------------------------------------------------------------------------- Chinese glyphs


def _ink_box(image: np.ndarray) -> np.ndarray:
    """The ink of a grey image (1 = ink), cropped to its bounding box and resampled to 48 x 48."""
    rows, cols = np.nonzero(image > 0.3)
    crop = image[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    y = np.linspace(0, crop.shape[0] - 1, 48).round().astype(int)
    x = np.linspace(0, crop.shape[1] - 1, 48).round().astype(int)
    return crop[np.ix_(y, x)]


def _drawn(char: str) -> np.ndarray:
    """`char` as nerkit's figures draw it (its style, a large label), as ink in [0, 1]."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from nerkit.tools.reports.plot import style

    with matplotlib.rc_context(style(char)):
        figure = Figure(figsize=(2, 2), dpi=100)
        canvas = FigureCanvasAgg(figure)
        figure.text(0.5, 0.5, char, fontsize=90, ha="center", va="center")
        canvas.draw()
        pixels = np.asarray(canvas.buffer_rgba())[..., :3].mean(axis=-1) / 255.0
    return 1.0 - pixels


def _glyph(char: str, path: str) -> np.ndarray:
    """`char` straight from the font file's own outline, as ink in [0, 1]."""
    from matplotlib.ft2font import FT2Font

    font = FT2Font(path)
    font.set_size(90, 100)
    font.set_text(char)
    font.draw_glyphs_to_bitmap()
    return np.asarray(font.get_image(), dtype=float) / 255.0


def _similarity(a: np.ndarray, b: np.ndarray) -> float:
    a, b = _ink_box(a).ravel(), _ink_box(b).ravel()
    return float(np.corrcoef(a, b)[0, 1])


def test_without_a_chinese_font_a_figure_that_needs_one_warns(monkeypatch, caplog):
    import nerkit.tools.reports.plot

    monkeypatch.setattr(nerkit.tools.reports.plot, "cjk_font", lambda: None)
    with caplog.at_level("WARNING", logger="nerkit.tools.reports.plot"):
        assert nerkit.tools.reports.plot.style("loss")["font.sans-serif"] == ["DejaVu Sans"]
        assert not caplog.records  # nothing to say for a figure without Chinese
        nerkit.tools.reports.plot.style("张三")
    assert "no font with Chinese characters" in caplog.text


@needs_cjk_font
def test_a_chinese_label_is_drawn_with_the_fonts_glyph_not_a_box():
    _, path = cjk_font()
    drawn = _drawn("北")
    assert (drawn > 0.3).mean() > 0.01  # ink
    same = _similarity(drawn, _glyph("北", path))
    box = _similarity(drawn, _glyph("口", path))  # a square, as an empty box would be
    assert same > 0.9 and same > box + 0.2, (same, box)


# ----------------------------------------------------------------------------- attention


def test_recorded_weights_are_the_softmax_of_the_masked_logits():
    from nerkit.model.encoders.attention import MultiHeadAttention, recorded_attention

    torch.manual_seed(0)
    attention = MultiHeadAttention(2, 4, attn_dropout=0.5).eval()
    x = torch.randn(2, 5, 8)  # (B, L, d_model)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # (B, L)
    plain = attention(x, mask)
    with recorded_attention(attention) as recorded:
        hooked = attention(x, mask)
    assert torch.equal(plain, hooked)
    (weights,) = recorded  # (B, H, L, L)
    expected = attention.logits(x).masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected)
    assert weights[1, :, :, 3:].abs().max() == 0  # padding keys get no weight


@pytest.fixture(scope="module")
def tener_model_dir(tmp_path_factory, tiny_config):
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("tener") / "model"
    train(tiny_config("encoder.name=tener", "encoder.n_heads=2", "encoder.head_dim=4", "encoder.num_layers=2",
                      "train.epochs=1"), out=out, progress_bar=False)
    return out


def test_recording_attention_changes_nothing_and_sees_each_layer(tener_model_dir):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.model.encoders.attention import recorded_attention
    from nerkit.tools.reports.plot import attention_maps

    pipe = Pipeline.load(tener_model_dir)
    text = "张三在北京大学读书。"
    before = pipe.predict(text)
    labels, layers = attention_maps(pipe, text)
    assert labels == list(text) and len(layers) == 2
    for weights in layers:
        assert weights.shape == (2, len(text), len(text))  # (H, L, L)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, len(text)))
    assert pipe.predict(text) == before
    with recorded_attention(pipe.model) as recorded:
        pass
    pipe.predict(text)  # the hooks are gone once the block ends
    assert recorded == []


@needs_cjk_font
def test_attention_png_for_a_transformer(tener_model_dir, tmp_path, nerkit):
    out = tmp_path / "attention.png"
    result = nerkit("plot", "attention", "--model", str(tener_model_dir), "--text", "张三在北京", "--out", str(out))
    # matplotlib warns "Glyph ... missing from font(s)" for a character the fonts lack (an error here).
    assert "missing from font" not in result.stderr, result.stderr
    image = read_png(out)
    # 2 x 2 maps of 2.6 inches (the least a map gets) plus 1.5 inches for the colour bar and 0.8 for titles
    assert image.shape[:2] == (600, 670) and 0.05 < inked(image) < 0.9
    one = tmp_path / "one.png"
    nerkit("plot", "attention", "--model", str(tener_model_dir), "--text", "张三在北京", "--out", str(one),
           "--layer", "2", "--head", "1")
    single = read_png(one)  # one heatmap of the 2 x 2
    assert single.shape[:2] == (340, 410)
    wrong = nerkit("plot", "attention", "--model", str(tener_model_dir), "--text", "张三", "--out", str(one),
                   "--layer", "3", check=False)
    assert wrong.returncode == 2 and "no layer 3" in wrong.stderr


def test_attention_spread_measures_how_far_attention_reaches():
    from nerkit.tools.reports.plot import attention_spread

    length = 6
    uniform = torch.full((2, length, length), 1 / length)  # (H, L, L)
    distance, near = attention_spread(uniform, length)
    pairs = [(i, j) for i in range(length) for j in range(length)]
    assert distance == pytest.approx(sum(abs(i - j) for i, j in pairs) / len(pairs))
    assert near == pytest.approx(sum(abs(i - j) <= 2 for i, j in pairs) / len(pairs))
    assert attention_spread(torch.eye(length)[None], length) == (0.0, 1.0)  # each character on itself
    last = torch.zeros(1, length, length)
    last[..., -1] = 1.0  # everything on the last character: distances 5, 4, ..., 0
    assert attention_spread(last, length) == (pytest.approx(2.5), pytest.approx(3 / 6))
    lattice = torch.zeros(1, length + 2, length + 2)  # FLAT: two word nodes after the characters
    lattice[:, :, :length] = torch.eye(length + 2)[:, :length] * 0.5
    lattice[:, :, length:] = 0.25  # half of each row's weight on the words: left out, the rest renormalised
    assert attention_spread(lattice, length) == (0.0, 1.0)


@pytest.mark.slow
@needs_cjk_font
def test_two_models_one_under_the_other_with_their_spread(tener_model_dir, tmp_path, tiny_config, nerkit):
    from nerkit.training.loop import train

    absolute = tmp_path / "absolute"
    train(tiny_config("encoder.name=transformer", "encoder.n_heads=2", "encoder.head_dim=4",
                      "encoder.num_layers=1", "train.epochs=1"), out=absolute, progress_bar=False)
    one, both = tmp_path / "one.png", tmp_path / "both.png"
    nerkit("plot", "attention", "--model", str(tener_model_dir), "--text", "张三在北京", "--out", str(one), "--layer", "1")
    result = nerkit("plot", "attention", "--model", str(absolute), "--model", str(tener_model_dir),
                    "--text", "张三在北京", "--out", str(both), "--layer", "1")
    spread = [line for line in result.stdout.splitlines() if "mean attended distance" in line]
    assert len(spread) == 2 and "(transformer) layer 1" in spread[0] and "(tener) layer 1" in spread[1]
    assert read_png(one).shape[:2] == (340, 670) and read_png(both).shape[:2] == (600, 670)  # 1 and 2 rows of 2 maps
    wide = tmp_path / "wide"
    train(tiny_config("encoder.name=transformer", "encoder.n_heads=1", "encoder.head_dim=8",
                      "encoder.num_layers=1", "train.epochs=1"), out=wide, progress_bar=False)
    mismatch = nerkit("plot", "attention", "--model", str(wide), "--model", str(tener_model_dir),
                      "--text", "张三", "--out", str(tmp_path / "m.png"), check=False)
    assert mismatch.returncode == 2 and "--head" in mismatch.stderr
    nerkit("plot", "attention", "--model", str(wide), "--model", str(tener_model_dir),
           "--text", "张三", "--out", str(tmp_path / "m.png"), "--head", "1")


@needs_cjk_font
def test_flat_attention_labels_the_lattice_words(tmp_path, tiny_config):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.reports.plot import attention_maps, plot_attention
    from nerkit.training.loop import train

    words = tmp_path / "words.txt"
    words.write_text("张三\n北京\n北京大学\n", encoding="utf-8")
    out = tmp_path / "flat"
    train(tiny_config("encoder.name=flat", "encoder.n_heads=2", "encoder.head_dim=4", "encoder.num_layers=1",
                      f"lexicon.source={words}", "embeddings.word_dim=8", "train.epochs=1"),
          out=out, progress_bar=False)
    labels, layers = attention_maps(Pipeline.load(out), "张三在北京大学")
    assert labels[:7] == list("张三在北京大学") and sorted(labels[7:]) == sorted(["张三", "北京", "北京大学"])
    assert layers[0].shape == (2, 10, 10)
    image = tmp_path / "flat.png"
    plot_attention(out, "张三在北京大学", image)
    assert inked(read_png(image)) > 0.05


def test_a_bilstm_has_no_attention_to_plot(tiny_model_dir, tmp_path, nerkit):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.reports.plot import attention_maps

    with pytest.raises(UserError, match="no attention"):
        attention_maps(Pipeline.load(tiny_model_dir), "张三")
    result = nerkit("plot", "attention", "--model", str(tiny_model_dir), "--text", "张三",
                    "--out", str(tmp_path / "a.png"), check=False)
    assert result.returncode == 2 and "no attention" in result.stderr
    assert not (tmp_path / "a.png").exists()


@pytest.fixture(scope="module")
def memory_model_dir(tmp_path_factory, tiny_config):
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("memory") / "model"
    train(tiny_config("encoder.name=tener", "encoder.n_heads=2", "encoder.head_dim=4", "encoder.num_layers=2",
                      "encoder.memory=6", "encoder.segment=8", "train.epochs=1"), out=out, progress_bar=False)
    return out


def test_memory_attention_sums_every_query_once_by_distance(memory_model_dir):
    """Each query's weights sum to 1, so the weight summed over distances is the number of queries;
    every query sees itself (distance 0); a key of the memory is never nearer than the query's place."""
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.reports.plot_memory import memory_attention

    texts = [list("张伟在北京大学读书，后来去了上海工作。"), list("他们在天安门广场见面，然后去了王府井。")]
    found = memory_attention(Pipeline.load(memory_model_dir), texts)
    span = found.memory + found.segment
    queries = sum(len(t) for t in texts)
    torch.testing.assert_close(found.weight.sum(1), torch.full((2,), float(queries), dtype=torch.float64))
    assert found.pairs[:, span].tolist() == [queries, queries]  # distance 0
    assert found.pairs[:, span + found.memory + found.segment + 1:].sum() == 0  # nothing further than the span
    assert all(0 < share < 1 for share in found.shares)
    assert ((found.by_place > 0) & (found.by_place < 1)).all()


def test_plot_attention_data_draws_the_memory_figure(memory_model_dir, tmp_path, nerkit):
    dev = Path(__file__).resolve().parent / "fixtures" / "tiny_dev.bio"
    out = tmp_path / "memory.png"
    shown = nerkit("plot", "attention", "--model", str(memory_model_dir), "--data", str(dev), "--out", str(out),
                   "--limit", "5").stdout
    assert shown.count("% of attention on the memory") == 2 and shown.endswith(f"wrote {out}\n")
    image = read_png(out)
    assert image.shape[:2] == (380, 1100) and 0.02 < inked(image) < 0.9
    both = nerkit("plot", "attention", "--model", str(memory_model_dir), "--data", str(dev), "--text", "张三",
                  "--out", str(out), check=False)
    assert both.returncode == 2 and "--text" in both.stderr

