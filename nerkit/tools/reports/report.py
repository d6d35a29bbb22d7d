"""HTML pages: `nerkit report` (a model on a gold corpus: scores, training curves, a confusion table
of entity types, the error breakdown and every sentence with an error, filterable) and the records
of `nerkit predict --format html`. Both highlight entities the same way (`highlight`).

A page is one self-contained file: styles, script and the curves (inline SVG) are inside it and
nothing is fetched. Every piece of corpus text goes through `html.escape`, so a sentence holding
`<script>` shows as text; the script only shows and hides rows that are already there.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from nerkit.data.tags import Span
from nerkit.inference.evaluate import ERROR_KINDS, sentence_errors
from nerkit.inference.html import esc, highlight, page, type_colors

log = logging.getLogger(__name__)


NONE = "(none)"  # the confusion table's row and column for "no entity with these boundaries"


KIND_LABELS = {"correct": "correct", "wrong_type": "wrong type", "wrong_boundary": "wrong boundary",
               "wrong_both": "wrong both", "missed": "missed", "spurious": "spurious"}


ROWS_PER_PAGE = 100


FILTER_SCRIPT = """
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll('#error-rows > tr'));
  var typeSelect = document.getElementById('filter-type'), kindSelect = document.getElementById('filter-kind');
  var shown = document.getElementById('shown'), page = 0, PAGE = %d, matching = rows;
  function has(row, key, value) { return !value || row.dataset[key].split('|').indexOf(value) >= 0; }
  function render() {
    var first = page * PAGE;
    rows.forEach(function (row) { row.hidden = true; });
    matching.slice(first, first + PAGE).forEach(function (row) { row.hidden = false; });
    shown.textContent = matching.length ? 'rows ' + (first + 1) + '-' + Math.min(first + PAGE, matching.length) +
      ' of ' + matching.length : 'no sentence matches';
    document.getElementById('prev').disabled = page === 0;
    document.getElementById('next').disabled = first + PAGE >= matching.length;
  }
  function filter() {
    matching = rows.filter(function (row) {
      return has(row, 'types', typeSelect.value) && has(row, 'kinds', kindSelect.value);
    });
    page = 0;
    render();
  }
  typeSelect.addEventListener('change', filter);
  kindSelect.addEventListener('change', filter);
  document.getElementById('prev').addEventListener('click', function () { page -= 1; render(); });
  document.getElementById('next').addEventListener('click', function () { page += 1; render(); });
  filter();
})();
""" % ROWS_PER_PAGE


# ----------------------------------------------------------------------------- the report


def confusion(gold: list[list[Span]], predicted: list[list[Span]]) -> dict[str, dict[str, int]]:
    """Entities paired by their exact boundaries: counts[gold type][predicted type], with `NONE` for
    a gold entity that no prediction has the boundaries of (missed, or found with other edges) and
    for a prediction that no gold entity has the boundaries of. The diagonal is what is correct."""
    counts: dict[str, dict[str, int]] = {}

    def add(g: str, p: str) -> None:
        row = counts.setdefault(g, {})
        row[p] = row.get(p, 0) + 1

    for g_spans, p_spans in zip(gold, predicted):
        by_edges = {(p.start, p.end): p.type for p in p_spans}
        gold_edges = {(g.start, g.end) for g in g_spans}
        for g in g_spans:
            add(g.type, by_edges.get((g.start, g.end), NONE))
        for p in p_spans:
            if (p.start, p.end) not in gold_edges:
                add(NONE, p.type)
    return counts


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def scores_table(metrics: dict) -> str:
    rows = ["<tr><th>type</th><th class=num>precision</th><th class=num>recall</th><th class=num>F1</th>"
            "<th class=num>support</th></tr>"]
    for t, m in metrics["per_type"].items():
        rows.append(f"<tr><td>{esc(t)}</td><td class=num>{_pct(m['precision'])}</td><td class=num>"
                    f"{_pct(m['recall'])}</td><td class=num>{_pct(m['f1'])}</td><td class=num>{m['support']}</td></tr>")
    rows.append(f'<tr class="total"><td>overall</td><td class=num>{_pct(metrics["precision"])}</td><td class=num>'
                f'{_pct(metrics["recall"])}</td><td class=num id="overall-f1">{_pct(metrics["f1"])}</td>'
                f'<td class=num>{metrics["counts"]["gold"]}</td></tr>')
    for kind, m in metrics.get("nesting", {}).items():  # nested gold: the scores by nesting class
        rows.append(f'<tr class="nesting"><td>{kind} entities</td><td class=num>{_pct(m["precision"])}</td>'
                    f'<td class=num>{_pct(m["recall"])}</td><td class=num id="{kind}-f1">{_pct(m["f1"])}</td>'
                    f'<td class=num>{m["support"]}</td></tr>')
    return f'<table class="scores">{"".join(rows)}</table>'


def confusion_table(counts: dict[str, dict[str, int]]) -> str:
    types = sorted({t for t in counts if t != NONE} | {p for row in counts.values() for p in row if p != NONE})
    axis = types + [NONE]
    head = "<tr><th>gold \\ predicted</th>" + "".join(f"<th class=num>{esc(p)}</th>" for p in axis) + "</tr>"
    body = []
    for g in axis:
        cells = []
        for p in axis:
            n = counts.get(g, {}).get(p, 0)
            cells.append(f"<td class=num>{n if n and not (g == p == NONE) else ''}</td>")
        body.append(f"<tr><th>{esc(g)}</th>{''.join(cells)}</tr>")
    return f'<table class="confusion">{head}{"".join(body)}</table>'


def errors_table(counts: dict[str, dict[str, int]], by_nesting: dict[str, dict[str, int]] | None = None) -> str:
    """The error kinds by type and overall, then (nested gold) by nesting class."""
    head = ("<tr><th>type</th><th class=num>gold</th>" + "".join(f"<th class=num>{KIND_LABELS[k]}</th>"
                                                                for k in ERROR_KINDS) + "</tr>")
    total = {k: sum(c[k] for c in counts.values()) for k in ERROR_KINDS}
    rows = []
    for t, c in [*counts.items(), ("overall", total)]:
        gold = sum(c[k] for k in ERROR_KINDS[:5])
        css = ' class="total"' if t == "overall" and c is total else ""
        rows.append(f"<tr{css}><td>{esc(t)}</td><td class=num>{gold}</td>"
                    + "".join(f"<td class=num>{c[k]}</td>" for k in ERROR_KINDS) + "</tr>")
    for kind, c in (by_nesting or {}).items():
        rows.append(f'<tr class="nesting"><td>{kind} entities</td><td class=num>{sum(c[k] for k in ERROR_KINDS[:5])}'
                    "</td>" + "".join(f"<td class=num>{c[k]}</td>" for k in ERROR_KINDS) + "</tr>")
    return f'<table class="errors">{head}{"".join(rows)}</table>'


def sentence_rows(sentences, predicted: list[list[Span]], colors: dict[str, str]) -> tuple[list[str], int]:
    """A table row for each sentence with an error (gold and predicted side by side, errors
    outlined, the row tagged with its error types and kinds for the filters), and how many."""
    rows = []
    for index, (sentence, p_spans) in enumerate(zip(sentences, predicted)):
        g_spans = sentence.spans()
        found = [(span, kind) for span, kind in sentence_errors(g_spans, p_spans) if kind != "correct"]
        if not found:
            continue
        text = "".join(sentence.tokens)
        wrong_gold = {span for span, kind in found if kind != "spurious"}
        wrong_predicted = set(p_spans) - set(g_spans)
        types = sorted({span.type for span, _ in found} | {p.type for p in wrong_predicted})
        kinds = sorted({kind for _, kind in found})
        listed = "".join(f'<span>{esc(KIND_LABELS[kind])} {esc(span.type)} '
                         f'&ldquo;{esc(text[span.start:span.end])}&rdquo;</span><br>' for span, kind in found)
        where = f"{sentence.line}" if sentence.line else f"#{index + 1}"
        rows.append(f'<tr data-types="{esc("|".join(types))}" data-kinds="{esc("|".join(kinds))}" hidden>'
                    f'<td class=num>{esc(where)}</td>'
                    f'<td class="text gold">{highlight(text, g_spans, colors, wrong_gold)}</td>'
                    f'<td class="text predicted">{highlight(text, p_spans, colors, wrong_predicted)}</td>'
                    f'<td class="kinds">{listed}</td></tr>')
    return rows, len(rows)


def build_report(evaluation, title: str, meta: list[tuple[str, str]], curves_svg: str | None,
                 reliability_svg: str | None = None) -> str:
    """The report page of an `Evaluation` (with errors, and calibration when its predictions were
    scored); `meta`: (label, value) lines under the title; `curves_svg`, `reliability_svg`: the
    training curves and the reliability figure as SVG documents, or None."""
    metrics, sentences, predicted = evaluation.metrics, evaluation.sentences, evaluation.predicted
    gold = [s.spans() for s in sentences]
    colors = type_colors([s.type for spans in gold + predicted for s in spans])
    rows, count = sentence_rows(sentences, predicted, colors)
    kinds_present = sorted({k for c in metrics["errors"].values() for k in ERROR_KINDS[1:] if c[k]},
                           key=ERROR_KINDS.index)
    type_options = "".join(f'<option value="{esc(t)}">{esc(t)}</option>' for t in colors)
    kind_options = "".join(f'<option value="{k}">{KIND_LABELS[k]}</option>' for k in kinds_present)
    meta_html = "".join(f"<div><b>{esc(label)}</b>: {esc(value)}</div>" for label, value in meta)
    if curves_svg is None:
        curves = "<p>No training history (metrics.jsonl) in the model directory.</p>"
    else:
        curves = f'<div class="curves">{curves_svg[curves_svg.index("<svg"):]}</div>'
    body = f"""<h1>{esc(title)}</h1>
