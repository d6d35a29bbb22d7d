"""nerkit on Ray Data (the `ray` extra): `EntityTagger`, the callable class that
`ray.data.Dataset.map_batches` runs in a pool of actors, each loading the model once in its
constructor, as Ray's documentation advises for a PyTorch model; and `read_lines`, a dataset of the
lines of text files, read as `nerkit predict` reads them.

    import ray
    from ray.data import ActorPoolStrategy
    from nerkit.inference.engines.ray import EntityTagger, read_lines

    tagged = read_lines("texts/").map_batches(
        EntityTagger, fn_constructor_kwargs={"model": "runs/msra"}, compute=ActorPoolStrategy(size=2),
        batch_size=512, batch_format="pyarrow")
    tagged.write_parquet("tagged/")

Each output row is the input row with `entities` (a list of {start, end, type, text[, score]}, as
`nerkit predict` writes them, None where the row had an error) and `error` (None, or why the row was
not tagged). An actor that dies is restarted and its batch retried by Ray Data itself.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import ray

from nerkit.inference.engines.tagging import ROW_KEYS, TextTagger, file_rows


def entities_type(scores: bool) -> pa.DataType:
    """The arrow type of the `entities` column: a list of structs, with `score` when scored (written
    out, so that a batch without any entity has the same type as the others)."""
    fields = [("start", pa.int64()), ("end", pa.int64()), ("type", pa.string()), ("text", pa.string())]
    return pa.list_(pa.struct(fields + ([("score", pa.float64())] if scores else [])))


class EntityTagger:
    """`map_batches`' callable class: `column` holds the texts; the other arguments are `TextTagger`'s.
    The model loads in the constructor, once per actor. Takes a batch in any of Ray's formats and
    returns a pyarrow table (the format its list-of-struct column keeps its type in)."""

    def __init__(self, model: str | Path, column: str = "text", **options):
        self.column = column
        self.tagger = TextTagger(model, **options)
        self.tagger.load()
        self.type = entities_type(self.tagger.min_score is not None)

    def __call__(self, batch) -> pa.Table:
        import pandas as pd

        if isinstance(batch, pd.DataFrame):
            table = pa.Table.from_pandas(batch, preserve_index=False)
        elif isinstance(batch, dict):  # numpy arrays, Ray's default batch format
            table = pa.table({name: list(values) for name, values in batch.items()})
        else:
            table = batch
        tagged = self.tagger.tag(table.column(self.column).to_pylist())
        errors = tagged.errors
        if "error" in table.column_names:  # read_lines' rows: a line it could not read keeps its reason
            errors = [before or now for before, now in zip(table.column("error").to_pylist(), errors)]
        return _with(_with(table, "entities", pa.array(tagged.entities, type=self.type)), "error",
                     pa.array(errors, type=pa.string()))


def _with(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    """`table` with the column `name` replaced, or added at the end."""
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, column)
    return table.append_column(name, column)


def _rows(file: dict, field: str | None) -> list[dict]:
    return file_rows(file["bytes"], file["path"], field)


# The cores that reading and splitting a file claims: none of its own (it is little beside tagging its
# lines). With any, a pool of actors that holds every core leaves the reading tasks waiting for ever.
READ_CPUS = 0
# How many reading tasks run at once. A task that claims no core is never held back by the cores, so
# without a bound Ray starts a worker process for each file at the same time, every one importing
# Python and pyarrow on the cores the actors tag on (on 2 cores this cost a third of the tagging
# rate); one reader keeps well ahead of the actors.
READ_CONCURRENCY = 1


def read_lines(paths, field: str | None = None, num_cpus: float = READ_CPUS, concurrency: int = READ_CONCURRENCY,
               **read_options) -> "ray.data.Dataset":
    """The lines of the text files at `paths` (files or directories, as `ray.data.read_binary_files`
    takes them, with its `read_options`) as rows {path, line, text, error} (`tagging.file_rows`;
    `field`: JSON lines), read by `concurrency` tasks at a time. Each file is read whole by one task: a
    collection of many files spreads; one huge file is better cut (`split -n l/N`) or predicted in
    shards (`nerkit predict --shard`)."""
    files = ray.data.read_binary_files(paths, include_paths=True, num_cpus=num_cpus, concurrency=concurrency,
                                       **read_options)
    return files.flat_map(_rows, fn_kwargs={"field": field}, num_cpus=num_cpus, concurrency=concurrency)
