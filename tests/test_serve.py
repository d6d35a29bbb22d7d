"""Tests for `nerkit serve` (nerkit/inference/server.py, batcher.py, nerkit/cli/serve.py).

The micro-batcher alone, with a stand-in for the model: requests that wait together are one batch,
within the batch's characters; a full queue refuses; stopping answers what is queued; a failing
batch fails only its bad request. Then the real server, started as `python -m nerkit serve` on a
free port of 127.0.0.1 and spoken to over HTTP: its records are `nerkit predict --format jsonl`'s,
one client or sixteen at once; every bad request gets its status and a one-line reason without
disturbing the others; a full queue is 503 with Retry-After; SIGTERM answers every request in
flight and exits 0, with one process or with `--workers 2`, and loses no request sent on a
kept-alive connection; the OpenAPI schema describes exactly what it accepts (schemathesis). Every
wait is bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from helpers import SERVER_STARTUP as STARTUP  # noqa: E402
from helpers import Server, serving, tiny_raw_config, write_lm  # noqa: E402

from nerkit.inference.batcher import Batcher, QueueFull  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLE_TEXTS = (REPO / "data" / "sample" / "texts.txt").read_text(encoding="utf-8").splitlines()
TEXTS = SAMPLE_TEXTS + [
    "",
    "   ",
    "张三\t在 北京大学 读书。",
    "😀李四来自上海，🚀在IBM公司工作。",
    "。".join(SAMPLE_TEXTS) * 6,  # hundreds of characters: read in windows and stitched
]
TIMEOUT = 60  # seconds any one HTTP exchange may take


# ------------------------------------------------------------------------- the batcher alone

class Model:
    """A stand-in for the model: records each batch of texts, answers each text with its length,
    and can be held (the first batch waits for `release`) or made to fail on a text."""

    def __init__(self, hold: bool = False, fail_on: str | None = None):
        self.batches: list[list[str]] = []
        self.started = threading.Event()
        self.released = threading.Event()
        if not hold:
            self.released.set()
        self.fail_on = fail_on

    def __call__(self, texts: list[str]) -> list[int]:
        self.batches.append(list(texts))
        self.started.set()
        assert self.released.wait(10)
        if self.fail_on in texts:
            raise ValueError(f"cannot read {self.fail_on!r}")
        return [len(t) for t in texts]


@contextmanager
def batcher(model: Model, **options) -> Iterator[Batcher]:
    b = Batcher(model, **options).start()
    try:
        yield b
    finally:
        model.released.set()
        b.stop(10)


def test_requests_that_wait_together_are_one_batch():
    model = Model(hold=True)
    with batcher(model, max_batch_chars=100, max_wait=0) as b:
        first = b.submit(["a"])
        assert model.started.wait(10)  # the model is on the first request
        waiting = [b.submit(["bb", "ccc"]), b.submit(["dddd"])]
        assert b.queued == 2 and b.in_flight == 3
        model.released.set()
        assert first.result(10) == [1]
        assert [f.result(10) for f in waiting] == [[2, 3], [4]]
    assert model.batches == [["a"], ["bb", "ccc", "dddd"]]


def test_a_batch_holds_at_most_max_batch_chars_and_a_larger_request_is_its_own():
    model = Model(hold=True)
    with batcher(model, max_batch_chars=5, max_wait=0) as b:
        b.submit(["x"])
        assert model.started.wait(10)
        futures = [b.submit(t) for t in (["aa"], ["bbb"], ["cc"], ["dddddddd"], ["e"])]
        model.released.set()
        assert [f.result(10) for f in futures] == [[2], [3], [2], [8], [1]]
    assert model.batches == [["x"], ["aa", "bbb"], ["cc"], ["dddddddd"], ["e"]]


def test_max_batch_chars_0_predicts_each_request_alone():
    model = Model(hold=True)
    with batcher(model, max_batch_chars=0, max_wait=1.0) as b:
        b.submit(["x"])
        assert model.started.wait(10)
        futures = [b.submit(["a"]), b.submit(["b"])]
        model.released.set()
        assert [f.result(10) for f in futures] == [[1], [1]]
    assert model.batches == [["x"], ["a"], ["b"]]


def test_the_first_request_waits_max_wait_for_others():
    model = Model()
    with batcher(model, max_batch_chars=100, max_wait=0.5) as b:
        started = time.monotonic()
        first = b.submit(["a"])
        time.sleep(0.1)
        second = b.submit(["b"])
        assert first.result(10) == [1] and second.result(10) == [1]
        assert time.monotonic() - started >= 0.45
    assert model.batches == [["a", "b"]]


def test_a_full_queue_refuses_and_a_freed_place_takes_the_next():
    model = Model(hold=True)
    with batcher(model, max_batch_chars=100, max_wait=0, max_queue=2) as b:
        b.submit(["x"])
        assert model.started.wait(10)  # taken by the model: out of the queue
        queued = [b.submit(["a"]), b.submit(["b"])]
        with pytest.raises(QueueFull, match="--max-queue 2"):
            b.submit(["c"])
        model.released.set()
        assert [f.result(10) for f in queued] == [[1], [1]]
        assert b.submit(["d"]).result(10) == [1]


def test_a_full_queue_of_one_says_so_in_the_singular():
    """The 503's reason reads "1 request waits", not "1 requests wait" (issue 41)."""
    model = Model(hold=True)
    with batcher(model, max_batch_chars=100, max_wait=0, max_queue=1) as b:
        b.submit(["x"])
        assert model.started.wait(10)
        queued = b.submit(["a"])
        with pytest.raises(QueueFull) as info:
            b.submit(["b"])
        assert str(info.value) == "1 request waits for the model already (--max-queue 1)"
        model.released.set()
        assert queued.result(10) == [1]


