"""`nerkit report` and `nerkit predict --format html`: the page holds the evaluation's own scores and
error counts, every sentence with an error, only its own script and no outside resource; corpus text
(a `<script>`, an `<img onerror>`) stays text. In headless Chromium (skipped, saying so, when none
is installed) the page loads without console errors, the filters change what is visible and the
injected script never runs; a 4,000-sentence report is timed there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import TINY_DEV

from nerkit.data.tags import Span
from nerkit.inference.evaluate import ERROR_KINDS
from nerkit.tools.reports.report import FILTER_SCRIPT, confusion

pytest.importorskip("matplotlib", reason="nerkit[report] (matplotlib) is not installed")

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium found (Debian: apt-get install "
                                   "chromium; .ci/run runs `make browser`): the page was only checked with html.parser")

# A gold sentence whose text tries to run code; its ORG entity over "<script>" is surely missed.
HOSTILE = '张三在<script>window.__pwned=1</script>北京<img src=x onerror="window.__pwned=2">&amp;'
HOSTILE_RECORD = {"text": HOSTILE, "entities": [{"start": 0, "end": 2, "type": "PER"},
                                                {"start": 3, "end": 11, "type": "ORG"},
                                                {"start": 39, "end": 41, "type": "LOC"}]}


class Node:
    def __init__(self, tag: str, attrs: dict, parent: "Node | None"):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self, skip: tuple[str, ...] = ()) -> str:
        return "".join(c if isinstance(c, str) else ("" if c.tag in skip else c.text(skip)) for c in self.children)

    def find_all(self, tag: str | None = None, **attrs) -> list["Node"]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                if (tag is None or child.tag == tag) and all(child.attrs.get(k) == v for k, v in attrs.items()):
                    found.append(child)
                found += child.find_all(tag, **attrs)
        return found


class TreeBuilder(HTMLParser):
    """A small DOM from html.parser; fails on a closing tag that closes nothing open."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("#document", {}, None)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.current)
        self.current.children.append(node)
        if tag not in self.VOID:
            self.current = node

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        assert node is not None, f"</{tag}> closes nothing"
        self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(page: str) -> Node:
    builder = TreeBuilder()
    builder.feed(page)
    builder.close()
    assert builder.current is builder.root, f"<{builder.current.tag}> left open"
    return builder.root


