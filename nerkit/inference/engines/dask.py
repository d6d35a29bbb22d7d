"""nerkit on Dask (the `dask` extra): `tag_partition`, the function for `map_partitions` of a Dask
DataFrame (`tag_texts` for a Bag of texts), the model loaded once per worker process; and
`read_lines`, a DataFrame of the lines of text files, read as `nerkit predict` reads them.

    import dask
    from dask.distributed import Client, LocalCluster
    from nerkit.inference.engines.dask import WORKER_ENVIRON, read_lines, tag_partition, tagged_meta, worker_environ

    with dask.config.set({WORKER_ENVIRON: worker_environ()}):
        client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    lines = read_lines("texts/*.txt")
    tagged = lines.map_partitions(tag_partition, "runs/msra", meta=tagged_meta(lines))
    tagged.to_parquet("tagged/")

Each row gains `entities` (a list of {start, end, type, text[, score]}, as `nerkit predict` writes
them, None where the row had an error) and `error`. A worker that dies is restarted by its nanny and
its tasks are run again elsewhere by the scheduler. The workers are best started without the
`MALLOC_TRIM_THRESHOLD_` that Dask's nannies set by default (`worker_environ`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import dask
import dask.dataframe as dd
import pandas as pd

from nerkit.inference.engines.tagging import ROW_KEYS, TextTagger, file_rows


# The Dask setting that holds the environment of each worker process as it starts.
WORKER_ENVIRON = "distributed.nanny.pre-spawn-environ"
# What Dask sets there to make glibc give freed memory back sooner; setting it also turns off glibc's
# growing threshold for serving large blocks from mmap, so every batch's tensors are mapped and
# unmapped again: a BiLSTM worker then spent a third more time tagging (2.5 s of system time on
# 7 s of work, against 0.6 without it).
SLOW_MALLOC = "MALLOC_TRIM_THRESHOLD_"


def worker_environ() -> dict:
    """Dask's environment for new worker processes, less `SLOW_MALLOC`: the value for
    `dask.config.set({WORKER_ENVIRON: worker_environ()})` around starting a cluster."""
    environ = dict(dask.config.get(WORKER_ENVIRON, default={}))
    environ.pop(SLOW_MALLOC, None)
    return environ


def tag_partition(frame: pd.DataFrame, model: str | Path, column: str = "text", **options) -> pd.DataFrame:
    """`frame` with `entities` and `error` columns for its `column` of texts (`TextTagger`'s options);
    an `error` already there (read_lines') keeps its reason where it has one."""
    tagged = TextTagger(model, **options).tag(frame[column].tolist())  # the model: loaded once per process
    out = frame.copy()
    out["entities"] = pd.Series(tagged.entities, index=frame.index, dtype=object)
    errors = tagged.errors
    if "error" in frame.columns:
        errors = [before if isinstance(before, str) else now for before, now in zip(frame["error"].tolist(), errors)]
    out["error"] = pd.Series(errors, index=frame.index, dtype=object)
    return out


def load_model(model: str | Path, **options) -> None:
    """Load the model in this worker now (`client.run(load_model, "runs/msra")` loads it in every
    worker, so the first partitions do not pay for it). Returns nothing: what `client.run` returns is
    sent back to the client, and a loaded model (an ONNX session above all) cannot be."""
    TextTagger(model, **options).load()


def tagged_meta(frame: dd.DataFrame) -> pd.DataFrame:
    """What `tag_partition` returns for `frame`, as `map_partitions(meta=...)` wants it (else Dask
    would run the function on made-up rows to find out, loading the model on the client)."""
    meta = frame._meta.copy()
    meta["entities"] = pd.Series(dtype=object)
    meta["error"] = pd.Series(dtype=object)
    return meta


def tag_texts(texts: Iterable, model: str | Path, **options) -> list[dict]:
    """`map_partitions` of a Bag of texts: a record {"text", "entities", "error"} for each."""
    texts = list(texts)
    tagged = TextTagger(model, **options).tag(texts)
    return [{"text": t, "entities": e, "error": r} for t, e, r in zip(texts, tagged.entities, tagged.errors)]


def _file_frame(path: str, field: str | None) -> pd.DataFrame:
    with open(path, "rb") as f:
        rows = file_rows(f.read(), path, field)
    return _frame(rows)


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame({"path": pd.Series([r["path"] for r in rows], dtype=object),
                         "line": pd.Series([r["line"] for r in rows], dtype="int64"),
                         "text": pd.Series([r["text"] for r in rows], dtype=object),
                         "error": pd.Series([r["error"] for r in rows], dtype=object)}, columns=list(ROW_KEYS))


def read_lines(paths, field: str | None = None) -> dd.DataFrame:
    """The lines of the text files at `paths` (a glob or a list of paths) as a DataFrame (path, line,
    text, error) with a partition per file (`tagging.file_rows`; `field`: JSON lines): a line that
    `nerkit predict` would refuse is a row with predict's error for it."""
    import glob

    files = sorted(glob.glob(paths)) if isinstance(paths, str) else [str(p) for p in paths]
    return dd.from_map(_file_frame, files, field=field, meta=_frame([]), enforce_metadata=False)
