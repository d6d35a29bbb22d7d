"""The Markdown table of a benchmark's records: one row per matrix entry (seeds aggregated), the
published figure beside nerkit's, then the anchors' sources and the failed runs."""

from __future__ import annotations

import statistics


def short_error(error: str) -> str:
    """The first line of a failure (how the worker ended) and its last (the error, or where it was)."""
    lines = error.splitlines() or [""]
    return lines[0] if len(lines) == 1 else f"{lines[0]}: {lines[-1]}"


def spread(values: list[float | None]) -> dict | None:
    """min, median and max of a figure over rounds (None where a round lacks it)."""
    if not values or any(v is None for v in values):
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def spread_text(figure: dict | None, digits: int = 0) -> str:
    """`min / median / max` of a `spread`, or – ."""
    if not figure:
        return "–"
    return " / ".join(f"{figure[k]:,.{digits}f}" for k in ("min", "median", "max"))


def _mean_std(values: list[float], scale: float = 100.0) -> str:
    mean = statistics.fmean(values) * scale
    if len(values) > 1:
        return f"{mean:.2f} ± {statistics.stdev(values) * scale:.2f}"
    return f"{mean:.2f}"


def _stopped(runs: list[dict]) -> str:
    """Why training ended, when it was not the configured number of epochs: ' (time budget)' etc."""
    reasons = {r.get("stopped") for r in runs} - {None, "epochs"}
    return f" ({', '.join(sorted(reasons)).replace('_', ' ')})" if reasons else ""


def _published(anchors: dict, dataset: str, encoder: str) -> dict | None:
    """The first anchor of the dataset mapped to the encoder: the one its row is compared with."""
    return next((a for a in anchors.get(dataset, {}).get("anchors", []) if a.get("encoder") == encoder), None)


def _distinct(records: list[dict], key: str) -> str:
    values = sorted({str(r.get(key)) for r in records if r.get(key) is not None})
    return ", ".join(values) if values else "unknown"


