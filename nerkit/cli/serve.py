"""`nerkit serve`: a trained model as a web service (FastAPI on uvicorn, the `serve` extra).

The command parses its options and calls `nerkit.inference.server.run_server`; the API, the limits
and micro-batching are described in docs/serving.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nerkit.cli.options import DEVICE, RUNTIME, WINDOW, Device, Runtime, flag
from nerkit.errors import UserError


def serve(
    model: Path = typer.Option(..., "--model", "-m", help="Model directory."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every network "
                             "interface; the API has no authentication)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: a free one, "
                             "which the log shows)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Server processes, each holding a copy of the "
                                "model and its own queue; the connections are spread over them (1 = this process)."),
    device: Device = DEVICE,
    runtime: Runtime = RUNTIME,
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads in all, shared out among the "
                                "workers (0 = the cores free when nerkit starts; with --workers, one per core)."),
    window: Optional[int] = WINDOW,
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Sentences per model batch "
                                             "(default: 4 for a model with a language model, else 64)."),
    max_batch_chars: int = typer.Option(8192, "--max-batch-chars", min=0, help="Micro-batching: requests "
                                        "that wait together are predicted as one batch of up to N characters "
                                        "(a larger request is a batch of its own; 0 = each request alone)."),
    max_wait_ms: float = typer.Option(0.0, "--max-wait-ms", min=0, help="Micro-batching: how long the first "
                                      "request of a batch waits for others, in milliseconds (0: requests that "
                                      "come while the model is busy make the next batch, and no request waits "
                                      "for company)."),
    max_queue: int = typer.Option(64, "--max-queue", min=1, help="Requests that may wait for the model (in "
                                  "each worker); one more is refused with 503 and Retry-After."),
    max_body: int = typer.Option(1 << 20, "--max-body", min=1, help="Largest request body, in bytes (a "
                                 "larger one is refused with 413)."),
    access_log: bool = flag("--access-log", help="Log one line per request on stderr."),
    scores: bool = flag("--scores", help="Give each entity its score: the "
                                         "probability the model gives exactly that span with exactly that type "
                                         "(always with --label-studio)."),
    min_score: Optional[float] = typer.Option(None, "--min-score", min=0.0, max=1.0, help="Leave out the "
                                              "entities scored below this (implies --scores)."),
    label_studio: bool = flag("--label-studio", help="Serve as a Label Studio ML backend (/setup, /predict "
                                                     "with Label Studio's tasks, /webhook): connect a project to "
                                                     "this URL to pre-annotate its tasks with scores."),
    models: Optional[Path] = typer.Option(None, "--models", help="With --label-studio: train from the project's "
                                          "annotations in the background and keep the model versions here "
                                          "(MODELS/v3-TIMESTAMP; MODELS/served.json names the one served, also after "
                                          "a restart). docs/label-studio-loop.md."),
    label_studio_url: str = typer.Option("", "--label-studio-url", envvar="LABEL_STUDIO_URL", help="With "
                                         "--models: where this machine reaches Label Studio's API."),
    label_studio_api_key: str = typer.Option("", "--label-studio-api-key", envvar="LABEL_STUDIO_API_KEY",
                                             show_default=False, help="With --models: a Label Studio API token "
                                             "(Account & Settings > Legacy Token)."),
    train_config: Optional[Path] = typer.Option(None, "--train-config", help="With --models: the training config "
                                                "of each job (its train: section and data options; default: the "
                                                "served model's own config.yaml)."),
    train_every: int = typer.Option(10, "--train-every", min=0, help="With --models: start a job after this many "
                                    "annotations created or updated (0: only Label Studio's Start training button, "
                                    "or its own auto-training)."),
    keep: int = typer.Option(5, "--keep", min=1, help="With --models: model versions kept on disk (the served one "
                             "always, beyond them)."),
    holdout: float = typer.Option(0.2, "--holdout", min=0.01, max=0.9, help="With --models: the share of completely "
                                  "annotated tasks held out from training, to score each version on (chosen by task "
                                  "id, seeded: the same tasks every job)."),
    train_set: List[str] = typer.Option([], "--train-set", help="With --models: override a key of the training "
                                        "config: --train-set train.epochs=5 (repeatable)."),
):
    """Serve a model over HTTP: POST /predict, GET /health, GET /info, the API's docs at /docs.
    SIGTERM or Ctrl-C stops it taking connections, answers every request in flight and exits 0."""
    from nerkit.inference.loading import require_runtime

    require_runtime(model, runtime)
    try:
        from nerkit.inference.server import ServeOptions, run_server
    except ModuleNotFoundError as e:
        if e.name not in ("fastapi", "starlette", "pydantic", "uvicorn"):
            raise
        raise UserError(f"nerkit serve needs {e.name}, which is not installed",
                        fix="pip install 'nerkit[serve]'") from None

    trainer = None
    if models is not None:
        if not label_studio:
            raise UserError("--models trains from Label Studio's annotations", fix="add --label-studio")
        from nerkit.tools.loop.backend import LoopOptions, Trainer

        trainer = Trainer.for_model(model, LoopOptions(models, label_studio_url, label_studio_api_key, train_config,
                                                       train_every, keep, holdout, overrides=tuple(train_set)))
    run_server(model, host, port, workers, threads, access_log=access_log, trainer=trainer, options=ServeOptions(
        device=device, window=window, batch_size=batch_size, max_batch_chars=max_batch_chars,
        max_wait_ms=max_wait_ms, max_queue=max_queue, max_body=max_body,
        min_score=min_score if min_score is not None else 0.0 if scores or label_studio else None,
        label_studio=label_studio))