def test_stop_answers_every_queued_request_then_refuses():
    model = Model(hold=True)
    b = Batcher(model, max_batch_chars=100, max_wait=5.0).start()
    futures = [b.submit(["a"]), b.submit(["bb"])]
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    model.released.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert [f.result(0) for f in futures] == [[1], [2]]
    with pytest.raises(QueueFull, match="stopping"):
        b.submit(["c"])


def test_a_failing_batch_fails_only_the_request_that_fails_alone():
    model = Model(hold=True, fail_on="bad")
    with batcher(model, max_batch_chars=100, max_wait=0) as b:
        b.submit(["x"])
        assert model.started.wait(10)
        good, bad, other = b.submit(["ok"]), b.submit(["bad"]), b.submit(["fine"])
        model.released.set()
        assert good.result(10) == [2] and other.result(10) == [4]
        with pytest.raises(ValueError, match="cannot read 'bad'"):
            bad.result(10)
        assert b.submit(["after"]).result(10) == [5]  # the model thread goes on


def test_a_cancelled_request_is_skipped():
    model = Model(hold=True)
    with batcher(model, max_batch_chars=100, max_wait=0) as b:
        b.submit(["x"])
        assert model.started.wait(10)
        cancelled, kept = b.submit(["gone"]), b.submit(["kept"])
        assert cancelled.cancel()
        model.released.set()
        assert kept.result(10) == [4]
    assert model.batches == [["x"], ["kept"]]


# ------------------------------------------------------------------------- the real server

def post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/predict", timeout=TIMEOUT, **kwargs)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def expected(tiny_model_dir, tmp_path_factory) -> list[dict]:
    """What `nerkit predict --format jsonl` writes for TEXTS (in a process of its own, as a user runs it)."""
    source = tmp_path_factory.mktemp("serve_texts") / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir),
                           "--format", "jsonl", "--threads", "1", str(source)],
                          cwd=REPO, capture_output=True, timeout=STARTUP)
    assert done.returncode == 0, done.stderr.decode()
    records = [json.loads(line) for line in done.stdout.decode("utf-8").split("\n") if line]
    assert [r["text"] for r in records] == TEXTS
    assert any(r["entities"] for r in records)
    return records


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[Server]:
    with serving(tiny_model_dir, tmp_path_factory.mktemp("serve"), "--max-body", "20000") as running:
        yield running


