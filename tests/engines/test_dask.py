"""nerkit on Dask (nerkit/inference/engines/dask.py) against a real `LocalCluster` started here (two
worker processes under their nannies, one thread each): `map_partitions` gives several thousand lines
the entities `nerkit predict` gives them, in order, with scores, the model loaded once per worker; a
worker killed in the middle of the run is restarted and its tasks run again, no line lost or repeated;
a line predict refuses is a row with predict's message; a Bag of texts is tagged as well, and so are
the texts by an int8 export; `nerkit bench predict --engine dask` times a run."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("dask.dataframe")
pytest.importorskip("distributed")

import dask  # noqa: E402
import dask.bag as db  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402
from engine_helpers import assert_tagged_as_predict, crash_setting, deadline, one_crash  # noqa: E402

from nerkit.inference.engines.dask import (  # noqa: E402
    SLOW_MALLOC,
    WORKER_ENVIRON,
    load_model,
    read_lines,
    tag_partition,
    tag_texts,
    tagged_meta,
    worker_environ,
)
from nerkit.inference.engines.tagging import CRASH_VARIABLE, loaded_models  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


@pytest.fixture(scope="module")
def client(crash_marker):
    """Two worker processes, one thread each, that crash once when a test arms it (the marker); the
    cluster is closed with the module."""
    saved = os.environ.get(CRASH_VARIABLE)
    os.environ[CRASH_VARIABLE] = crash_setting(crash_marker)  # the workers' environment is this one's
    with dask.config.set({WORKER_ENVIRON: worker_environ()}):  # as docs/scale.md starts one
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=50)
    try:
        with Client(cluster) as connected:
            yield connected
    finally:
        cluster.close()
        os.environ.pop(CRASH_VARIABLE) if saved is None else os.environ.__setitem__(CRASH_VARIABLE, saved)


def tagged(lines, model, **options) -> list[dict]:
    with deadline(240):
        frame = lines.map_partitions(tag_partition, str(model), meta=tagged_meta(lines), **options).compute()
    return frame.to_dict("records")


def test_the_entities_are_predicts_in_order_once_loaded_per_worker(client, corpus, tiny_model_dir):
    directory, _, entities = corpus
    rows = tagged(read_lines(str(directory / "*.txt")), tiny_model_dir, scores=True)
    assert_tagged_as_predict(rows, entities)
    assert [(r["path"], r["line"]) for r in rows] == sorted((r["path"], r["line"]) for r in rows)
    assert set(client.run(loaded_models).values()) <= {0, 1}  # a worker loads the model once at most


def test_the_workers_start_without_dasks_malloc_trim_threshold(client):
    """Dask's own default sets it (and so slows torch's allocations); `worker_environ` leaves the
    rest of Dask's environment as it is."""
    assert SLOW_MALLOC in dask.config.get(WORKER_ENVIRON)
    assert set(client.run(os.environ.get, SLOW_MALLOC).values()) == {None}
    assert set(client.run(os.environ.get, "OMP_NUM_THREADS").values()) == {"1"}


def test_a_worker_killed_mid_run_is_restarted_and_no_line_is_lost(client, corpus, tiny_model_dir, crash_marker):
    directory, _, entities = corpus
    with one_crash(crash_marker, "worker"):  # the first worker to reach its third partition exits at once
        rows = tagged(read_lines(str(directory / "*.txt")).repartition(npartitions=8), tiny_model_dir, scores=True)
    assert_tagged_as_predict(rows, entities)


def test_a_line_predict_refuses_is_a_row_with_its_message(client, refused, tiny_model_dir):
    for path, (field, line, message) in refused.items():
        rows = tagged(read_lines([path], field=field), tiny_model_dir)
        assert [(r["line"], r["error"], r["entities"]) for r in rows if r["error"]] == [(line, message, None)]


def test_a_bag_of_texts_is_tagged_as_predict_tags_it(client, corpus, tiny_model_dir):
    _, whole, entities = corpus
    texts = whole.read_text(encoding="utf-8").splitlines()
    with deadline(240):
        records = db.from_sequence(texts + [None], npartitions=4).map_partitions(
            tag_texts, str(tiny_model_dir), scores=True).compute()
    assert [r["entities"] for r in records[:-1]] == entities
    assert records[-1] == {"text": None, "entities": None, "error": "no text to tag: the row holds no value"}


def test_an_int8_export_finds_the_entities_its_predict_finds(client, corpus, tiny_model_dir, tmp_path, nerkit):
    """The ONNX export, quantised to int8, runs in the workers and finds the entities `nerkit predict`
    finds with it on nearly every line, with scores within 0.05. Not on every line: dynamic
    quantisation scales each batch's activations by that batch's own range, so a score (and at a
    near-tie a tag) depends on which texts share a batch, and an engine's batches are not predict's
    chunks (shards are: the shards' tests hold an int8 export's equal byte for byte)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import json

    from nerkit.tools.onnx.export import export_model

    directory, whole, _ = corpus
    export_model(tiny_model_dir, tmp_path / "int8", quantize="int8")
    predicted = nerkit("predict", "--model", tmp_path / "int8", whole, "--scores", "--threads", "1").stdout
    expected = [json.loads(line)["entities"] for line in predicted.splitlines()]
    assert set(client.run(load_model, str(tmp_path / "int8"), threads=1).values()) == {None}
    rows = tagged(read_lines(str(directory / "*.txt")), tmp_path / "int8", scores=True)
    rows.sort(key=lambda r: (r["path"], r["line"]))
    assert len(rows) == len(expected) and all(r["error"] is None for r in rows)
    spans = [([(e["start"], e["end"], e["type"]) for e in row["entities"]], [(e["start"], e["end"], e["type"])
                                                                             for e in wanted])
             for row, wanted in zip(rows, expected)]
    assert sum(a == b for a, b in spans) >= 0.98 * len(rows)
    assert all(abs(e["score"] - w["score"]) < 0.05 for row, wanted, (a, b) in zip(rows, expected, spans) if a == b
               for e, w in zip(row["entities"], wanted))


def test_nerkit_bench_predict_times_an_engine(corpus, tiny_model_dir, tmp_path):
    """`nerkit bench predict --engine dask`, a whole process of its own (its own cluster): every line
    comes back, and the record holds the start-up, the rates and the memory of the workers."""
    import json

    from helpers import run_nerkit

    _, whole, _ = corpus
    done = run_nerkit("bench", "predict", "--model", tiny_model_dir, "--text", whole, "--engine", "dask",
                      "--workers", "2", "--rounds", "1", "--out", tmp_path / "bench", timeout=300,
                      env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "bench" / "results.jsonl").read_text().splitlines()]
    assert record["engine"] == "dask" and record["lines"] == 4000 and record["files"] == 8
    (figures,) = record["rounds"]
    assert figures["startup_s"] < figures["seconds"] and figures["steady_chars_per_s"] > figures["chars_per_s"] > 0
    assert 100 < figures["worker_rss_mib"] < figures["total_rss_mib"]
