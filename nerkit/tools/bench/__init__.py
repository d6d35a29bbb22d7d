"""Batch benchmarking (`nerkit bench`): train every run of a matrix file and collect accuracy, speed
and memory into DIR/results.jsonl and a Markdown table beside the published figures.

`matrix.py` reads the matrix file, `runner.py` runs it (each run in a `worker.py` process, `rounds:`
times) and `report.py` writes the table. `speed.py` (`nerkit bench predict`, `export`) and
`serve_load.py` (`nerkit bench serve`) time whole commands over several rounds. `loop.py` (`nerkit
bench loop`) simulates the annotation loop, `grow.py` (`nerkit bench grow`) adds entity types to a
model step by step, and `label_studio.py` (`nerkit bench label-studio`) times Label Studio's training
loop against a real Label Studio.
"""

from nerkit.tools.bench.matrix import (
           Matrix,
           MatrixRun,
           load_anchors,
           load_matrix,
           parse_seeds,
           select_runs,
)
from nerkit.tools.bench.report import render_markdown
from nerkit.tools.bench.runner import (
           failure_message,
           host_info,
           read_results,
           run_bench,
           worker_env,
           write_results,
)

__all__ = ["Matrix", "MatrixRun", "failure_message", "host_info", "load_anchors", "load_matrix", "parse_seeds",
           "read_results", "render_markdown", "run_bench", "select_runs", "worker_env", "write_results"]
