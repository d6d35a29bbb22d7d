"""Throughput and latency of `nerkit serve`: requests per second and p50/p99 latency at 1, 8 and 32
concurrent clients, with micro-batching on (`on`: the server's defaults; `on-wait-2ms`: the first
request of a batch waits 2 ms for others; `on-batch-4`: a micro-batch is predicted in model batches of
at most 4 texts of similar lengths, `--batch-size 4`) and off (`off`: `--max-batch-chars 0`, each request a
batch of its own), for each model given.

    python scripts/bench_serve.py --model runs/demo [--model DIR2 ...] [--clients 1,8,32]
        [--modes on,off] [--requests 400] [--seconds 20] [--texts ${NERKIT_DATA}/msra/test.char.bmes]
        [--threads 0] [--workers 1] [--json out.jsonl]

Each server is started as a user starts it (`python -m nerkit serve`, on a free port of 127.0.0.1)
and stopped with SIGTERM. Every request is one text: the sentences of `--texts` (MSRA's test set
when NERKIT_DATA has it, else data/sample/texts.txt) in turn. The clients are asyncio tasks in this
process speaking plain HTTP/1.1 over keep-alive connections, so that the client costs little of
the CPU it shares with the server. The servers of all modes run at once and are measured in turns,
`--rounds` times, so that each mode sees the same machine (on a shared machine the load moves); a
measurement sends `--requests` requests or runs `--seconds`, whichever ends first, and the table
shows the medians. Every answer is checked to be 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("NERKIT_DATA") or REPO.parent / "shared" / "data")
MODES = {"on": [], "on-wait-2ms": ["--max-wait-ms", "2"], "on-batch-4": ["--batch-size", "4"],
         "off": ["--max-batch-chars", "0", "--max-wait-ms", "0"]}


def read_texts(path: Path | None) -> tuple[list[str], str]:
    if path is None:
        msra = DATA / "msra" / "test.char.bmes"
        path = msra if msra.is_file() else REPO / "data" / "sample" / "texts.txt"
    if path.suffix in (".txt",):
        return [t for t in path.read_text(encoding="utf-8").splitlines() if t], str(path)
    from nerkit.data.corpus import read_corpus

    return [s.text for s in read_corpus(path).sentences if s.text], str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.loads(answer.read())


def start_server(model: str, options: list[str], log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "nerkit", "serve", "--model", model, "--host", "127.0.0.1",
                                    "--port", str(port), *options], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server ended ({process.returncode}):\n{log.read_text()}")
        try:
            get_json(f"http://127.0.0.1:{port}/health", 2)
            return process, port
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not answer within 180 s:\n{log.read_text()}")


def stop_server(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


async def _exchange(reader, writer, body: bytes) -> int:
    writer.write(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    return status


async def _load(port: int, bodies: list[bytes], clients: int, requests: int, seconds: float) -> tuple[list[float], float]:
    """`clients` connections sending the bodies in turn until `requests` are answered or `seconds`
    have passed; the latency of each request and the wall time."""
    latencies: list[float] = []
    sent = 0
    stop_at = time.monotonic() + seconds

    async def client() -> None:
        nonlocal sent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while sent < requests and time.monotonic() < stop_at:
                body = bodies[sent % len(bodies)]
                sent += 1
                started = time.perf_counter()
                status = await _exchange(reader, writer, body)
                if status != 200:
                    raise RuntimeError(f"status {status}")
                latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), seconds + 120)
    return latencies, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def measure(port: int, texts: list[str], bodies: list[bytes], clients: int, requests: int, seconds: float) -> dict:
    before = get_json(f"http://127.0.0.1:{port}/health")
    latencies, wall = asyncio.run(_load(port, bodies, clients, requests, seconds))
    after = get_json(f"http://127.0.0.1:{port}/health")
    done = len(latencies)
    chars = sum(len(texts[i % len(texts)]) for i in range(done))  # the bodies are sent in turn from the first
    batches = after["batches"] - before["batches"]
    return {"clients": clients, "requests": done, "requests_per_s": done / wall, "chars_per_s": chars / wall,
            "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99),
            "texts_per_batch": (after["texts"] - before["texts"]) / batches if batches else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="Model directory (repeatable).")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--modes", default="on,off", help=f"Comma-separated, of: {', '.join(MODES)}.")
    parser.add_argument("--requests", type=int, default=400, help="Requests per measurement, at most.")
    parser.add_argument("--seconds", type=float, default=20, help="Seconds per measurement, at most.")
    parser.add_argument("--rounds", type=int, default=3, help="Measurements of each mode and level, in turns; "
                        "the table shows their medians.")
    parser.add_argument("--texts", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=0, help="The server's --threads.")
    parser.add_argument("--workers", type=int, default=1, help="The server's --workers.")
    parser.add_argument("--json", type=Path, default=None, help="Append one JSON line per measurement here.")
    args = parser.parse_args()

    texts, source = read_texts(args.texts)
    bodies = [json.dumps({"text": t}, ensure_ascii=False).encode("utf-8") for t in texts]
    levels = [int(c) for c in args.clients.split(",")]
    modes = args.modes.split(",")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load average {' '.join(load)} at the start; texts: {source} "
          f"({len(texts)}, {sum(map(len, texts)) / len(texts):.1f} characters on average), one per request; "
          f"server --threads {args.threads} --workers {args.workers}; medians of {args.rounds} rounds\n")
    print("| model | micro-batching | clients | requests/s (range) | chars/s | p50 ms | p99 ms | texts per batch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    for model in args.model:
        servers = {}
        try:
            for mode in modes:  # all started at once, measured in turns: each sees the same machine
                options = ["--threads", str(args.threads), "--workers", str(args.workers), *MODES[mode]]
                log = logs / f"bench_serve_{os.getpid()}_{mode}.log"
                servers[mode] = (*start_server(model, options, log), log)
                asyncio.run(_load(servers[mode][1], bodies, 4, 40, 60))  # warm-up
            results: dict[tuple[str, int], list[dict]] = {}
            for round_ in range(args.rounds):
                for clients in levels:
                    for mode in modes:
                        row = measure(servers[mode][1], texts, bodies, clients, args.requests, args.seconds)
                        results.setdefault((mode, clients), []).append(row)
                        if args.json:
                            with open(args.json, "a", encoding="utf-8") as out:
                                out.write(json.dumps({"model": model, "batching": mode, "round": round_, **row}) + "\n")
            for mode in modes:
                for clients in levels:
                    rows = results[(mode, clients)]
                    med = {k: statistics.median(r[k] for r in rows) for k in ("requests_per_s", "chars_per_s", "p50_ms", "p99_ms")}
                    per_batch = [r["texts_per_batch"] for r in rows if r["texts_per_batch"] is not None]
                    shown = f"{statistics.median(per_batch):.1f}" if args.workers == 1 and per_batch else "-"
                    rates = [r["requests_per_s"] for r in rows]
                    print(f"| {model} | {mode} | {clients} | {med['requests_per_s']:.0f} ({min(rates):.0f}-{max(rates):.0f}) | "
                          f"{med['chars_per_s']:,.0f} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} | {shown} |", flush=True)
        finally:
            for mode, (process, _, log) in servers.items():
                code = stop_server(process)
                if code != 0:
                    print(f"the server ({mode}) exited {code}:\n{log.read_text()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
