"""HTML pieces shared by `nerkit predict --format html` and the report: escaping, type colours, the
entity highlighting and the page frame. Every piece of text goes through `html.escape`."""

from __future__ import annotations

import html

from nerkit.data.tags import Span

PALETTE = ("#ffd6a5", "#caffbf", "#9bf6ff", "#bdb2ff", "#ffc6ff", "#fdffb6", "#a0c4ff", "#ffadad")


STYLE = """
body { font-family: system-ui, "Noto Sans CJK SC", "WenQuanYi Micro Hei", "Microsoft YaHei", sans-serif;
       margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; }
.meta { color: #555; }
.curves svg { max-width: 100%; height: auto; }
mark.ent { padding: 0 1px; border-radius: 3px; background: #eee; }
mark.ent sub { font-size: 0.65em; color: #444; margin-left: 1px; }
mark.ent.err { outline: 2px solid #d00; }
#sentences td.text { line-height: 1.9; }
.filters { margin: 0.5em 0; display: flex; gap: 1em; align-items: center; flex-wrap: wrap; }
.kinds span { font-size: 0.85em; }
tr[hidden] { display: none; }
p.rec { line-height: 1.9; margin: 0.3em 0; }
"""


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def type_colors(types) -> dict[str, str]:
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(sorted(set(types)))}


def highlight(text: str, spans: list[Span], colors: dict[str, str], wrong: set[Span] = frozenset()) -> str:
    """`text` as escaped HTML with each entity of `spans` in a `<mark>` showing its type; those in
    `wrong` are outlined as errors. A nested entity is a mark inside its outer one's; of two that
    cross, the later is left out (no HTML element can hold half of another), never any text."""
    return _marks(text, sorted(set(spans), key=lambda s: (s.start, -s.end, s.type)), 0, 0, len(text), colors, wrong)[0]


def _marks(text: str, spans: list[Span], i: int, low: int, high: int, colors: dict[str, str],
           wrong: set[Span]) -> tuple[str, int]:
    """The HTML of text[low:high] with the marks of spans[i:] that lie in it (spans sorted outer
    first), and the index of the first span after them."""
    out, position = [], low
    while i < len(spans) and spans[i].start < high:
        span = spans[i]
        i += 1
        if span.start < position or span.end > high:  # crosses one already shown
            continue
        inner, i = _marks(text, spans, i, span.start, span.end, colors, wrong)
        css = "ent err" if span in wrong else "ent"
        color = colors.get(span.type, "#eee")
        out.append(esc(text[position:span.start]))
        out.append(f'<mark class="{css}" style="background:{color}" title="{esc(span.type)}">'
                   f'{inner}<sub>{esc(span.type)}</sub></mark>')
        position = span.end
    out.append(esc(text[position:high]))
    return "".join(out), i


def page_start(title: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="zh">\n<head>\n<meta charset="utf-8">\n<title>{esc(title)}</title>\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<style>{STYLE}</style>\n'
            # Without a script to page through them, every row is shown.
            '<noscript><style>tr[hidden] { display: table-row; }</style></noscript>\n</head>\n<body>\n')


def page_end(script: str = "") -> str:
    return (f"<script>{script}</script>\n" if script else "") + "</body>\n</html>\n"


def page(title: str, body: str, script: str = "") -> str:
    return page_start(title) + body + "\n" + page_end(script)


# ----------------------------------------------------------------------------- predict --format html


def predictions_header(title: str = "nerkit predictions") -> str:
    """What `nerkit predict --format html` writes before its records (`page`'s start)."""
    return page_start(title) + f"<h1>{esc(title)}</h1>\n"


def prediction_record(text: str, spans: list[Span], colors: dict[str, str]) -> str:
    return f'<p class="rec">{highlight(text, spans, colors)}</p>\n'


def predictions_footer() -> str:
    return page_end()
