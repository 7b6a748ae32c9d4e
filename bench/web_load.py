"""`zoo serve` under load: cheap routes while heavy requests queue, and a slowloris attack.

Starts `zoo serve` (the real CLI, its real settings) on the shipped registry in a child process, then from
this process (asyncio, one connection per request):

1. heavy queue: --clients cheap clients (default 200) loop over narrow searches, model pages and a script for
   --seconds, each pausing --think seconds on average between requests (a person reading a page), while
   --heavy clients (default 60) each ask once, together, for the issue's estimate of Llama-3.1-405B with
   training; prints p50/p99/max of the cheap answers, the heavy answers by status (503: refused past the
   bound, with how fast), and every other status or failure as an error;
2. slowloris: --half-open connections (default 2,000) each send part of a request's headers and then one
   byte a second; then 20 new clients ask /api/search: prints how many were answered and how fast, and how
   many half-open connections the server has closed after its header deadline. Run twice: with the
   server's default file limit, and with 1,024 files (soft and hard: it cannot raise it), where the
   attack holds more connections than the server can open.

Targets: cheap p99 < 1 s, heavy beyond the bound 503 within a second, no errors; every new client answered.
Numbers only; a loaded 2-core machine shows in them.

Run:  .venv/bin/python bench/web_load.py [--clients 200] [--heavy 60] [--seconds 30] [--half-open 2000] [--json]
"""

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A page of a narrow search, model pages, a script: what a reader clicks (a search over the whole registry
# plots every match, 50-130 ms of this process each, and is bench/web_search.py's)
CHEAP = [
    "/api/search?q=name~%27resnet5*%27&per_page=20",
    "/api/search?q=family%3Dtorchvision%20and%20params%3C1e7",
    "/api/models/timm/resnet50",
    "/api/models/torchvision/vit_b_16",
    "/static/search.js",
]
HEAVY = "/api/estimate/hf/meta-llama/Llama-3.1-405B?batch=8&seq_len=8192&training=true"


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, round((len(s) - 1) * q / 100))] if s else float("nan")


