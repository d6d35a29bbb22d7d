"""`nerkit serve`: a trained model as a web service, an ASGI app (FastAPI) run by uvicorn.

`create_app(model_dir, options)` builds the app. `POST /predict` answers each text with the record
that `nerkit predict --format jsonl` writes (`formats.predict_records`: the same windows and
stitching). Concurrent requests are gathered into batches for one model thread (`batcher.Batcher`),
so the event loop never waits on the model. `GET /health`, `GET /info`, and FastAPI's `/docs` and
`/openapi.json` are there too. A request is checked before it costs any model work: its size (413),
its UTF-8 (400), its JSON and types (422), room in the queue (503 with Retry-After). `run_server`
serves in this process or in `--workers` uvicorn processes that each load the model. SIGTERM stops
it accepting, every request in flight is answered, and it exits 0; a kept-alive connection loses no
request on the way (`draining`). docs/serving.md has the API.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import errno
import json
import logging
import os
import signal
import socket
import sys
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect

from nerkit.config import config_to_dict
from nerkit.data.stats import sha256_file
from nerkit.errors import UserError, did_you_mean
from nerkit.inference.batcher import Batcher, QueueFull
from nerkit.inference.formats import model_version, predict_records
from nerkit.inference.loading import load_pipeline
from nerkit.inference.model_dir import score_map_json
from nerkit.pretrained.licences import model_terms
from nerkit.version import __version__

log = logging.getLogger(__name__)

# The settings of the `--workers` processes, which uvicorn starts afresh (spawned): they build their
# app from this variable (`app_from_environment`).
ENVIRONMENT = "NERKIT_SERVE"

# uvicorn's exit code for a worker that failed before it served: its supervisor then stops instead
# of starting the worker again and again.
STARTUP_FAILURE = 3

# Seconds a client told "full" (503) is asked to wait before trying again.
RETRY_AFTER = 1

USAGE = 'send {"texts": ["...", ...]} or {"text": "..."}'

# Sentences per model batch when --batch-size is not given. A language model's batch is bound by its
# arithmetic, and a micro-batch of texts of mixed lengths, padded to its longest, holds several times
# their characters: in model batches of 4 texts of like lengths the m3e-small + CRF server answered 1.2
# to 2 times as many requests (docs/serving.md). The BiLSTMs gain from large batches.
LM_BATCH_SIZE, BATCH_SIZE = 4, 64


def default_batch_size(config) -> int:
    """The model batch a server uses for `config`'s model unless told otherwise."""
    return LM_BATCH_SIZE if config.embeddings.lm_sources() else BATCH_SIZE


@dataclass
class ServeOptions:
    """How one server process predicts and what it accepts (the `nerkit serve` options)."""

    device: str = "cpu"
    threads: int = 0  # torch threads of this process (0: nerkit's default, `device.set_threads`)
    window: int | None = None  # the prediction window (None: the model's)
    batch_size: int | None = None  # sentences per model batch (None: `default_batch_size`)
    max_batch_chars: int = 8192  # micro-batching: characters gathered into one batch (0: each request alone)
    max_wait_ms: float = 0.0  # micro-batching: how long a batch's first request waits for others
    max_queue: int = 64  # requests waiting for the model before the next is refused (503)
    max_body: int = 1 << 20  # bytes of a request body (more: 413)
    min_score: float | None = None  # entities scored, those below this left out (None: no scores)
    label_studio: bool = False  # speak Label Studio's ML backend protocol (nerkit.inference.label_studio)


# ------------------------------------------------------------------------------ the API's shapes (for /docs)

def _one_key(title: str, key: str, schema: dict, description: str) -> dict:
    """A closed object that holds `key` and nothing else: one shape of a /predict body."""
    return {"title": title, "type": "object", "required": [key], "additionalProperties": False,
            "properties": {key: {**schema, "description": description}}}


# The body of POST /predict, exactly what `parse_texts` accepts: one of the two keys, nothing else (a
# client generated from the schema sends nothing the server refuses; tests/test_serve.py holds them
# together with schemathesis).
PREDICT_BODY = {"description": "Exactly one of `texts` and `text`.", "oneOf": [
    _one_key("Texts", "texts", {"type": "array", "items": {"type": "string"}},
             "The texts to tag; the answer is `{\"records\": [...]}`, one record per text, in order."),
    _one_key("Text", "text", {"type": "string"}, "One text to tag; the answer is its record."),
]}