def render_markdown(records: list[dict], anchors: dict, title: str = "nerkit benchmark") -> str:
    """The results table (one row per matrix entry, seeds aggregated) with the published figure
    beside nerkit's, then the anchors' sources and the failed runs."""
    ok = [r for r in records if r.get("status") == "ok"]
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["run"], []).append(r)
    gpu = any(r.get("peak_cuda_mib") for r in ok)
    lines = [f"# {title}", ""] + (_preamble(ok, gpu) + [""] if ok else [])
    header = ["Dataset", "Encoder", "Run", "Seeds", "Test P", "Test R", "Test F1", "Published F1", "Δ", "Dev F1",
              "Epochs", "Train chars/s", "Predict chars/s", "Peak RSS MiB"] + (["Peak GPU MiB"] if gpu else []) + ["Wall s"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group, runs in groups.items():
        if any(r.get("status") == "ok" for r in runs):
            lines.append("| " + " | ".join(_row(group, runs, anchors, gpu)) + " |")
    lines += _rounds(ok) + _notes(ok) + _sources(ok, anchors)
    failed = [r for r in records if r.get("status") != "ok"]
    if failed:
        lines += ["", "Failed runs (the full error is in results.jsonl and logs/NAME.log):"]
        lines += [f"- `{r['name']}`: {short_error(r['error'])}" for r in failed]
    return "\n".join(lines) + "\n"


def _preamble(ok: list[dict], gpu: bool) -> list[str]:
    """Where and how the runs ran: versions, commit, host, dates, shared overrides, concurrency."""
    commits = sorted({r["git_commit"] + ("-dirty" if r.get("git_dirty") else "") for r in ok})
    days = sorted({r["date"][:10] for r in ok})
    gpus = _distinct(ok, "gpu")
    lines = [f"- nerkit {_distinct(ok, 'nerkit_version')}, commit {', '.join(commits)}; torch "
             f"{_distinct(ok, 'torch_version')}; device {_distinct(ok, 'device')}"
             + (f" ({gpus})" if gpus != "unknown" else "") + f"; torch threads {_distinct(ok, 'torch_threads')}",
             f"- host {_distinct(ok, 'hostname')}: {_distinct(ok, 'cpu')}; "
             + (days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}")
             + ("; **quick mode** (a small slice of training: a smoke test, not a result)"
                if any(r.get("quick") for r in ok) else "")]
    common = [o for o in ok[0].get("overrides", []) if not o.startswith("train.seed=")
              and all(o in r.get("overrides", []) for r in ok)]
    if common:
        lines.append("- overrides of every run: " + ", ".join(f"`{o}`" for o in common))
    jobs = max(r.get("jobs") or 1 for r in ok)
    if jobs > 1:
        shared = "cores and GPU" if gpu else "cores"
        lines.append(f"- up to {jobs} runs trained at once on this machine (`--jobs {jobs}`): they shared its "
                     f"{shared}, so each run's speed is lower than it would be alone")
    continued = [f"`{r['name']}`" + _sessions(r) for r in ok if r.get("continued")]
    if continued:
        lines.append(f"- continued from their checkpoints by `nerkit bench --resume`: {', '.join(continued)}; "
                     "their epochs and training chars/s cover all their training, their wall time and peak memory "
                     "every `nerkit bench` session of theirs that wrote a record (not one killed outright), their "
                     "overrides are the last session's")
    return lines


def _sessions(record: dict) -> str:
    """` (sessions at commits a1b2c3d, e4f5a6b)` for a continued run whose record lists them."""
    commits = record.get("session_commits")
    return f" (sessions at commits {', '.join(c[:7] for c in commits)})" if commits else ""


def _row(group: str, runs: list[dict], anchors: dict, gpu: bool) -> list[str]:
    """One matrix entry's cells: its seeds' figures aggregated, beside the published one."""
    good = [r for r in runs if r.get("status") == "ok"]
    first = good[0]
    test = [r["test"] for r in good if r.get("test")]
    f1 = statistics.fmean(t["f1"] for t in test) * 100 if test else None
    anchor = _published(anchors, first["dataset"], first["encoder"])
    steady = [r["train_chars_per_s_steady"] for r in good]
    encoder = first["encoder"] + (" †" if any(r.get("pretrained") for r in good) else "")
    seeds = f"{len(good)}" if len(good) == len(runs) else f"{len(good)} of {len(runs)}"
    return [
        first["dataset"], encoder, group, seeds,
        _mean_std([t["precision"] for t in test]) if test else "–",
        _mean_std([t["recall"] for t in test]) if test else "–",
        _mean_std([t["f1"] for t in test]) if test else "–",
        f"{anchor['test_f1']:.2f}" if anchor else "–",
        f"{f1 - anchor['test_f1']:+.2f}" if anchor and f1 is not None else "–",
        _mean_std([r["dev"]["f1"] for r in good]),
        f"{statistics.fmean(r['epochs'] for r in good):g}" + _stopped(good),
        # 0 when a run took fewer steps than the warm-up that steady state excludes
        f"{statistics.fmean(steady):,.0f}" if all(steady) else "n/a",
        f"{statistics.fmean(r['predict_chars_per_s'] for r in good):,.0f}",
        f"{max(r['peak_rss_mib'] for r in good):,.0f}",
    ] + ([f"{max(r.get('peak_cuda_mib') or 0 for r in good):,.0f}"] if gpu else []) + [
        f"{statistics.fmean(r['wall_s'] for r in good):,.0f}",
    ]


def _rounds(ok: list[dict]) -> list[str]:
    """The speed of each run measured in several rounds (`rounds:`): min / median / max, then each round."""
    repeated = [r for r in ok if r.get("rounds")]
    if not repeated:
        return []
    # the fixed cost of a whole run (start-up, reading, evaluation, writing: wall s less the training
    # steps and the timed prediction pass), where the records measured it
    fixed = any(r["spread"].get("fixed_s") for r in repeated)
    lines = ["", "Runs measured in several rounds (each trained and timed again; the table above shows the last):", "",
             "| Run | Rounds | Processes | Train chars/s steady (min / median / max) | Predict chars/s (min / median / max) "
             + ("| Fixed s (min / median / max) " if fixed else "")
             + "| Train chars/s steady, each round |", "|---|---:|---:|---|---|" + ("---|" if fixed else "") + "---|"]
    for r in repeated:
        each = ", ".join(f"{f['train_chars_per_s_steady']:,.0f}" for f in r["rounds"])
        lines.append(f"| {r['name']} | {len(r['rounds'])} | {r.get('nproc') or 1} | "
                     f"{spread_text(r['spread'].get('train_chars_per_s_steady'))} | "
                     f"{spread_text(r['spread'].get('predict_chars_per_s'))} | "
                     + (f"{spread_text(r['spread'].get('fixed_s'), 1)} | " if fixed else "") + f"{each} |")
    return lines


def _notes(ok: list[dict]) -> list[str]:
    batch_sizes = _distinct(ok, "predict_batch_size")
    return ["",
            "nerkit's runs use random-init embeddings unless the config sets pretrained vectors (rows marked † "
            "do); every published figure below was obtained with pretrained embeddings.",
            "",
            "Test P/R/F1 and dev F1 in %: mean ± sample standard deviation over seeds (± only with more than one "
            "seed); the model is selected on dev and the test set is scored once. Δ = nerkit's test F1 minus "
            "the published one. Train chars/s: steady state (after the first warm-up batches of training). "
            f"Predict chars/s: `Pipeline.predict_tokens` over the test set (dev for a run without one) at batch "
            f"size {batch_sizes}, timed "
            "after one warm-up batch. Peak RSS: the largest over seeds. Wall s: the whole run (training, "
            "evaluation, timing), mean over seeds."]


def _sources(ok: list[dict], anchors: dict) -> list[str]:
    """The published figures of each dataset in the table, with their papers and settings."""
    lines = []
    for dataset in [d for d in dict.fromkeys(r["dataset"] for r in ok) if d in anchors]:
        entry = anchors[dataset]
        lines += ["", f"Published test F1 on {entry.get('name', dataset)}:"]
        for a in entry["anchors"]:
            if not a.get("encoder"):
                compared = ""
            elif a is _published(anchors, dataset, a["encoder"]):
                compared = f" (in the table beside nerkit's `{a['encoder']}`)"
            else:
                compared = f" (also relevant to nerkit's `{a['encoder']}`)"
            lines.append(f"- {a['model']}: {a['test_f1']:.2f}{compared}; {a.get('paper', '')}; {a.get('setting', '')}"
                         + (f" ({a['note']})" if a.get("note") else ""))
        if entry.get("note"):
            lines.append(f"- {entry['note'].strip()}")
    return lines