<div class="meta">{meta_html}</div>
<section id="scores"><h2>Scores</h2>
{scores_table(metrics)}</section>
<section id="curves"><h2>Training curves</h2>
{curves}</section>
{calibration_section(metrics.get("calibration"), reliability_svg)}
<section id="confusion"><h2>Entity types</h2>
<p>Gold and predicted entities paired by their exact boundaries; {NONE}: no entity with those boundaries on
that side.</p>
{confusion_table(confusion(gold, predicted))}</section>
<section id="breakdown"><h2>Errors by kind</h2>
<p>What became of each gold entity (wrong type: the same boundaries, another type; wrong boundary: an
overlapping prediction of its type; wrong both: only overlapping predictions of other types; missed:
no overlapping prediction), and predictions that overlap no gold entity (spurious). With nested gold,
also by nesting class: nested entities share a character with another gold entity (a prediction, with
a nested gold entity), flat ones do not.</p>
{errors_table(metrics["errors"], metrics.get("errors_by_nesting"))}</section>
<section id="sentences"><h2>Sentences with an error ({count} of {len(sentences)})</h2>
<div class="filters">
<label>type <select id="filter-type"><option value="">all</option>{type_options}</select></label>
<label>error <select id="filter-kind"><option value="">all</option>{kind_options}</select></label>
<button id="prev" type="button">&larr; previous</button><button id="next" type="button">next &rarr;</button>
<span id="shown"></span>
</div>
<table><thead><tr><th>line</th><th>gold</th><th>predicted</th><th>errors</th></tr></thead>
<tbody id="error-rows">
{chr(10).join(rows)}
</tbody></table></section>"""
    return page(title, body, FILTER_SCRIPT)


def _fraction(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def calibration_section(found: dict | None, svg: str | None) -> str:
    """How honest the entity scores are: the reliability figure and the bins and thresholds as tables."""
    if found is None:
        return ""
    bins = "".join(f"<tr><td>{b['low']:.1f}-{b['high']:.1f}</td><td class=num>{b['count']}</td>"
                   f"<td class=num>{_fraction(b['mean_score'])}</td><td class=num>{_fraction(b['accuracy'])}</td></tr>"
                   for b in found["bins"])
    thresholds = "".join(f"<tr><td>{t['threshold']:.2f}</td><td class=num>{_pct(t['precision'])}</td><td class=num>"
                         f"{_pct(t['recall'])}</td><td class=num>{_pct(t['f1'])}</td></tr>" for t in found["thresholds"])
    figure = f'<div class="curves">{svg[svg.index("<svg"):]}</div>' if svg else ""
    return f"""<section id="calibration"><h2>How sure the model is</h2>