SCORE_MEANING = ("The probability the model gives this exact entity (span and type): under a CRF head from its "
                 "forward-backward pass over every valid tag sequence, at the temperature `nerkit calibrate` "
                 "fitted (1 if none); under a span head the sigmoid of the span's score (mapped by the scale and "
                 "shift `nerkit calibrate` fitted, if any), every span above the model's threshold being an "
                 "entity; given when the server runs with --scores (or --min-score, "
                 "--label-studio).")


class Entity(BaseModel):
    start: int = Field(description="Offset of the entity's first character in the text.")
    end: int = Field(description="Offset after its last character (end exclusive).")
    type: str
    text: str = Field(description="The characters it covers: text[start:end].")
    score: float | None = Field(None, ge=0, le=1, description=SCORE_MEANING)


class Record(BaseModel):
    """One text and its entities: a line of `nerkit predict --format jsonl`."""

    text: str
    entities: list[Entity]


class Records(BaseModel):
    records: list[Record]


class Problem(BaseModel):
    detail: str = Field(description="What is wrong, in one line.")


_EXAMPLES = {
    "texts": {"summary": "several texts", "value": {"texts": ["张三在北京大学读书。", "新华社记者在上海报道。"]}},
    "text": {"summary": "one text", "value": {"text": "张三在北京大学读书。"}},
}

_PREDICT_DOC = {
    "requestBody": {"required": True, "content": {"application/json": {
        "schema": PREDICT_BODY, "examples": _EXAMPLES}}},
}

_ERRORS = {
    400: {"model": Problem, "description": "The body is not UTF-8, or a text holds a lone surrogate escape."},
    413: {"model": Problem, "description": "The body is larger than the server's limit (`--max-body`)."},
    422: {"model": Problem, "description": "The body is not JSON, or not `{\"texts\": [strings]}` / `{\"text\": string}`."},
    503: {"model": Problem, "description": "The queue is full (`--max-queue`): try again after `Retry-After` seconds."},
}


# ------------------------------------------------------------------------------ reading a request

def _json_type(value) -> str:
    for kind, name in ((dict, "object"), (list, "array"), (str, "string"), (bool, "boolean"),
                       (int, "number"), (float, "number")):
        if isinstance(value, kind):
            return name
    return "null"


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused with 413 once it is over `limit` bytes: at once when its
    Content-Length says so (the body is never read), else as soon as the bytes read pass it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"the body is {int(declared)} bytes, over this server's limit of {limit} "
                                 "(--max-body); send fewer texts per request")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HTTPException(413, f"the body is over this server's limit of {limit} bytes (--max-body); "
                                         "send fewer texts per request")
    except ClientDisconnect:  # nobody is left to answer
        raise HTTPException(400, "the client disconnected before sending the whole body") from None
    return bytes(body)


