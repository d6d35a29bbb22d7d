"""One timed run of a cluster engine tagging a directory of text files (`python -m
nerkit.tools.bench.engine_run SPEC`, started by `nerkit bench predict --engine`): the engine started on
this machine with `workers` worker processes as its documentation and nerkit's docs/scale.md set it up,
made ready (the model loaded where the engine keeps it), then the whole directory tagged through
nerkit's adapter (nerkit.inference.engines) and every row brought back to this process. It prints one
JSON line: the seconds to start and to tag, the rows and the rows in error, and the peak memory of the
largest worker process and of all the engine's processes together (sampled from /proc as it runs)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from nerkit.ending import end_process

ENGINES = ("ray", "spark", "dask")

# Rows a call of the model gets from the engine (Ray's and Spark's batch size; Dask tags a file's
# partition at once): enough for nerkit's own batches of 64 to fill.
ENGINE_BATCH = 512

_SAMPLE_SECONDS = 0.2


def _descendants(root: int) -> list[int]:
    """Every process under `root`, from /proc (Ray's and Spark's daemons included)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            parent = int(stat[stat.rindex(b")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _memory(pid: int) -> tuple[int, int, bool]:
    """(VmHWM, VmRSS) of `pid` in KiB, and whether it runs Python (a worker, not a JVM or a daemon)."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmHWM:", "VmRSS:")):
                    values[line.split(":")[0]] = int(line.split()[1])
        python = os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return 0, 0, False
    return values.get("VmHWM", 0), values.get("VmRSS", 0), python


class MemorySampler:
    """Samples this process's descendants while it runs: the highest peak of one Python process
    (a worker) and the highest sum of the resident memory of every process (this one included)."""

    def __init__(self):
        self.worker_kib = self.total_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_SECONDS):
            self.sample()

    def sample(self) -> None:
        me = os.getpid()
        total = _memory(me)[1]
        for pid in _descendants(me):
            peak, resident, python = _memory(pid)
            total += resident
            if python:
                self.worker_kib = max(self.worker_kib, peak)
        self.total_kib = max(self.total_kib, total)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------------------------------- engines

@contextmanager
def ray_engine(spec: dict) -> Iterator:
    import ray
    from ray.data import ActorPoolStrategy

    from nerkit.inference.engines.ray import EntityTagger, read_lines

    ray.init(num_cpus=spec["workers"], include_dashboard=False, log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    options = {"model": spec["model"], "threads": spec["threads"], "batch_size": spec["batch_size"]}

    def tag(source) -> Iterator:
        dataset = source if isinstance(source, ray.data.Dataset) else read_lines(source)
        tagged = dataset.map_batches(EntityTagger, fn_constructor_kwargs=options,
                                     compute=ActorPoolStrategy(size=spec["workers"]), batch_size=ENGINE_BATCH,
                                     batch_format="pyarrow")
        for batch in tagged.iter_batches(batch_size=None, batch_format="pyarrow"):
            yield from batch.column("error").to_pylist()

    try:
        # Ray Data starts its actors with each dataset: this loads the worker processes' imports
        # (and warms the disk cache); the timed run loads the model in its own actors again
        # (blocks made here: a task that claims a core would wait for ever behind actors that hold them all)
        list(tag(ray.data.from_items([{"text": "北京"}] * spec["workers"], override_num_blocks=spec["workers"])))
        yield lambda: tag(spec["texts"])
    finally:
        ray.shutdown()


@contextmanager
def spark_engine(spec: dict) -> Iterator:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers import nerkit from this environment
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import SparkSession

    from nerkit.inference.engines.spark import RETURN_TYPE, make_predict_fn, read_lines

    spark = (SparkSession.builder.master(f"local[{spec['workers']}]").appName("nerkit-bench")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    udf = predict_batch_udf(make_predict_fn(spec["model"], threads=spec["threads"], batch_size=spec["batch_size"]),
                            return_type=RETURN_TYPE, batch_size=ENGINE_BATCH)

    def tag(frame) -> Iterator:
        for row in frame.withColumn("tagged", udf("text")).select("tagged").collect():
            yield row.tagged.error

    try:
        # the Python workers (reused from task to task) start and load the model, once each
        warm = spark.createDataFrame([("北京",)] * spec["workers"], "text string").repartition(spec["workers"])
        list(tag(warm))
        yield lambda: tag(read_lines(spark, spec["texts"]))
    finally:
        spark.stop()


@contextmanager
def dask_engine(spec: dict) -> Iterator:
    from distributed import Client, LocalCluster

    import dask

    from nerkit.inference.engines.dask import WORKER_ENVIRON, load_model, read_lines, tag_partition, tagged_meta, \
        worker_environ

    with dask.config.set({WORKER_ENVIRON: worker_environ()}):
        cluster = LocalCluster(n_workers=spec["workers"], threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=40)
    client = Client(cluster)

    def tag() -> Iterator:
        lines = read_lines(str(Path(spec["texts"]) / "*"))
        frame = lines.map_partitions(tag_partition, spec["model"], meta=tagged_meta(lines), threads=spec["threads"],
                                     batch_size=spec["batch_size"]).compute()
        return iter(frame["error"].tolist())

    try:
        client.run(load_model, spec["model"], threads=spec["threads"], batch_size=spec["batch_size"])
        yield tag
    finally:
        client.close()
        cluster.close()


STARTERS = {"ray": ray_engine, "spark": spark_engine, "dask": dask_engine}


def run(spec: dict) -> dict:
    """Start the engine, make it ready, tag `spec["texts"]` (a directory): the figures."""
    started = time.perf_counter()
    with MemorySampler() as memory, STARTERS[spec["engine"]](spec) as tag:
        ready = time.perf_counter()
        errors = list(tag())
        done = time.perf_counter()
    return {"startup_s": ready - started, "tag_s": done - ready, "rows": len(errors),
            "errors": sum(error is not None for error in errors), "worker_rss_mib": memory.worker_kib / 1024,
            "total_rss_mib": memory.total_kib / 1024}


def main(argv: list[str]) -> int:
    figures = run(json.loads(argv[0]))
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":  # the engines are shut down by then; no interpreter teardown (nerkit.ending)
    end_process(main(sys.argv[1:]))
