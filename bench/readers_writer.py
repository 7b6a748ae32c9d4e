"""Reader latency while one writer writes: 16 reader processes against SQLite and PostgreSQL, side by side.

For each backend, a fresh registry holding `user/flip` (tests.builders:tied_net), then, all at once: one
writer process re-indexing `user/flip` --writes times (alternating its size, so each write changes the row
and its tensor table), and --readers reader processes looping over search ("family=user", limit 100),
info(tensors=True) and, in every fourth reader, get (a meta build; torch is imported only there), until the
writer is done (tests/readers.py). Each reader checks every info against its tensor table (a torn read) and
counts errors. PostgreSQL: a server started the way the tests start one (tests/pg.py). Prints p50 and p99
per operation and backend over every reader's calls, errors and torn reads (both must be 0), and the
writer's writes per second. Numbers only; the machine's other load shows in them.

Run:  .venv/bin/python bench/readers_writer.py [--readers 16] [--writes 20] [--no-pg] [--json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pct(xs, q):
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def run_backend(url: str, readers: int, writes: int, tmp: Path) -> dict:
    import zoo

    zoo.connect(url).index_builder("tests.builders:tied_net", "flip", {"dim": 8})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ZOO_TRUSTED_MODULES": "tests"}
    done = tmp / f"done-{os.urandom(4).hex()}"

    def start(*args):
        return subprocess.Popen(
            [sys.executable, "-m", "tests.readers", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    procs = [start("reader", url, str(done), *(["get"] if i % 4 == 0 else [])) for i in range(readers)]
    writer = start("writer", url, str(writes), str(done))
    out = {"latencies": {}, "errors": 0, "torn": 0, "samples": []}
    w_out, w_err = writer.communicate(timeout=1800)
    if writer.returncode != 0:
        raise SystemExit(f"writer failed: {w_err[-2000:]}")
    out["writer"] = json.loads(w_out)
    for p in procs:
        r_out, r_err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"reader failed: {r_err[-2000:]}")
        r = json.loads(r_out)
        for op, times in r["latencies"].items():
            out["latencies"].setdefault(op, []).extend(times)
        out["errors"] += r["error_count"]
        out["torn"] += r["torn_count"]
        out["samples"] += r["errors"] + r["torn"]
    out["stats"] = {
        op: {"calls": len(t), "p50_ms": pct(t, 50) * 1e3, "p99_ms": pct(t, 99) * 1e3}
        for op, t in out.pop("latencies").items()
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--writes", type=int, default=20, help="re-indexes by the writer (default 20)")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    sys.path.insert(0, str(ROOT))
    os.environ["ZOO_TRUSTED_MODULES"] = "tests"
    tmp = Path(tempfile.mkdtemp(prefix="zoo_bench_readers_"))
    result = {"readers": args.readers, "writes": args.writes, "backends": {}}
    log(f"SQLite: {args.readers} readers, 1 writer")
    result["backends"]["sqlite"] = run_backend(f"sqlite:///{tmp / 'registry.db'}", args.readers, args.writes, tmp)
    if not args.no_pg:
        from tests import pg

        try:
            server = pg.start()
        except Exception as e:
            log(f"PostgreSQL: not measured, the server could not start ({e})")
        else:
            try:
                log(f"PostgreSQL: {args.readers} readers, 1 writer")
                result["backends"]["postgresql"] = run_backend(server.fresh(), args.readers, args.writes, tmp)
            finally:
                server.stop()
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"\n{args.readers} reader processes (get in every fourth) while 1 writer re-indexes a model "
        f"{args.writes} times; latency per call, ms"
    )
    rows = [["backend", "op", "calls", "p50", "p99", "errors", "torn reads", "writes/s"]]
    for b, r in result["backends"].items():
        for op, st in r["stats"].items():
            rows.append(
                [
                    b,
                    op,
                    str(st["calls"]),
                    f"{st['p50_ms']:.1f}",
                    f"{st['p99_ms']:.1f}",
                    str(r["errors"]),
                    str(r["torn"]),
                    f"{r['writer']['writes'] / r['writer']['seconds']:.2f}",
                ]
            )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for b, r in result["backends"].items():
        for s in r["samples"][:3]:
            print(f"  {b}: {s.strip()[-300:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
