"""What an audit writes for people to act on, worst first (every file written atomically):
- suspects.jsonl: every sentence of the corpus, ranked, a line each: its rank, index among the
  file's sentences, file and line, fold, text, suspicion score (and every score of SCORES), its
  suspects (kind, labelled and proposed entity each with the model's probability, evidence) and its
  labelled entities with theirs;
- label-studio.json: the sentences with suspects as Label Studio tasks, the labels as the task's
  annotation and the model's reading (the labels with each suspect's fix applied) as a prediction
  named after its fold model (`model_version`), its score 1 - the strongest evidence so that Label
  Studio's sort by prediction score puts the worst first; importing it, a reviewer sees both and
  accepts or corrects;
- doccano.jsonl: the same sentences as doccano imports them, the labels as labels and the suspects
  in the record's metadata (doccano has one set of labels per text);
- suspects.html: the `top` worst sentences with suspects in context, the disputed labels outlined
  beside the model's reading;
- summary.json: counts by kind, the options, where the corpus came from, the `entity` score's
  per-class thresholds.
"""

from __future__ import annotations

import json
from pathlib import Path

from nerkit.data.annotation import (
    JSON_ARRAY,
    doccano_record,
    label_studio_result,
    model_prediction,
    task_json,
)
from nerkit.data.records import UNKNOWN_KEY, unknown_value
from nerkit.data.tags import Span
from nerkit.files import atomic_write_text
from nerkit.inference.html import esc, highlight, page, type_colors
from nerkit.tools.audit.suspects import KINDS, proposed_labels

FILES = ("suspects.jsonl", "label-studio.json", "doccano.jsonl", "suspects.html", "summary.json")


def unscored(spans) -> list[Span]:
    return [Span(s.start, s.end, s.type) for s in spans]


def sentence_record(audit, rank: int, position: int) -> dict:
    judged = audit.judged[position]
    sent = judged.sentence
    record = {"rank": rank, "index": judged.index, "file": audit.train, "line": sent.line or None,
              "fold": judged.fold, "text": sent.text, "score": round(judged.scores[audit.score], 6),
              "scores": {k: round(v, 6) for k, v in judged.scores.items()},
              "suspects": [s.to_dict(sent.text) for s in judged.suspects],
              "entities": [s.to_dict(sent.text) for s in judged.labelled]}
    if sent.partial:
        record[UNKNOWN_KEY] = unknown_value(sent)
    return record


def review_keys(audit, rank: int, position: int) -> dict:
    judged = audit.judged[position]
    return {"audit_rank": rank, "audit_score": round(judged.scores[audit.score], 6), "index": judged.index,
            "line": judged.sentence.line or None}


def label_studio_task(audit, rank: int, position: int) -> dict:
    judged = audit.judged[position]
    sent, text = judged.sentence, judged.sentence.text
    data = {"text": text, **review_keys(audit, rank, position)}
    if sent.partial:
        data[UNKNOWN_KEY] = unknown_value(sent)
    labelled = unscored(judged.labelled)
    prediction = model_prediction(text, proposed_labels(judged.labelled, judged.suspects),
                                  f"nerkit audit fold {judged.fold}")
    prediction["score"] = round(1.0 - max(s.score for s in judged.suspects), 6)
    return {"data": data, "annotations": [{"result": label_studio_result(text, labelled)}],
            "predictions": [prediction]}


def doccano_task(audit, rank: int, position: int) -> dict:
    judged = audit.judged[position]
    sent = judged.sentence
    return {**doccano_record(sent.text, unscored(judged.labelled), sent.unknown), **review_keys(audit, rank, position),
            "suspects": [s.to_dict(sent.text) for s in judged.suspects]}


def html_page(audit, flagged: list[tuple[int, int]]) -> str:
    colors = type_colors(audit.types)
    rows = []
    for rank, position in flagged:
        judged = audit.judged[position]
        text = judged.sentence.text
        disputed = {s.labelled for s in judged.suspects if s.labelled is not None}
        proposed = {s.proposed for s in judged.suspects if s.proposed is not None}
        kinds = ", ".join(f"{s.kind} {s.score:.2f}" for s in judged.suspects)
        where = f"line {judged.sentence.line}" if judged.sentence.line else f"sentence {judged.index}"
        rows.append(f'<tr><td class="num">{rank}</td><td class="num">{judged.scores[audit.score]:.3f}</td>'
                    f'<td>{esc(where)}</td><td class="text">labels: {highlight(text, unscored(judged.labelled), colors, disputed)}'
                    f'<br>model: {highlight(text, proposed_labels(judged.labelled, judged.suspects), colors, proposed)}'
                    f'</td><td>{esc(kinds)}</td></tr>')
    body = (f"<h1>nerkit audit: {esc(audit.train)}</h1>\n<p class=\"meta\">The {len(flagged):,} sentences with "
            f"suspects ranked worst first by the {esc(audit.score)} score; outlined: the labels disputed and the "
            "model's proposals.</p>\n<table id=\"sentences\"><tr><th>rank</th><th>score</th><th>where</th>"
            "<th>labels and the model's reading</th><th>suspects</th></tr>\n" + "\n".join(rows) + "\n</table>")
    return page(f"nerkit audit: {audit.train}", body)


def summary(audit) -> dict:
    kinds = {kind: sum(s.kind == kind for j in audit.judged for s in j.suspects) for kind in KINDS}
    return {"train": audit.train, "sentences": len(audit.judged), "score": audit.score,
            "folds": len({j.fold for j in audit.judged}),
            "with_suspects": sum(bool(j.suspects) for j in audit.judged), "suspects": kinds,
            "thresholds": {name: round(t, 6) for name, t in audit.thresholds.items()}, "files": list(FILES)}


def write_report(audit, top: int = 200) -> dict:
    """Write FILES into the audit's directory (see the module's docstring); returns the summary."""
    out: Path = audit.out
    ranked = list(enumerate(audit.ranking, 1))
    flagged = [(rank, p) for rank, p in ranked if audit.judged[p].suspects]
    atomic_write_text(out / "suspects.jsonl", "".join(json.dumps(sentence_record(audit, rank, p), ensure_ascii=False)
                                                      + "\n" for rank, p in ranked))
    start, separator, end = JSON_ARRAY
    atomic_write_text(out / "label-studio.json",
                      start + separator.join(task_json(label_studio_task(audit, r, p)) for r, p in flagged) + end)
    atomic_write_text(out / "doccano.jsonl", "".join(json.dumps(doccano_task(audit, r, p), ensure_ascii=False) + "\n"
                                                     for r, p in flagged))
    atomic_write_text(out / "suspects.html", html_page(audit, flagged[:top]))
    found = summary(audit)
    atomic_write_text(out / "summary.json", json.dumps(found, indent=2, ensure_ascii=False) + "\n")
    return found