@pytest.fixture(scope="module")
def gold_file(tmp_path_factory) -> Path:
    """The tiny dev corpus as JSON lines, plus the hostile sentence."""
    from nerkit.data.corpus import read_corpus

    path = tmp_path_factory.mktemp("gold") / "gold.jsonl"
    lines = []
    for sentence in read_corpus(TINY_DEV).sentences:
        spans = [{"start": s.start, "end": s.end, "type": s.type} for s in sentence.spans()]
        lines.append(json.dumps({"text": sentence.text, "entities": spans}, ensure_ascii=False))
    lines.append(json.dumps(HOSTILE_RECORD, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def report(tiny_model_dir, gold_file, tmp_path_factory) -> tuple[Path, dict]:
    from nerkit.tools.reports.report import write_report

    out = tmp_path_factory.mktemp("report") / "report.html"
    metrics = write_report(tiny_model_dir, gold_file, out)
    return out, metrics


def test_confusion_pairs_entities_by_their_boundaries():
    gold = [[Span(0, 2, "PER"), Span(3, 5, "LOC"), Span(6, 8, "ORG")]]
    predicted = [[Span(0, 2, "PER"), Span(3, 5, "ORG"), Span(6, 7, "ORG"), Span(9, 10, "LOC")]]
    assert confusion(gold, predicted) == {"PER": {"PER": 1}, "LOC": {"ORG": 1}, "ORG": {"(none)": 1},
                                          "(none)": {"ORG": 1, "LOC": 1}}


def test_the_report_shows_the_evaluations_scores_and_errors(report, tiny_model_dir, gold_file):
    from nerkit.inference.pipeline import Pipeline

    out, metrics = report
    evaluation = Pipeline.load(tiny_model_dir).predict_and_score(gold_file, with_errors=True, with_calibration=True)
    assert metrics == evaluation.metrics  # the one evaluation path
    dom = parse(out.read_text(encoding="utf-8"))
    (ece,) = dom.find_all("b", id="ece")  # how sure the model is: the calibration section, its figure and tables
    assert ece.text() == f"{metrics['calibration']['ece']:.4f}"
    assert dom.find_all("section", id="calibration")[0].find_all("svg")
    (f1,) = dom.find_all("td", id="overall-f1")
    assert f1.text() == f"{100 * metrics['f1']:.2f}"
    (breakdown,) = dom.find_all("table", **{"class": "errors"})
    rows = [[td.text() for td in tr.find_all("td")] for tr in breakdown.find_all("tr")[1:]]
    for row in rows[:-1]:
        counts = metrics["errors"][row[0]]
        assert row[2:] == [str(counts[k]) for k in ERROR_KINDS]
    assert rows[-1][0] == "overall"
    assert len(dom.find_all("section", id="curves")[0].find_all("svg")) == 1  # the training curves, inline


def test_every_sentence_with_an_error_is_listed_with_its_kinds(report, tiny_model_dir, gold_file):
    from nerkit.inference.evaluate import sentence_errors
    from nerkit.inference.pipeline import Pipeline

    out, _ = report
    evaluation = Pipeline.load(tiny_model_dir).predict_and_score(gold_file, with_errors=True)
    expected = []
    for sentence, predicted in zip(evaluation.sentences, evaluation.predicted):
        kinds = sorted({k for _, k in sentence_errors(sentence.spans(), predicted) if k != "correct"})
        if kinds:
            expected.append((sentence.text, "|".join(kinds)))
    (body,) = parse(out.read_text(encoding="utf-8")).find_all("tbody", id="error-rows")
    rows = body.find_all("tr")
    got = [(tr.find_all("td", **{"class": "text gold"})[0].text(skip=("sub",)), tr.attrs["data-kinds"]) for tr in rows]
    assert got == expected and len(got) >= 2
    assert all("hidden" in tr.attrs for tr in rows)  # the script shows them a page at a time


def test_corpus_text_stays_text_and_the_page_needs_nothing_outside(report):
    out, _ = report
    page = out.read_text(encoding="utf-8")
    dom = parse(page)
    scripts = dom.find_all("script")
    assert [s.text() for s in scripts] == [FILTER_SCRIPT]
    assert not dom.find_all("img") and "window.__pwned" not in "".join(s.text() for s in scripts)
    assert not [n for n in dom.find_all() if {"src", "href"} & set(n.attrs)]  # no outside resource
    assert not [n for n in dom.find_all() if any(a.startswith("on") for a in n.attrs)]
    hostile_rows = [tr for tr in dom.find_all("tr") if "__pwned" in tr.text()]
    (row,) = hostile_rows
    assert row.find_all("td", **{"class": "text gold"})[0].text(skip=("sub",)) == HOSTILE
    assert "&lt;script&gt;" in page and "&amp;amp;" in page


def test_a_model_without_training_history_still_gets_a_report(tiny_model_dir, gold_file, tmp_path):
    from nerkit.tools.reports.report import write_report

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "metrics.jsonl").unlink()
    write_report(model, gold_file, tmp_path / "r.html")
    dom = parse((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert not dom.find_all("section", id="curves")[0].find_all("svg")
    assert "No training history" in dom.find_all("section", id="curves")[0].text()


def test_report_from_the_command_line(tiny_model_dir, gold_file, tmp_path, nerkit):
    out = tmp_path / "r.html"
    result = nerkit("report", "--model", str(tiny_model_dir), "--data", str(gold_file), "--out", str(out))
    assert "F1" in result.stdout and out.is_file()
    refused = nerkit("report", "--model", str(tiny_model_dir), "--data", str(gold_file), "--out", str(gold_file),
                     check=False)
    assert refused.returncode == 2 and "input file" in refused.stderr


def test_predict_html_is_a_page_of_escaped_highlighted_records(tiny_model_dir, tmp_path):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.inference.stream import predict_stream

    texts = ["张三在北京大学读书。", HOSTILE, "", "上海"]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    pipe = Pipeline.load(tiny_model_dir)
    out = tmp_path / "out.html"
    assert predict_stream(pipe, str(source), str(out), "html", chunk_chars=5) == len(texts)  # several chunks
    dom = parse(out.read_text(encoding="utf-8"))
    records = dom.find_all("p", **{"class": "rec"})
    assert [p.text(skip=("sub",)) for p in records] == texts
    expected = pipe.predict(texts)
    for p, entities in zip(records, expected):
        assert [(m.text(skip=("sub",)), m.attrs["title"]) for m in p.find_all("mark")] == \
            [(e["text"], e["type"]) for e in entities]
    assert not dom.find_all("script") and not dom.find_all("img")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    predict_stream(pipe, str(empty), str(out), "html")
    assert parse(out.read_text(encoding="utf-8")).find_all("body")


# ----------------------------------------------------------------------------- in a browser

PROBE = """<script>
(function () {
  function visible() {
    return Array.prototype.filter.call(document.querySelectorAll('#error-rows > tr'), function (r) {
      return !r.hidden; }).map(function (r) { return [r.dataset.types, r.dataset.kinds]; });
  }
  var out = {all: visible()};
  var type = document.getElementById('filter-type'), kind = document.getElementById('filter-kind');
  type.value = 'LOC'; type.dispatchEvent(new Event('change')); out.loc = visible();
  type.value = ''; kind.value = 'missed'; kind.dispatchEvent(new Event('change')); out.missed = visible();
  kind.value = ''; kind.dispatchEvent(new Event('change'));
  if (!document.getElementById('next').disabled) { document.getElementById('next').click(); }
  out.second_page = visible().length;
  out.shown = document.getElementById('shown').textContent;
  out.pwned = window.__pwned === undefined ? null : window.__pwned;
  out.f1 = document.getElementById('overall-f1').textContent;
  out.ms = performance.now();
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def in_browser(page: Path, tmp_path: Path) -> tuple[dict, list[str]]:
    """Open a copy of `page` with the probe script added at its end; returns the probe's findings and
    the console messages."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "\n</body>"), encoding="utf-8")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                             "--enable-logging=stderr", "--v=0", probed.as_uri()],
                            capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    import html

    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return json.loads(html.unescape(found.group(1))), console


@pytest.mark.slow
@needs_browser
def test_the_report_in_a_browser(report, tmp_path):
    out, metrics = report
    found, console = in_browser(out, tmp_path)
    assert console == []
    assert found["pwned"] is None
    assert found["f1"] == f"{100 * metrics['f1']:.2f}"
    assert found["all"] and all("LOC" in t.split("|") for t, _ in found["loc"])
    assert 0 < len(found["loc"]) < len(found["all"])
    assert found["missed"] and all("missed" in k.split("|") for _, k in found["missed"])


@pytest.mark.slow
@needs_browser
def test_predictions_page_in_a_browser(tiny_model_dir, tmp_path):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.inference.stream import predict_stream

    source = tmp_path / "texts.txt"
    source.write_text(HOSTILE + "\n张三在北京\n", encoding="utf-8")
    out = tmp_path / "out.html"
    predict_stream(Pipeline.load(tiny_model_dir), str(source), str(out), "html")
    page = out.read_text(encoding="utf-8").replace("</body>", "<script>var pre = document.createElement('pre');"
                                                   "pre.id = 'probe'; pre.textContent = JSON.stringify({pwned: "
                                                   "window.__pwned === undefined ? null : window.__pwned});"
                                                   "document.body.appendChild(pre);</script></body>")
    probed = tmp_path / "probed.html"
    probed.write_text(page, encoding="utf-8")
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                             "--enable-logging=stderr", "--v=0", probed.as_uri()],
                            capture_output=True, text=True, timeout=120)
    assert '<pre id="probe">{"pwned":null}</pre>' in result.stdout
    assert [line for line in result.stderr.splitlines() if ":CONSOLE" in line] == []


@pytest.mark.slow
@needs_browser
def test_a_report_of_4000_sentences_stays_usable(tiny_model_dir, gold_file, tmp_path):
    from nerkit.tools.reports.report import ROWS_PER_PAGE, write_report

    lines = gold_file.read_text(encoding="utf-8").splitlines()
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join(lines * (4000 // len(lines) + 1)) + "\n", encoding="utf-8")
    out = tmp_path / "big.html"
    started = time.perf_counter()
    write_report(tiny_model_dir, big, out)
    written = time.perf_counter() - started
    found, console = in_browser(out, tmp_path)
    assert console == []
    assert len(found["all"]) == ROWS_PER_PAGE and found["second_page"] == ROWS_PER_PAGE
    print(f"\n4,000+ sentences: report written in {written:.1f} s, {out.stat().st_size / 1e6:.1f} MB, "
          f"loaded and filtered in the browser in {found['ms']:.0f} ms")
    assert found["ms"] < 10_000
