"""nerkit on PySpark (the `spark` extra): `make_predict_fn(MODEL)` is what
`pyspark.ml.functions.predict_batch_udf` takes, the model loaded once per Python worker; and
`read_lines`, a DataFrame of the lines of text files, read as `nerkit predict` reads them.

    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.functions import col, from_json
    from nerkit.inference.engines.spark import ENTITIES_SCHEMA, RETURN_TYPE, make_predict_fn, read_lines

    tag = predict_batch_udf(make_predict_fn("runs/msra"), return_type=RETURN_TYPE, batch_size=512)
    tagged = read_lines(spark, "texts/").withColumn("tagged", tag("text"))
    tagged.select("path", "line", from_json(col("tagged.entities"), ENTITIES_SCHEMA).alias("entities"),
                  col("tagged.error")).write.parquet("tagged/")

`predict_batch_udf` returns scalars and arrays of scalars only, so each row's entities come as the
JSON `nerkit predict --format jsonl` writes for them (`from_json` with ENTITIES_SCHEMA makes them an
array of structs), beside `error`. A task whose Python worker dies is retried by Spark
(spark.task.maxFailures; `local[N,F]` in local mode, where the default is no retry).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
from pyspark.sql.types import LongType, StringType, StructField, StructType

from nerkit.inference.engines.tagging import TextTagger, file_rows

# What the UDF returns for each row.
RETURN_TYPE = StructType([StructField("entities", StringType()), StructField("error", StringType())])

# The schema of the entities' JSON, for `from_json` (score is null where entities are not scored).
ENTITIES_SCHEMA = "array<struct<start:int,end:int,type:string,text:string,score:double>>"

# read_lines' rows.
LINES_SCHEMA = StructType([StructField("path", StringType()), StructField("line", LongType()),
                           StructField("text", StringType()), StructField("error", StringType())])


def make_predict_fn(model: str | Path, **options) -> Callable[[], Callable[[np.ndarray], dict]]:
    """`predict_batch_udf`'s make_predict_fn for the model directory `model` (`TextTagger`'s
    options): Spark calls it once per Python worker, and the function it returns tags a batch of
    texts into {"entities": JSON text, "error": None or why} per row."""
    tagger = TextTagger(model, **options)  # checks the options here, on the driver

    def make() -> Callable[[np.ndarray], dict]:
        tagger.load()

        def predict(texts: np.ndarray) -> dict:
            tagged = tagger.tag(texts.tolist())
            entities = [None if found is None else json.dumps(found, ensure_ascii=False) for found in tagged.entities]
            return {"entities": np.array(entities, dtype=object), "error": np.array(tagged.errors, dtype=object)}

        return predict

    return make


def read_lines(spark, paths, field: str | None = None, partitions: int | None = None):
    """The lines of the text files at `paths` (a path, a directory or a glob, or a list of them, as
    Spark's `binaryFile` source takes them) as a DataFrame (path, line, text, error)
    (`tagging.file_rows`; `field`: JSON lines). Spark's `text` source would replace bytes that are
    not UTF-8 without a word; here such a line is a row with its error. Each file is read whole by
    one task (at most 2 GiB: cut a larger one, or predict it in shards, `nerkit predict --shard`).
    Spark packs small files into one partition (up to 128 MiB): when that makes fewer partitions
    than `partitions` (default: Spark's default parallelism, its cores in local mode), the files are
    spread over that many, so that every core tags."""
    files = spark.read.format("binaryFile").load(paths).select("path", "content")
    wanted = partitions or spark.sparkContext.defaultParallelism
    if files.rdd.getNumPartitions() < wanted:
        files = files.repartition(wanted)
    rows = files.rdd.flatMap(lambda file: [tuple(row.values()) for row in
                                           file_rows(bytes(file.content), _local(file.path), field)])
    return spark.createDataFrame(rows, LINES_SCHEMA)


def _local(path: str) -> str:
    """A local file's path as its user wrote it, not the URL Spark gives it (file:/...): the rows
    and their errors name the file as `nerkit predict` would."""
    if not path.startswith("file:"):
        return path
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(path).path)