async def get(port: int, path: str, timeout: float = 300) -> tuple[int, float]:
    """(HTTP status, seconds) of one GET on a new connection; status 0: no answer (an error)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
        writer.close()
        return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0, time.perf_counter() - start
    except (TimeoutError, OSError):
        return 0, time.perf_counter() - start


def start_server(registry: str, log: Path, files: int | None = None) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))) if files else None
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "serve", "--registry", registry, "--port", str(port)],
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while asyncio.run(get(port, "/api/search", timeout=5))[0] != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"zoo serve did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, port


async def heavy_queue(port: int, clients: int, heavy: int, seconds: float, think: float) -> dict:
    cheap: list[tuple[int, float]] = []
    until = time.monotonic() + seconds

    async def client(i: int):
        rng = random.Random(i)
        await asyncio.sleep(rng.uniform(0, think))
        while time.monotonic() < until:
            cheap.append(await get(port, rng.choice(CHEAP), timeout=60))
            await asyncio.sleep(rng.uniform(0, 2 * think))

    cheap_tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    await asyncio.sleep(min(2.0, seconds / 4))  # the cheap load running, then every heavy request at once
    heavy_answers = await asyncio.gather(*[get(port, HEAVY) for _ in range(heavy)])
    await asyncio.gather(*cheap_tasks)
    ok = [s for code, s in cheap if code == 200]
    refused = [s for code, s in heavy_answers if code == 503]
    done = [s for code, s in heavy_answers if code == 200]
    return {
        "cheap_requests": len(cheap),
        "cheap_p50_s": pct(ok, 50),
        "cheap_p99_s": pct(ok, 99),
        "cheap_max_s": max(ok, default=float("nan")),
        "cheap_errors": len(cheap) - len(ok),
        "heavy_503": len(refused),
        "heavy_503_max_s": max(refused, default=float("nan")),
        "heavy_200": len(done),
        "heavy_200_max_s": max(done, default=float("nan")),
        "heavy_errors": heavy - len(refused) - len(done),
    }


async def slowloris(port: int, half_open: int, new_clients: int = 20) -> dict:
    conns, refused_at_connect = [], 0
    for _ in range(half_open):
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        except (TimeoutError, OSError):
            refused_at_connect += 1
            continue
        writer.write(b"GET /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        conns.append((reader, writer))

    async def trickle():
        while True:
            await asyncio.sleep(1)
            for _, writer in conns:
                if not writer.is_closing():
                    writer.write(b"x")

    dripping = asyncio.create_task(trickle())
    await asyncio.sleep(1)
    answers = await asyncio.gather(*[get(port, CHEAP[0], timeout=60) for _ in range(new_clients)])
    await asyncio.sleep(12)  # past the server's header deadline (10 s)
    for r, _ in conns:  # read what is there, so that at_eof() sees the server's close
        if not r.at_eof():
            try:
                await asyncio.wait_for(r.read(1), 0.001)
            except (TimeoutError, OSError):
                pass
    closed = sum(r.at_eof() for r, _ in conns)
    dripping.cancel()
    for _, writer in conns:
        writer.close()
    served = [s for code, s in answers if code == 200]
    return {
        "half_open": len(conns),
        "refused_at_connect": refused_at_connect,
        "new_clients": new_clients,
        "new_served": len(served),
        "new_max_s": max(served, default=float("nan")),
        "half_open_closed_after_12s": closed,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--registry", default=str(ROOT / "registry.db"))
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--heavy", type=int, default=60)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--think", type=float, default=1.0, help="mean pause of a cheap client between requests")
    p.add_argument("--half-open", type=int, default=2000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.half_open + 4 * args.clients + 256)), hard))
    from zoo.web.app import HEAVY_QUEUE

    results = {}
    with tempfile.TemporaryDirectory(prefix="zoo-web-load-") as tmp:
        proc, port = start_server(args.registry, Path(tmp) / "serve.log")
        try:
            results["heavy_queue"] = asyncio.run(heavy_queue(port, args.clients, args.heavy, args.seconds, args.think))
            results["slowloris"] = asyncio.run(slowloris(port, args.half_open))
        finally:
            proc.terminate()
            proc.wait(30)
        proc, port = start_server(args.registry, Path(tmp) / "serve-1024.log", files=1024)
        try:
            results["slowloris_1024_files"] = asyncio.run(slowloris(port, args.half_open))
        finally:
            proc.terminate()
            proc.wait(30)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    h = results["heavy_queue"]
    print(
        f"heavy queue: {args.clients} cheap clients (mean pause {args.think:g} s) for {args.seconds:g} s, "
        f"{args.heavy} heavy estimates at once (bound: 1 running + {HEAVY_QUEUE} waiting)"
    )
    print(
        f"  cheap: {h['cheap_requests']} requests, p50 {h['cheap_p50_s'] * 1000:.0f} ms, p99 "
        f"{h['cheap_p99_s'] * 1000:.0f} ms, max {h['cheap_max_s'] * 1000:.0f} ms, errors {h['cheap_errors']}"
        f"   (target: p99 < 1000 ms, no errors)"
    )
    print(
        f"  heavy: {h['heavy_503']} refused with 503 (slowest refusal {h['heavy_503_max_s'] * 1000:.0f} ms), "
        f"{h['heavy_200']} answered 200 (last after {h['heavy_200_max_s']:.1f} s), errors {h['heavy_errors']}"
    )
    for key, label in (("slowloris", "default file limit"), ("slowloris_1024_files", "server limited to 1,024 files")):
        s = results[key]
        print(
            f"slowloris, {label}: {s['half_open']} half-open connections ({s['refused_at_connect']} not "
            f"connected); new clients served {s['new_served']}/{s['new_clients']} (slowest "
            f"{s['new_max_s'] * 1000:.0f} ms); half-open closed by the server after 12 s: "
            f"{s['half_open_closed_after_12s']}"
        )


if __name__ == "__main__":
    main()