@pytest.mark.slow
def test_the_records_are_those_of_nerkit_predict(server, expected):
    answer = post(server.url, json={"texts": TEXTS})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"records": expected}
    for text, record in zip(TEXTS, expected):
        assert post(server.url, json={"text": text}).json() == record
    assert post(server.url, json={"texts": []}).json() == {"records": []}


@pytest.mark.slow
def test_an_exported_model_is_served_on_onnx_runtime_with_the_same_records(tiny_model_dir, tmp_path, expected):
    """Issue 30: `nerkit serve` runs what `nerkit export` wrote (ONNX Runtime, found from its
    nerkit.json), and answers what `nerkit predict` writes with the PyTorch model."""
    pytest.importorskip("onnxruntime")
    exported = tmp_path / "onnx"
    done = subprocess.run([sys.executable, "-m", "nerkit", "--quiet", "export", "--model", str(tiny_model_dir),
                           "--out", str(exported)], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    with serving(exported, tmp_path) as running:
        records = post(running.url, json={"texts": TEXTS}).json()["records"]
        info = httpx.get(f"{running.url}/info", timeout=TIMEOUT).json()
    assert records == expected
    assert info["runtime"] == "onnx" and len(info["model_sha256"]) == 64
    # The server's own module, its app and a prediction through it, in a process that never imports torch.
    probe = ("import sys, json\n"
             "from starlette.testclient import TestClient\n"
             "from nerkit.inference.server import create_app\n"
             "with TestClient(create_app(sys.argv[1])) as client:\n"
             "    answer = client.post('/predict', json={'texts': json.loads(sys.argv[2])}).json()\n"
             "print(json.dumps({'torch': 'torch' in sys.modules, 'answer': answer}))\n")
    done = subprocess.run([sys.executable, "-c", probe, str(exported), json.dumps(TEXTS)], cwd=REPO,
                          capture_output=True, text=True, timeout=STARTUP)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"torch": False, "answer": {"records": expected}}


@pytest.mark.slow
def test_sixteen_concurrent_clients_get_their_own_records(server, expected):
    """16 clients x 5 requests, each of a different slice of the texts, all at once."""
    def client(number: int) -> list[tuple[int, dict, list[dict]]]:
        answers = []
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
            for request in range(5):
                start = (number * 5 + request) % len(TEXTS)
                count = 1 + (number + request) % 4
                answer = http.post("/predict", json={"texts": TEXTS[start:start + count]})
                answers.append((answer.status_code, answer.json(), expected[start:start + count]))
        return answers

    before = httpx.get(f"{server.url}/health", timeout=TIMEOUT).json()
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(client, n) for n in range(16)]
        results = [answer for f in futures for answer in f.result(timeout=120)]
    assert len(results) == 80
    for status, got, want in results:
        assert status == 200
        assert got == {"records": want}
    after = httpx.get(f"{server.url}/health", timeout=TIMEOUT).json()
    assert after["status"] == "ok" and after["queued"] == after["in_flight"] == 0
    assert 0 < after["batches"] - before["batches"] <= 80  # a batch holds one request or more
    assert after["texts"] - before["texts"] == sum(len(want) for _, _, want in results)


