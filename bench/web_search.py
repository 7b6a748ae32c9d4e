"""The web catalog's search page on the shipped registry (about 1,500 models): server-side time per request.

Serves zoo.web.app on 127.0.0.1 in this process, requests each URL 2 times to warm up and then 20 times,
and prints the median (p50) and p90 of the time the app itself took (its Server-Timing header: search,
facets, plot points, JSON and HTML) beside the wall time seen by the client, and the response size (gzipped).

Run: .venv/bin/python bench/web_search.py [--registry registry.db] [-n 20]
"""

import argparse
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

URLS = [
    "/",
    "/?q=" + urllib.parse.quote("params<1e8 and family=timm") + "&sort=-params",
    "/?q=" + urllib.parse.quote("name~'*vit*'") + "&sort=flops&page=2",
    "/api/search?q=" + urllib.parse.quote("flops<5G") + "&sort=-params",
]


def main() -> None:
    import uvicorn

    from zoo.web.app import create_app

    p = argparse.ArgumentParser()
    p.add_argument("--registry", default=str(ROOT / "registry.db"))
    p.add_argument("-n", type=int, default=20)
    args = p.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(args.registry), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    print(f"{args.registry}: p50 / p90 of {args.n} requests (server-side, then wall time at the client)")
    for url in URLS:
        app_ms, wall_ms = [], []
        for i in range(args.n + 2):
            start = time.perf_counter()
            request = urllib.request.Request(base + url, headers={"Accept-Encoding": "gzip"})  # as browsers ask
            with urllib.request.urlopen(request) as r:
                size = len(r.read())
                timing = float(r.headers["Server-Timing"].split("dur=")[1])
            if i >= 2:
                app_ms.append(timing)
                wall_ms.append((time.perf_counter() - start) * 1000)
        q = lambda xs, f: statistics.quantiles(xs, n=10)[8] if f == 90 else statistics.median(xs)  # noqa: E731 - a one-line helper
        print(
            f"  {url[:70]:70s} server {q(app_ms, 50):6.1f} / {q(app_ms, 90):6.1f} ms   "
            f"wall {q(wall_ms, 50):6.1f} / {q(wall_ms, 90):6.1f} ms   {size / 1024:6.0f} KiB"
        )
    server.should_exit = True


if __name__ == "__main__":
    main()