<p>Each predicted entity's score is the probability the model gives exactly that span with exactly that
type; an entity is right when the gold file has it. Honest scores put each bin's share right near its
mean score: expected calibration error <b id="ece">{found['ece']:.4f}</b>, Brier score {found['brier']:.4f},
over {found['entities']:,} entities (<code>nerkit calibrate</code> fits a temperature on a dev set).</p>
{figure}
<table class="scores"><tr><th>score</th><th class=num>entities</th><th class=num>mean score</th><th class=num>share right</th></tr>{bins}</table>
<table class="scores"><tr><th>min score</th><th class=num>precision</th><th class=num>recall</th><th class=num>F1</th></tr>{thresholds}</table></section>"""


def reliability_svg(calibration: dict, label: str) -> str:
    from nerkit.tools.reports.plot import figure_bytes, load_matplotlib, reliability_figure, style

    matplotlib = load_matplotlib()
    with matplotlib.rc_context(style(label)):
        return figure_bytes(reliability_figure(calibration), "svg").decode("utf-8")


def curves_svg(model_dir: Path) -> str | None:
    """The run's training curves as SVG text, or None without a metrics.jsonl."""
    if not (model_dir / "metrics.jsonl").is_file():
        return None
    from nerkit.tools.reports.plot import curves_figure, figure_bytes, load_matplotlib, style

    matplotlib = load_matplotlib()
    with matplotlib.rc_context(style(model_dir.name)):
        return figure_bytes(curves_figure([model_dir]), "svg").decode("utf-8")