@pytest.mark.slow
def test_serve_window_reads_as_predict_window(tiny_model_dir, tmp_path):
    """Issue 33, item 2: `serve --window N` answers what `nerkit predict --window N` writes, and
    /info names the window."""
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "nerkit", "predict", "--model", str(tiny_model_dir), "--format",
                           "jsonl", "--threads", "1", "--window", "7", str(source)],
                          cwd=REPO, capture_output=True, timeout=STARTUP)
    assert done.returncode == 0, done.stderr.decode()
    windowed = [json.loads(line) for line in done.stdout.decode("utf-8").split("\n") if line]
    with serving(tiny_model_dir, tmp_path, "--window", "7") as running:
        assert post(running.url, json={"texts": TEXTS}).json() == {"records": windowed}
        assert httpx.get(f"{running.url}/info", timeout=TIMEOUT).json()["window"] == 7


def test_a_language_model_is_served_in_small_model_batches(tmp_path):
    """Without --batch-size a model with a language model (one, or a stack) is served in model batches
    of 4 texts, any other in batches of 64; an explicit --batch-size wins."""
    pytest.importorskip("transformers")
    from nerkit.config import build_config
    from nerkit.inference.server import ServeOptions, default_batch_size

    lm, other = write_lm(tmp_path / "tiny-lm"), write_lm(tmp_path / "other-lm")
    plain = build_config(tiny_raw_config(), "<tiny>", [])
    one = build_config(tiny_raw_config(), "<tiny>", [f"embeddings.lm.path={lm}"])
    stacked = build_config(tiny_raw_config(), "<tiny>", [f"embeddings.lm=[{{path: {lm}}}, {{path: {other}}}]"])
    assert [default_batch_size(c) for c in (plain, one, stacked)] == [64, 4, 4]
    assert ServeOptions().batch_size is None and ServeOptions(batch_size=16).batch_size == 16


@pytest.mark.slow
def test_health_info_and_the_api_docs(server, tiny_model_dir):
    import yaml

    from nerkit import __version__
    from nerkit.inference.pipeline import Pipeline

    info = httpx.get(f"{server.url}/info", timeout=TIMEOUT).json()
    pipe = Pipeline.load(tiny_model_dir)
    assert info["types"] == pipe.types and info["scheme"] == pipe.scheme
    assert info["nerkit_version"] == __version__
    assert info["window"] == pipe.window
    assert info["config"] == yaml.safe_load((tiny_model_dir / "config.yaml").read_text(encoding="utf-8"))
    assert info["model_sha256"] == hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert info["serve"]["max_body"] == 20000
    assert info["serve"]["batch_size"] == 64  # no --batch-size, no language model
    assert "probability" in info["score"]["meaning"] and info["score"]["temperature"] == 1.0
    assert info["score"]["given"] is False  # no --scores: as `nerkit predict` (its jsonl) answers
    api = httpx.get(f"{server.url}/openapi.json", timeout=TIMEOUT).json()
    assert {"/predict", "/health", "/info"} <= set(api["paths"])
    assert {"200", "400", "413", "422", "503"} <= set(api["paths"]["/predict"]["post"]["responses"])
    assert "texts" in json.dumps(api["paths"]["/predict"]["post"]["requestBody"])
    docs = httpx.get(f"{server.url}/docs", timeout=TIMEOUT)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


