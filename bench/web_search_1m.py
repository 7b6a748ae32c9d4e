"""The web catalog's search API at 1,000,000 models: `/api/search` end to end over HTTP, every shape of search_1m.py.

The registry is search_1m.py's (the same synthetic rows, built the same way, or reused with --db); the app is the
real one (zoo.web.app.create_app) served by uvicorn on 127.0.0.1 in a thread of this process, asked by a client
in this process: each shape's `/api/search?q=EXPR&sort=ORDER` 3 times to warm up, then --runs times, p50 and p99
of the wall time at the client (request to last byte, gzip asked for as browsers do), the app's own time (its
Server-Timing header) and the response size. Beside it, `Zoo(url).search(EXPR, order_by=ORDER, limit=100)` in
this process (the plain call the page is built on) and the ratio web/plain. The page reads its first 201 rows
(one page of rows, and the plot's and the facets' sample of a large result), then counts the matches up to
10,001 (SQL alone) where there are more (zoo.web.views.search). SQLite, and PostgreSQL unless --no-pg
(a server started as the tests start one, loaded with COPY, as search_1m.py does).
Target: p50 < 50 ms end to end for every shape, on both backends. Numbers only.

Run:  .venv/bin/python bench/web_search_1m.py [--n 1000000] [--runs 30] [--db PATH] [--no-pg]
`--db PATH` reuses (or builds into) that SQLite file, e.g. one search_1m.py --db built.
"""

import argparse
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import search_1m  # noqa: E402 - beside this script

TARGET_P50_MS = 50.0


def serve(url: str):
    import uvicorn

    from zoo.web.app import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(url), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def time_shapes(url: str, runs: int, log) -> dict:
    plain = search_1m.time_queries(url, runs, lambda *a: None)
    server, base = serve(url)
    out = {}
    try:
        for key, expr, order_by in search_1m.QUERIES:
            query = {"q": expr, **({"sort": order_by} if order_by else {})}
            address = f"{base}/api/search?{urllib.parse.urlencode(query)}"
            wall, app = [], []
            for i in range(runs + 3):
                start = time.perf_counter()
                request = urllib.request.Request(address, headers={"Accept-Encoding": "gzip"})
                with urllib.request.urlopen(request) as r:
                    size = len(r.read())
                    timing = float(r.headers["Server-Timing"].split("dur=")[1])
                if i >= 3:
                    wall.append((time.perf_counter() - start) * 1e3)
                    app.append(timing)
            out[key] = {
                "p50_ms": search_1m.pct(wall, 50),
                "p99_ms": search_1m.pct(wall, 99),
                "app_p50_ms": search_1m.pct(app, 50),
                "bytes": size,
                "plain_p50_ms": plain[key]["p50_ms"],
            }
            log(f"  {key}: p50 {out[key]['p50_ms']:.1f} ms, p99 {out[key]['p99_ms']:.1f} ms")
    finally:
        server.should_exit = True
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="synthetic models (default 1,000,000)")
    ap.add_argument("--runs", type=int, default=30, help="timed requests per shape and backend (default 30)")
    ap.add_argument("--db", help="SQLite file to build into, or to reuse if it exists")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = ap.parse_args()
    log = lambda *a: print(*a, flush=True)  # noqa: E731 - a one-line helper
    path = Path(args.db).resolve() if args.db else Path(tempfile.mkdtemp(prefix="zoo_web_1m_")) / "registry.db"
    url = f"sqlite:///{path}"
    results, server = {}, None
    try:
        if not path.exists():
            log(f"SQLite: building {args.n:,} synthetic models in {path} ...")
            search_1m.build_sqlite(url, args.n)
        import sqlite3

        con = sqlite3.connect(path)
        n = con.execute("SELECT count(*) FROM models").fetchone()[0]
        con.close()
        log(f"SQLite ({n:,} models): timing")
        results["sqlite"] = time_shapes(url, args.runs, log)
        if not args.no_pg:
            from tests import pg

            try:
                server = pg.start()
            except Exception as e:  # no server binaries here: say so, keep the SQLite numbers
                log(f"PostgreSQL: not measured, the server could not start ({e})")
            else:
                log(f"PostgreSQL: loading {n:,} models ...")
                pg_url, _ = search_1m.build_postgresql(server, n)
                log("PostgreSQL: timing")
                results["postgresql"] = time_shapes(pg_url, args.runs, log)
    finally:
        if server is not None:
            server.stop()
        if not args.db:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            path.parent.rmdir()

    print(
        f"\n/api/search over HTTP at {n:,} models, {args.runs} requests after 3 warm-ups; ms "
        "(plain: Zoo.search, limit 100)"
    )
    header = ["query", "order"]
    for b in results:
        header += [f"{b} p50", "p99", "app p50", "KiB", "plain p50", "web/plain"]
    rows = [header]
    for key, _, order_by in search_1m.QUERIES:
        row = [key, order_by or "name"]
        for r in results.values():
            q = r[key]
            row += [
                f"{q['p50_ms']:.1f}",
                f"{q['p99_ms']:.1f}",
                f"{q['app_p50_ms']:.1f}",
                f"{q['bytes'] / 1024:.0f}",
                f"{q['plain_p50_ms']:.1f}",
                f"{q['p50_ms'] / q['plain_p50_ms']:.1f}x",
            ]
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for b, r in results.items():
        met = all(q["p50_ms"] < TARGET_P50_MS for q in r.values())
        print(
            f"target: p50 < {TARGET_P50_MS:.0f} ms end to end for every shape on {b} -> {'met' if met else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