def write_report(model_dir: str | Path, data: str | Path, out: str | Path, batch_size: int = 128,
                 repair: bool | None = None, device: str = "cpu", threads: int | None = None) -> dict:
    """`nerkit report`: evaluate the model on `data` (Pipeline.evaluation, the one evaluation
    path) and write the page to `out` atomically. Returns the metrics. `threads`: torch's
    (nerkit.device.set_threads; None: as they are)."""
    from nerkit.device import set_threads
    from nerkit.files import atomic_write_text, check_output
    from nerkit.inference.pipeline import Pipeline

    model_dir, out = Path(model_dir), Path(out)
    check_output(out, data)
    if threads is not None:
        set_threads(threads)
    pipe = Pipeline.load(model_dir, device=device)
    evaluation = pipe.predict_and_score(data, batch_size, repair=repair, with_errors=True, with_calibration=True)
    meta = [("model", str(model_dir)), ("encoder", pipe.config.encoder.name), ("data", str(data)),
            ("sentences", f"{len(evaluation.sentences):,}"),
            ("prediction", f"{evaluation.seconds:.1f} s"), ("written", time.strftime("%Y-%m-%d %H:%M"))]
    page_html = build_report(evaluation, f"nerkit report: {model_dir.name}", meta, curves_svg(model_dir),
                             reliability_svg(evaluation.metrics["calibration"], model_dir.name))
    atomic_write_text(out, page_html)
    return evaluation.metrics
