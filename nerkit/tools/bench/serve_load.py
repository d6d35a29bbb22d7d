"""`nerkit bench serve`: a bounded load on a real `nerkit serve` process. The server starts as a user
starts it (on a free port of 127.0.0.1), answers a warm-up, then each round sends at most N requests
(one text each, the texts in turn) from C keep-alive connections, for at most S seconds; latency
p50/p95/p99 and throughput per round, their min/median/max in the record (speed.py writes it)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from nerkit.data.records import read_text, text_lines
from nerkit.ending import stop_child
from nerkit.errors import UserError
from nerkit.tools.bench.speed import check_subject, environment, nerkit_command, prepare_out, save, summarise

STARTUP_S = 180  # a server may take this long to load its model on a busy machine


WARM_UP = 20  # requests answered before the first round


@dataclass
class Load:
    """How much a round asks of the server: at most `requests` requests, `concurrency` clients at
    once, at most `seconds` seconds."""
    requests: int = 200
    concurrency: int = 8
    seconds: float = 20.0


def read_texts(path: Path) -> list[str]:
    """The non-empty lines of a text file, one request each."""
    if not path.is_file():
        raise UserError("text file not found", where=str(path))
    texts = text_lines(read_text(path))
    if not texts:
        raise UserError("the text file has no non-empty line to send", where=str(path))
    return texts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def start_server(command: list[str], port: int, log, env: dict[str, str | None] | None = None) -> subprocess.Popen:
    """Start the server (with `env` applied to this process's environment) and wait until its
    /health answers; a server that ends or does not answer in STARTUP_S seconds is a UserError with
    the end of its log."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               env=environment(env or {}))
    deadline = time.monotonic() + STARTUP_S
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            stop_server(process)
            log.seek(0)
            tail = " | ".join(log.read().decode("utf-8", errors="replace").splitlines()[-5:])
            raise UserError(f"the server did not start (exit code {process.returncode}): {tail}")
        try:
            get_json(f"http://127.0.0.1:{port}/health", 2)
            return process
        except OSError:
            time.sleep(0.2)


def stop_server(process: subprocess.Popen) -> None:
    """SIGTERM (the server drains and exits), SIGKILL after 60 s."""
    stop_child(process, 60)


async def _exchange(reader, writer, body: bytes) -> int:
    """One POST /predict over a kept-alive connection; the answer's status."""
    writer.write(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    return status


async def _load(port: int, bodies: list[bytes], load: Load) -> tuple[list[float], float]:
    """`load.concurrency` clients sending the bodies in turn until `load.requests` are answered or
    `load.seconds` have passed; each request's latency and the wall seconds. A status other than 200
    is an error: a benchmark of failures measures nothing."""
    latencies: list[float] = []
    sent = 0
    stop_at = time.monotonic() + load.seconds

    async def client() -> None:
        nonlocal sent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while sent < load.requests and time.monotonic() < stop_at:
                body = bodies[sent % len(bodies)]
                sent += 1
                started = time.perf_counter()
                status = await _exchange(reader, writer, body)
                if status != 200:
                    raise UserError(f"the server answered {status} to a request")
                latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(load.concurrency))), load.seconds + 120)
    return latencies, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0-100) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def measure(port: int, texts: list[str], bodies: list[bytes], load: Load) -> dict:
    """One round's figures: requests answered, requests/s, chars/s, latency percentiles in ms."""
    latencies, wall = asyncio.run(_load(port, bodies, load))
    done = len(latencies)
    if not done:
        raise UserError(f"no request was answered within {load.seconds:g} s", fix="give more --seconds")
    chars = sum(len(texts[i % len(texts)]) for i in range(done))  # the bodies go in turn from the first
    return {"requests_done": done, "requests_per_s": done / wall, "chars_per_s": chars / wall,
            "p50_ms": 1000 * percentile(latencies, 50), "p95_ms": 1000 * percentile(latencies, 95),
            "p99_ms": 1000 * percentile(latencies, 99), "seconds": wall}


def bench_serve(model: Path, text: Path, out: Path, load: Load, rounds: int, threads: int = 0, workers: int = 1,
                server_options: list[str] = (), name: str | None = None) -> tuple[str, dict]:
    """Start `nerkit serve` on `model` (with `--threads`, `--workers` and any other `server_options`),
    warm it up, and measure `rounds` rounds of `load`; the record (with the server's start-up
    seconds) and the table."""
    check_subject(model, rounds)
    texts = read_texts(text)
    prepare_out(out, model, text)
    bodies = [json.dumps({"text": t}, ensure_ascii=False).encode("utf-8") for t in texts]
    port = free_port()
    server_options = ["--threads", str(threads), "--workers", str(workers), *server_options]
    command = nerkit_command("serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                             *server_options)
    figures = []
    with tempfile.TemporaryFile() as log:
        started = time.perf_counter()
        process = start_server(command, port, log)
        try:
            startup = time.perf_counter() - started
            asyncio.run(_load(port, bodies, Load(WARM_UP, min(4, load.concurrency), 60)))
            for number in range(1, rounds + 1):
                figures.append({"round": number, **measure(port, texts, bodies, load)})
        finally:
            stop_server(process)
    settings = {"model": str(model), "text": str(text), "requests": load.requests, "concurrency": load.concurrency,
                "seconds": load.seconds, "threads": threads, "workers": workers, "server_options": server_options,
                "startup_s": startup}
    name = name or f"serve_{model.name}_c{load.concurrency}"
    record = summarise("serve", name, command, figures, settings)
    return save(out, record), record