def parse_texts(body: bytes) -> tuple[list[str], bool]:
    """The texts of a /predict body, and whether it was the one-`text` form. Anything else is an
    HTTPException with a one-line reason: 400 for bytes that are not UTF-8 or a string that is not
    Unicode text (a lone surrogate escape), 422 for a body that is not JSON or not of the shape."""
    body = body.removeprefix(codecs.BOM_UTF8)
    try:
        decoded = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HTTPException(400, f"the body is not UTF-8: byte {e.start} is {body[e.start]:#04x}; "
                                 "send JSON encoded as UTF-8") from None
    try:
        payload = json.loads(decoded)
    except json.JSONDecodeError as e:
        raise HTTPException(422, f"the body is not JSON: {e.msg} at line {e.lineno} column {e.colno}; {USAGE}") from None
    except RecursionError:
        raise HTTPException(422, f"the body is JSON nested too deeply; {USAGE}") from None
    if not isinstance(payload, dict):
        raise HTTPException(422, f"the body is a JSON {_json_type(payload)}, not an object; {USAGE}")
    for key in payload:
        if key not in ("texts", "text"):
            hint = did_you_mean(key, ("texts", "text"))
            raise HTTPException(422, f"unknown key {json.dumps(key, ensure_ascii=False)}"
                                     f"{f' ({hint})' if hint else ''}; {USAGE}")
    if len(payload) != 1:
        both = 'both "texts" and "text"' if payload else 'neither "texts" nor "text"'
        raise HTTPException(422, f"the body has {both}; {USAGE}")
    single = "text" in payload
    if single:
        texts, names = [payload["text"]], ["text"]
        if not isinstance(texts[0], str):
            raise HTTPException(422, f"\"text\" is a JSON {_json_type(texts[0])}, not a string; {USAGE}")
    else:
        texts = payload["texts"]
        if not isinstance(texts, list):
            raise HTTPException(422, f"\"texts\" is a JSON {_json_type(texts)}, not an array of strings; {USAGE}")
        names = [f"texts[{i}]" for i in range(len(texts))]
        for name, text in zip(names, texts):
            if not isinstance(text, str):
                raise HTTPException(422, f"{name} is a JSON {_json_type(text)}, not a string; {USAGE}")
    for name, text in zip(names, texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON's \ud800 escapes allow what UTF-8 cannot hold
            raise HTTPException(400, f"{name} holds a lone surrogate (\\u{ord(text[e.start]):04x}) at character "
                                     f"{e.start}, which is not Unicode text") from None
    return texts, single


# ------------------------------------------------------------------------------ the app

def add_predict(app: FastAPI, batcher: Batcher, max_body: int) -> None:
    """nerkit's own POST /predict on `app`: the texts of a body (`parse_texts`) through `batcher`."""

    @app.post("/predict", response_model=Records | Record, responses=_ERRORS, openapi_extra=_PREDICT_DOC,
              summary="Tag texts", description="Each text's entities, as `nerkit predict --format jsonl` "
              "gives them. Concurrent requests are gathered into batches; texts of any length are read in "
              "windows. `{\"texts\": [...]}` answers `{\"records\": [...]}`, `{\"text\": ...}` one record.")
    async def predict(request: Request):
        texts, single = parse_texts(await read_body(request, max_body))
        if not texts:
            return JSONResponse({"records": []})
        try:
            future = batcher.submit(texts)
        except QueueFull as e:
            raise HTTPException(503, f"busy: {e}; try again in {RETRY_AFTER} s",
                                headers={"Retry-After": str(RETRY_AFTER)}) from None
        try:
            records = await asyncio.wrap_future(future)
        except Exception:  # noqa: BLE001 - logged by the batcher with its traceback
            raise HTTPException(500, "prediction failed; the server's log has the error") from None
        return JSONResponse(records[0] if single else {"records": records})


@dataclass(frozen=True)
class ServedModel:
    """The model a server predicts with, and the version Label Studio is told made its predictions.
    Replaced whole (one assignment) when Label Studio's training loop serves a new version, so that
    a batch is predicted by one model and names that one."""

    pipe: object
    version: str
    window: int | None
    batch_size: int
    info: dict


def load_served(model_dir: str | Path, options: ServeOptions, version: str | None = None) -> ServedModel:
    """The model in `model_dir`, loaded and checked for serving (a bad directory or window is a
    UserError), with what /info says of it; `version`: its name (default: `model_version`'s)."""
    model_dir = Path(model_dir)
    # An export runs on ONNX Runtime, no torch; each batch on all the threads, so one request is answered soon.
    pipe = load_pipeline(model_dir, options.device, options.threads, lanes=False)
    window = pipe.check_window(options.window)
    weights = pipe.model_dir.weights
    batch_size = options.batch_size or default_batch_size(pipe.config)
    info = {
        "nerkit_version": __version__,
        "types": pipe.types,
        "scheme": pipe.scheme,
        "encoder": pipe.config.encoder.name,
        "window": window,
        "runtime": pipe.model_dir.runtime,
        "model_sha256": sha256_file(weights),
        "config": config_to_dict(pipe.config),
        "licences": model_terms(model_dir),  # of its language models (nerkit.pretrained.licences)
        "head": pipe.config.model.head,
        "score": {"given": options.min_score is not None, "meaning": SCORE_MEANING,
                  "temperature": pipe.score_temperature, "min_score": options.min_score,
                  **({"threshold": pipe.threshold, "map": score_map_json(pipe.span_score_map or (1.0, 0.0))}
                     if pipe.head.has_threshold else {})},
        "serve": {**dataclasses.asdict(options), "window": window, "batch_size": batch_size,
                  "pid": os.getpid()},
    }
    version = version or model_version(pipe)
    if options.label_studio:
        info["model_version"] = version
    return ServedModel(pipe, version, window, batch_size, info)


def create_app(model_dir: str | Path, options: ServeOptions | None = None, trainer=None) -> FastAPI:
    """The ASGI app serving the model in `model_dir`, loaded now (a bad directory or window is a
    UserError before anything listens). The model thread starts and stops with the app's lifespan;
    stopping answers every request already queued. `trainer`: Label Studio's training loop
    (nerkit.tools.loop.backend.Trainer), which serves its own served version instead of
    `model_dir` and replaces it as its jobs give better ones."""
    options = options or ServeOptions()
    served = trainer.served if trainer is not None else None
    state = SimpleNamespace(served=load_served(served.path if served else model_dir, options,
                                               served.version if served else None))

    def predict_batch(texts: list[str]) -> list[dict]:
        current = state.served  # read once: the whole batch is this version's
        records = predict_records(current.pipe, texts, current.batch_size, current.window, options.min_score)
        if options.label_studio:
            for record in records:
                record["model_version"] = current.version
        return records

    def serve_version(version) -> None:
        """Serve `version` (a loop's `Served`): loaded off the event loop, then swapped in at once."""
        state.served = load_served(version.path, options, version.version)
        log.info(f"now serving {version.version} ({version.path})")

    batcher = Batcher(predict_batch, options.max_batch_chars, options.max_wait_ms / 1000, options.max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        if trainer is not None:
            trainer.attach(serve_version)
        try:
            yield
        finally:  # uvicorn gets here after the requests in flight are answered
            if trainer is not None:
                await asyncio.to_thread(trainer.stop)
            await asyncio.to_thread(batcher.stop)

    pipe = state.served.pipe
    app = FastAPI(title="nerkit", version=__version__, lifespan=lifespan,
                  summary="Chinese named-entity recognition: a nerkit model as a web service.",
                  description=f"Model: {', '.join(pipe.types)} ({pipe.config.encoder.name}). "
                              "Offsets count characters (code points) of each text, end exclusive.")
    app.state.batcher = batcher
    if options.label_studio:
        from nerkit.inference.label_studio import add_routes, batched

        add_routes(app, batched(batcher), lambda: (state.served.version, state.served.pipe.types), trainer)
    else:
        add_predict(app, batcher, options.max_body)

    @app.get("/health", summary="Whether the server is up", description="`queued`: requests waiting for "
             "the model; `in_flight`: those and the ones it is on; `batches` and `texts`: how many the model "
             "has predicted since the start (all in this worker process).")
    async def health():
        return {"status": "ok", "queued": batcher.queued, "in_flight": batcher.in_flight,
                "batches": batcher.batches, "texts": batcher.texts,
                **({"training": trainer.status()} if trainer is not None else {})}

    @app.get("/info", summary="The model", description="Entity types, tag scheme, encoder, prediction "
             "window, nerkit version, the model's config, the sha256 of its model.safetensors, and this "
             "server's settings.")
    async def model_info():
        return state.served.info

    return app


def app_from_environment() -> FastAPI:
    """The app of one `--workers` process, from the settings its parent put in NERKIT_SERVE. A model
    that fails to load ends the process with uvicorn's startup-failure code, which stops them all."""
    from nerkit.inference.draining import quiet_once_unlistened
    from nerkit.log import configure_logging

    settings = json.loads(os.environ[ENVIRONMENT])
    configure_logging(settings["log_level"])
    options = ServeOptions(**settings["options"])
    try:
        app = create_app(settings["model"], options)  # sets the runtime's threads as it loads
    except UserError as e:
        log.error(f"nerkit: error: {e}")
        sys.exit(STARTUP_FAILURE)
    quiet_once_unlistened(asyncio.get_running_loop())  # uvicorn calls the factory in the worker's loop
    return app


# ------------------------------------------------------------------------------ running it

def listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (0: a free port); a port in use is a UserError. Its protocol
    is named, so that asyncio turns Nagle's algorithm off on its connections (TCP_NODELAY): with it
    on, every keep-alive request but the first waited about 40 ms for the client's delayed ACK, as
    with uvicorn's own `--workers` socket (Kludex/uvicorn#3149)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror})",
                        fix="choose another --port, or stop what uses it" if e.errno == errno.EADDRINUSE else None) from None
    sock.set_inheritable(True)
    return sock


@contextmanager
def _graceful_exit(server) -> Iterator[None]:
    """uvicorn stops gracefully on SIGTERM and Ctrl-C, then raises the signal again for the handler
    it found, so that the process ends as the signal would have ended it. The handler here makes
    that end a normal one (exit 0); a signal that comes before uvicorn takes them over ends the
    process at once, as nothing has been served yet."""
    def handler(signum, frame):
        if not server.started:
            raise SystemExit(0)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _announce(model_dir, host: str, sock: socket.socket, workers: int, label_studio: bool = False) -> None:
    """The line that says where the server listens and what it speaks: nerkit's own API, or Label
    Studio's ML backend protocol (whose /predict takes Label Studio's tasks, not nerkit's texts)."""
    port = sock.getsockname()[1]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    processes = f" in {workers} processes" if workers > 1 else ""
    speaks = (f"as a Label Studio ML backend: connect {url} in a project's Settings > Model"
              if label_studio else f"POST /predict; the API's docs at {url}/docs")
    log.info(f"serving {model_dir} on {url}{processes} ({speaks}); SIGTERM or Ctrl-C stops it")


def run_server(model_dir: str | Path, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
               threads: int = 0, options: ServeOptions | None = None, access_log: bool = False,
               trainer=None) -> None:
    """`nerkit serve`: serve the model until SIGTERM or Ctrl-C, then answer every request in flight
    and return. One process holds the model and its model thread; with `workers` > 1, uvicorn starts
    that many processes, each loading the model with `threads` torch threads shared out among them
    (0: one per core in all), and the OS spreads the connections over them. `trainer`: Label
    Studio's training loop (`create_app`), which needs the one process that swaps the model."""
    import uvicorn

    from nerkit.inference.draining import DrainingHTTPProtocol, DrainingSupervisor
    from nerkit.inference.workers import threads_per_worker

    if workers < 1:
        raise UserError(f"--workers must be at least 1, not {workers}")
    if trainer is not None and workers > 1:
        raise UserError("training from Label Studio (--models) serves in one process, which swaps in each new "
                        "version", fix="drop --workers")
    options = dataclasses.replace(options or ServeOptions())
    level = logging.getLogger("nerkit").getEffectiveLevel()
    uvicorn_level = "warning" if level > logging.INFO else "debug" if level < logging.INFO else "info"
    if workers == 1:
        options.threads = threads
        app = create_app(model_dir, options, trainer)  # before the port is bound: a bad model costs no listening
        sock = listen(host, port)
        _announce(model_dir, host, sock, workers, options.label_studio)
        config = uvicorn.Config(app, host=host, port=sock.getsockname()[1], log_level=uvicorn_level,
                                access_log=access_log, timeout_graceful_shutdown=None, http=DrainingHTTPProtocol)
        server = uvicorn.Server(config)
        with _graceful_exit(server):
            server.run(sockets=[sock])
        if not server.started:
            raise UserError("the server did not start; its log above says why")
        return
    options.threads = threads_per_worker(threads, workers)
    load_pipeline(model_dir, options.device).check_window(options.window)  # fail here, not in N workers
    os.environ[ENVIRONMENT] = json.dumps({"model": str(model_dir), "options": dataclasses.asdict(options),
                                          "log_level": level})
    sock = listen(host, port)
    _announce(model_dir, host, sock, workers, options.label_studio)
    config = uvicorn.Config(f"{__name__}:app_from_environment", factory=True, host=host, port=sock.getsockname()[1],
                            workers=workers, log_level=uvicorn_level, access_log=access_log,
                            timeout_graceful_shutdown=None, http=DrainingHTTPProtocol)
    DrainingSupervisor(config, sockets=[sock]).run()
