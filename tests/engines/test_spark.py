"""nerkit on PySpark (nerkit/inference/engines/spark.py) against a real Spark started here, `local[2,4]`
(two task threads, a task tried up to 4 times; the JVM from Debian's packages: `make java`): through
`predict_batch_udf`, the entities of several thousand lines are `nerkit predict`'s, with scores; a
Python worker killed in the middle of a task fails the task, which Spark runs again, no line lost or
repeated; a line predict refuses is a row with predict's message, a missing text a row with its error."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("no Java for Spark (make java installs Debian's)", allow_module_level=True)

from engine_helpers import assert_tagged_as_predict, crash_setting, deadline, one_crash  # noqa: E402
from pyspark.ml.functions import predict_batch_udf  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.functions import col, from_json  # noqa: E402

from nerkit.inference.engines.spark import ENTITIES_SCHEMA, RETURN_TYPE, make_predict_fn, read_lines  # noqa: E402
from nerkit.inference.engines.tagging import CRASH_VARIABLE  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::ResourceWarning")]


@pytest.fixture(scope="module")
def spark(crash_marker):
    """Spark in local mode on two threads, its Python workers this interpreter (nerkit importable), a
    failed task tried again up to 3 times; they crash once when a test arms it (the marker). The JVM
    is ended with the module."""
    saved = {key: os.environ.get(key) for key in ("PYSPARK_PYTHON", CRASH_VARIABLE)}
    os.environ.update({"PYSPARK_PYTHON": sys.executable, CRASH_VARIABLE: crash_setting(crash_marker)})
    session = (SparkSession.builder.master("local[2,4]").appName("nerkit-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "1g").getOrCreate())
    session.sparkContext.setLogLevel("OFF")
    try:
        yield session
    finally:
        session.stop()
        gateway = session.sparkContext._gateway
        if gateway is not None:
            gateway.shutdown()
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def tagged(frame, model, **options) -> list[dict]:
    """The rows of `frame` with the UDF's entities (read from their JSON) and error (read_lines' own
    where it had one)."""
    tag = predict_batch_udf(make_predict_fn(str(model), **options), return_type=RETURN_TYPE, batch_size=200)
    with deadline(240):
        rows = frame.withColumn("tagged", tag("text")).collect()
    found = []
    for row in rows:
        values = row.asDict()
        result = values.pop("tagged")
        values["entities"] = None if result.entities is None else json.loads(result.entities)
        values["error"] = values.get("error") or result.error
        found.append(values)
    return found


def test_the_entities_are_predicts_with_scores(spark, corpus, tiny_model_dir):
    directory, _, entities = corpus
    assert_tagged_as_predict(tagged(read_lines(spark, str(directory)), tiny_model_dir, scores=True), entities)


def test_a_python_worker_killed_mid_task_is_retried_and_no_line_is_lost(spark, corpus, tiny_model_dir,
                                                                        crash_marker):
    directory, _, entities = corpus
    with one_crash(crash_marker, "Python worker"):  # the first worker to reach its third batch exits at once
        rows = tagged(read_lines(spark, str(directory)), tiny_model_dir, scores=True)
    assert_tagged_as_predict(rows, entities)


def test_a_line_predict_refuses_is_a_row_with_its_message(spark, refused, tiny_model_dir):
    for path, (field, line, message) in refused.items():
        rows = tagged(read_lines(spark, path, field=field), tiny_model_dir)
        assert [(r["line"], r["error"], r["entities"]) for r in rows if r["error"]] == [(line, message, None)]


def test_a_row_without_text_gets_an_error_and_from_json_reads_the_entities(spark, tiny_model_dir):
    frame = spark.createDataFrame([("张伟在北京工作。",), (None,)], "text string")
    tag = predict_batch_udf(make_predict_fn(str(tiny_model_dir), scores=True), return_type=RETURN_TYPE,
                            batch_size=8)
    with deadline(120):
        rows = frame.withColumn("tagged", tag("text")).select(
            col("tagged.entities").alias("json"), from_json(col("tagged.entities"), ENTITIES_SCHEMA).alias("entities"),
            col("tagged.error").alias("error")).collect()
    assert rows[1].error == "no text to tag: the row holds no value" and rows[1].entities is None
    assert rows[0].error is None and [e.asDict() for e in rows[0].entities] == json.loads(rows[0].json)