@pytest.mark.slow
def test_the_api_schema_says_exactly_what_the_server_accepts(tiny_model_dir, tmp_path):
    """schemathesis sends requests made from /openapi.json (its examples, its edge cases, then 100
    generated per operation, schema-valid and not) with every check on: no 5xx, every answer as the
    schema says, every schema-valid request accepted (`{"texts": [...], "text": null}` was refused
    with 422 while the schema allowed it), every invalid one refused. Its command line, in a process
    of its own: a stable interface, and no pytest plugin or Hypothesis settings shared with this run."""
    pytest.importorskip("schemathesis")
    report = tmp_path / "schemathesis.json"
    with serving(tiny_model_dir, tmp_path) as server:
        done = subprocess.run(
            [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()", "run",
             f"{server.url}/openapi.json", "--checks", "all", "--phases", "examples,coverage,fuzzing",
             "--max-examples", "100", "--seed", "41", "--workers", "1", "--continue-on-failure",
             "--generation-database", "none", "--request-timeout", str(TIMEOUT), "--no-color",
             "--report", "json", "--report-json-path", str(report)],
            cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    summary = json.loads(report.read_text(encoding="utf-8"))
    assert summary["operations"]["tested"] == 3  # POST /predict, GET /health, GET /info
    assert summary["test_cases"]["generated"] >= 100
    assert summary["failures"] == [] and summary["errors"] == []


def chunks(size: int) -> Iterator[bytes]:
    """A body sent in pieces, without Content-Length (chunked)."""
    body = json.dumps({"text": "x" * size}).encode()
    for start in range(0, len(body), 1000):
        yield body[start:start + 1000]


BAD_REQUESTS = {
    # name: (body, status, words of the reason)
    "over the size limit": (json.dumps({"text": "张" * 4000}).encode(), 413, "over this server's limit of 20000"),
    "over the limit, chunked": (lambda: chunks(30_000), 413, "over this server's limit of 20000"),
    "not JSON": (b'{"texts": ["a"', 422, "not JSON"),
    "empty": (b"", 422, "not JSON"),
    "nested too deeply": (b"[" * 15000, 422, "nested too deeply"),
    "an array": (b'["a", "b"]', 422, "JSON array, not an object"),
    "texts not an array": (b'{"texts": "abc"}', 422, '"texts" is a JSON string, not an array'),
    "a text not a string": (b'{"texts": ["a", 3]}', 422, "texts[1] is a JSON number"),
    "text null": (b'{"text": null}', 422, '"text" is a JSON null'),
    "unknown key": (b'{"textz": ["a"]}', 422, 'unknown key "textz"'),
    "both keys": (b'{"texts": ["a"], "text": "b"}', 422, 'both "texts" and "text"'),
    "neither key": (b"{}", 422, 'neither "texts" nor "text"'),
    "not UTF-8": ('{"text": "张三"}'.encode("gbk"), 400, "not UTF-8"),
    "a lone surrogate": (b'{"texts": ["ok", "a\\ud800b"]}', 400, "texts[1] holds a lone surrogate (\\ud800) at character 1"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", BAD_REQUESTS)
def test_a_bad_request_gets_its_status_and_a_one_line_reason(server, expected, name):
    body, status, reason = BAD_REQUESTS[name]
    answer = post(server.url, content=body() if callable(body) else body,
                  headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert reason in detail and "\n" not in detail
    assert post(server.url, json={"text": TEXTS[0]}).json() == expected[0]  # the server is still up


@pytest.mark.slow
def test_bad_requests_do_not_disturb_good_ones(server, expected):
    def good(i: int):
        answer = post(server.url, json={"texts": TEXTS[i % 4:i % 4 + 3]})
        return answer.status_code, answer.json() == {"records": expected[i % 4:i % 4 + 3]}

    def bad(name: str):
        body, status, _ = BAD_REQUESTS[name]
        return post(server.url, content=body() if callable(body) else body).status_code, status

    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(good, i) for i in range(12)]
        bads = [pool.submit(bad, name) for name in BAD_REQUESTS]
        assert all(f.result(timeout=120) == (200, True) for f in goods)
        assert all(got == want for got, want in (f.result(timeout=120) for f in bads))


@pytest.mark.slow
def test_a_full_queue_answers_503_with_retry_after(tiny_model_dir, tmp_path, expected):
    """Two requests wait 3 s for others to join their batch and fill the queue of two: a third is
    refused at once, the two are answered, and the event loop answers /health meanwhile."""
    with serving(tiny_model_dir, tmp_path, "--max-queue", "2", "--max-wait-ms", "3000") as server:
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(post, server.url, json={"text": TEXTS[i]}) for i in range(2)]
            wait_for(lambda: httpx.get(f"{server.url}/health", timeout=TIMEOUT).json()["queued"] == 2, 20,
                     "two requests queued")
            refused = post(server.url, json={"text": TEXTS[2]})
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "--max-queue 2" in refused.json()["detail"]
            assert [f.result(timeout=TIMEOUT).json() for f in waiting] == expected[:2]
        assert post(server.url, json={"text": TEXTS[2]}).json() == expected[2]


@pytest.mark.slow
def test_sigterm_answers_every_request_in_flight_and_exits_0(tiny_model_dir, tmp_path, expected):
    with serving(tiny_model_dir, tmp_path, "--max-wait-ms", "4000") as server:
        with ThreadPoolExecutor(6) as pool:
            futures: list[Future] = [pool.submit(post, server.url, json={"texts": TEXTS[i:i + 2]}) for i in range(6)]
            wait_for(lambda: httpx.get(f"{server.url}/health", timeout=TIMEOUT).json()["in_flight"] == 6, 20,
                     "six requests in flight")
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with pytest.raises(httpx.ConnectError):  # it takes no new connection
                httpx.get(f"{server.url}/health", timeout=5)
            answers = [f.result(timeout=TIMEOUT) for f in futures]
        assert [a.status_code for a in answers] == [200] * 6
        assert [a.json() for a in answers] == [{"records": expected[i:i + 2]} for i in range(6)]
        assert server.process.wait(30) == 0, server.output()
        assert "Traceback" not in server.output()


class ClientEnd(NamedTuple):
    answered: int  # requests answered 200
    how: str  # "refused": a new connection was refused (no request sent); else the error of a request lost
    closing: bool  # whether the last answer said `Connection: close`


def keep_alive_client(url: str, text: str, until: float, most: int = 5000) -> ClientEnd:
    """Request after request on one kept-alive connection (httpx keeps it) until a connection is
    refused, `until` passes or `most` are answered."""
    answered, closing = 0, False
    with httpx.Client(timeout=TIMEOUT) as client:
        while answered < most and time.monotonic() < until:
            try:
                answer = client.post(f"{url}/predict", json={"text": text})
            except httpx.ConnectError:  # before the request was written: the client knows it was not served
                return ClientEnd(answered, "refused", closing)
            except httpx.TransportError as e:  # written, and no answer: lost
                return ClientEnd(answered, repr(e), closing)
            assert answer.status_code == 200, answer.text
            answered, closing = answered + 1, answer.headers.get("connection", "").lower() == "close"
    return ClientEnd(answered, "unfinished", closing)


def stop_under_keep_alive_load(server: Server, clients: int = 16, after: float = 1.0) -> list[ClientEnd]:
    """`clients` keep-alive clients, SIGTERM `after` seconds into their requests; how each ended."""
    until = time.monotonic() + after + 60
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(keep_alive_client, server.url, TEXTS[i % 4], until) for i in range(clients)]
        time.sleep(after)
        server.process.send_signal(signal.SIGTERM)
        return [f.result(timeout=after + 90) for f in futures]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_loses_no_request_of_a_kept_alive_connection(tiny_model_dir, tmp_path, workers):
    """Sixteen clients send request after request, each on its kept-alive connection, and SIGTERM
    comes meanwhile. Each request sent is answered: the answers of the shutdown say `Connection:
    close`, so the next request goes on a new connection, which is refused before it is written."""
    with serving(tiny_model_dir, tmp_path, "--workers", str(workers)) as server:
        ends = stop_under_keep_alive_load(server)
        assert server.process.wait(30) == 0, server.output()
    assert all(end.answered > 0 for end in ends), ends
    assert [end.how for end in ends] == ["refused"] * len(ends), ends
    assert all(end.closing for end in ends), ends


def worker_pids(parent: int) -> list[int]:
    """The `--workers` processes of a server (spawned interpreters; multiprocessing's resource
    tracker left out), from Linux's /proc."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    commands = {int(pid): Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children}
    return [pid for pid, command in commands.items() if b"spawn_main" in command and b"resource_tracker" not in command]


def refuses(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads worker processes from Linux's /proc")
def test_sigterm_stops_every_worker_listening_before_any_worker_stops(tiny_model_dir, tmp_path):
    """Every worker holds the listening socket, and the kernel takes connections for it while any
    has it open, even a worker yet to stop; so the main process stops it listening in all of them
    at once. Shown with the workers paused (SIGSTOP): the port refuses connections all the same."""
    with serving(tiny_model_dir, tmp_path, "--workers", "2") as server:
        workers = worker_pids(server.process.pid)
        assert len(workers) == 2, workers
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            server.process.send_signal(signal.SIGTERM)
            wait_for(lambda: refuses(server.url), 10, "the port refusing connections")
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        assert server.process.wait(30) == 0, server.output()
    assert "Traceback" not in server.output(), server.output()


@pytest.mark.slow
def test_worker_processes_answer_alike_and_stop_on_sigterm(tiny_model_dir, tmp_path, expected):
    """...and with no traceback: from the socket's stop to their own, the workers' accepts fail (EINVAL),
    which asyncio would log on every turn of their loops."""
    with serving(tiny_model_dir, tmp_path, "--workers", "2", "--threads", "2") as server:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, server.url, json={"text": TEXTS[i % len(TEXTS)]}) for i in range(16)]
            answers = [f.result(timeout=TIMEOUT) for f in futures]
        assert [a.json() for a in answers] == [expected[i % len(TEXTS)] for i in range(16)]
        assert httpx.get(f"{server.url}/info", timeout=TIMEOUT).json()["serve"]["threads"] == 1  # 2 shared by 2
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0, server.output()
        assert "Traceback" not in server.output()


@pytest.mark.slow
def test_the_listening_socket_gives_connections_without_nagles_delay():
    """asyncio sets TCP_NODELAY only on connections of a socket whose protocol is TCP by name."""
    import asyncio

    from nerkit.inference.server import listen

    async def nodelay() -> int:
        sock = listen("127.0.0.1", 0)
        accepted = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(lambda r, w: accepted.set_result(w), sock=sock)
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        theirs = await asyncio.wait_for(accepted, 10)
        flag = theirs.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        for w in (writer, theirs):
            w.close()
        server.close()
        await server.wait_closed()
        return flag

    assert asyncio.run(nodelay()) != 0


# ------------------------------------------------------------------------- the command's errors

def test_a_bad_model_directory_is_one_line_before_anything_listens(nerkit, tmp_path):
    result = nerkit("serve", "--model", str(tmp_path / "missing"), "--port", "0", check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"nerkit: error: {tmp_path / 'missing'}: model directory not found; "
                                                  "pass the --out directory of `nerkit train`"]


def test_a_port_in_use_is_one_line(nerkit, tiny_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = nerkit("serve", "--model", str(tiny_model_dir), "--port", str(port), "--threads", "1", check=False)
    assert result.returncode == 2
    assert f"nerkit: error: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("label_studio, says, not_says", [
    (False, "POST /predict; the API's docs at http://127.0.0.1:", "Label Studio"),
    (True, "as a Label Studio ML backend: connect http://127.0.0.1:", "POST /predict"),
])
def test_the_start_up_line_names_the_protocol_served(caplog, label_studio, says, not_says):
    """`nerkit serve --label-studio` speaks Label Studio's protocol, whose /predict takes its tasks:
    the start-up line says where to connect it, not nerkit's own API."""
    from nerkit.inference.server import _announce

    with socket.socket() as sock, caplog.at_level("INFO", logger="nerkit"):
        sock.bind(("127.0.0.1", 0))
        _announce("runs/m", "127.0.0.1", sock, 1, label_studio)
    (line,) = caplog.messages
    assert says in line and not_says not in line
