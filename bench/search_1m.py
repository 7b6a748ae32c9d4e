"""Search latency at 1,000,000 models, every query shape, SQLite and PostgreSQL side by side from one run.

Builds a temp SQLite registry through zoo's own schema (zoo.registry.db.upgrade, i.e. the alembic migrations,
with every index they create, 0005's included) and bulk-inserts N synthetic rows (SQLAlchemy Core executemany,
50k a chunk, one transaction). Values: params log-uniform in 1e5..1e12, bytes = 4 * params, flops
log-uniform in 1e6..1e13 (independent of params), family among timm/torchvision/hf/user, task among a handful
or NULL, names f"{family}/model_{i:07d}". PostgreSQL (unless --no-pg): a server started the way the tests
start one (tests/pg.py: initdb in a temp dir, 127.0.0.1, an ICU database), the schema through the same
migrations, the same rows loaded with COPY, then `zoo db compact` (VACUUM ANALYZE, what autovacuum does on a
team server) and a CHECKPOINT. SQLite gets no ANALYZE (zoo never runs it) unless --analyze.

Then times `Zoo(url).search(...)`, the full public path (the CLI's: parse + SQL + ModelInfo rows), at
limit 100, the CLI's default (`zoo search` prints the first 100; the Python API returns every match unless
given a limit):

  range/params     params>1e9 and params<2e9, order_by="params"      range + sort by a numeric field
  range/name       the same, default order (by name)                 range + default sort
  glob             name~'*model_00001*'                               glob (trigram index)
  family+range     family=hf and params<7e9 (half the table matches)  extra
  range/-flops     params range, order_by="-flops"                     extra: sort by another, independent field
  range/-bytes     params range, order_by="-bytes"                     extra: sort by a field that runs with params
  glob-prefix*     name~'hf/model_00001*'                              extra
  family           family=timm (a quarter of the table, by name)       extra
  glob-dense       name~'*model_0*' (every name matches)               extra
  range/+params    flops<1e9, order_by="params" (43% match)             extra: ascending sort by another field
  glob-family*     name~'timm/*' (a quarter, contiguous in name order)  extra

p50 and p99 over --runs runs (default 100) after 3 warm-ups each; the rows of both backends are compared.
Target: p50 < 20 ms and p99 < 100 ms for every shape on both backends; the plan of any shape that misses is
printed (SQLite: EXPLAIN QUERY PLAN of each statement the search ran; PostgreSQL: EXPLAIN ANALYZE of its
search statement). Numbers only. The machine's other load shows in the numbers (p99 most).

Run:  .venv/bin/python bench/search_1m.py [--n 1000000] [--runs 100] [--keep] [--db PATH] [--no-pg] [--analyze]
          [--explain] [--json]
`--n 20000` for a quick try (about 4 min and 1.5 GB of temp disk at full size). --db PATH builds into (or,
if it already holds rows, reuses) that SQLite file.
"""

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_P50_MS, TARGET_P99_MS = 20.0, 100.0
LIMIT = 100  # the CLI's default --limit
CHUNK = 50_000
QUERIES = [  # (key, expression, order_by)
    ("range/params", "params>1e9 and params<2e9", "params"),
    ("range/name", "params>1e9 and params<2e9", None),
    ("glob", "name~'*model_00001*'", None),
    ("family+range", "family=hf and params<7e9", None),
    ("range/-flops", "params>1e9 and params<2e9", "-flops"),
    ("range/-bytes", "params>1e9 and params<2e9", "-bytes"),
    ("glob-prefix*", "name~'hf/model_00001*'", None),
    ("family", "family=timm", None),
    ("glob-dense", "name~'*model_0*'", None),
    ("range/+params", "flops<1e9", "params"),
    ("glob-family*", "name~'timm/*'", None),
]
FAMILIES = ["hf", "timm", "user", "torchvision"]
FAMILY_P = [0.55, 0.25, 0.15, 0.05]
TASKS = [
    "image-classification",
    "text-generation",
    "feature-extraction",
    "fill-mask",
    "object-detection",
    "image-segmentation",
    None,
]
TASK_P = [0.3, 0.25, 0.12, 0.08, 0.08, 0.07, 0.10]
ARCHS = {
    "hf": [
        "transformers.LlamaForCausalLM",
        "transformers.BertModel",
        "transformers.ViTModel",
        "transformers.GPT2LMHeadModel",
    ],
    "timm": [
        "timm.models.resnet.ResNet",
        "timm.models.vision_transformer.VisionTransformer",
        "timm.models.convnext.ConvNeXt",
    ],
    "user": ["mypkg.nets.Net", "lab.models.UNet"],
    "torchvision": ["torchvision.models.resnet.ResNet", "torchvision.models.detection.faster_rcnn.FasterRCNN"],
}


def pct(xs, q):
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def synth_rows(n: int, seed: int = 0):
    """Chunks of row dicts for insert(Model)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base = datetime(2025, 1, 1)
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        params = np.floor(10 ** rng.uniform(5, 12, m)).astype(np.int64)
        flops = np.floor(10 ** rng.uniform(6, 13, m)).astype(np.int64)
        fams = rng.choice(len(FAMILIES), m, p=FAMILY_P)
        tasks = rng.choice(len(TASKS), m, p=TASK_P)
        archs = rng.integers(0, 1 << 30, m)
        buffers = (params // rng.integers(200, 5000, m)).astype(np.int64)
        tensors = (np.log2(params) * rng.uniform(5, 40, m)).astype(np.int64)
        secs = rng.integers(0, 300 * 86400, m)
        hashes = rng.integers(0, 1 << 63, (m, 4), dtype=np.int64)
        rows = []
        for j in range(m):
            i = start + j
            fam = FAMILIES[fams[j]]
            p = int(params[j])
            short = f"model_{i:07d}"
            b = int(buffers[j])
            rows.append(
                dict(
                    name=f"{fam}/{short}",
                    short=short,
                    family=fam,
                    builder=short,
                    kwargs="{}",
                    arch=ARCHS[fam][archs[j] % len(ARCHS[fam])],
                    task=TASKS[tasks[j]],
                    input_size="[3, 224, 224]" if fam in ("timm", "torchvision") else None,
                    versions='{"torch": "2.10.0"}',
                    dtype="float32",
                    params=p,
                    trainable=p,
                    buffers=b,
                    tensors=int(tensors[j]),
                    param_bytes=4 * p,
                    buffer_bytes=4 * b,
                    bytes=4 * p,
                    flops=int(flops[j]),
                    status="ok",
                    error=None,
                    source_hash="".join(f"{int(h) & (2**64 - 1):016x}" for h in hashes[j]),
                    indexed_at=base + timedelta(seconds=int(secs[j])),
                    kind="architecture",
                    arch_name=f"{fam}/{short}",
                )
            )
        yield rows


def build_sqlite(url: str, n: int) -> float:
    from sqlalchemy import create_engine, insert, text

    from zoo.registry import db
    from zoo.registry.tables import Model

    t = time.perf_counter()
    db.upgrade(url)
    eng = create_engine(url)
    with eng.begin() as conn:
        for rows in synth_rows(n):
            conn.execute(insert(Model), rows)
    with eng.connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    eng.dispose()
    return time.perf_counter() - t


def build_postgresql(server, n: int) -> tuple[str, float]:
    """The same rows into a fresh database of a server started as tests/pg.py starts one, loaded with COPY."""
    import psycopg

    from zoo import Zoo
    from zoo.registry import db

    url = server.fresh()
    t = time.perf_counter()
    db.upgrade(url)
    with (
        psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname=url.rsplit("/", 1)[1]) as conn,
        conn.cursor() as cur,
    ):
        columns = None
        for rows in synth_rows(n):
            columns = columns or list(rows[0])
            with cur.copy(f"COPY models ({', '.join(columns)}) FROM STDIN") as copy:
                for r in rows:
                    copy.write_row([r[c] for c in columns])
        conn.commit()
    Zoo(url).compact()  # VACUUM (ANALYZE): the statistics autovacuum keeps on a server
    with psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", autocommit=True) as conn:
        # a server's steady state, not the minutes after a bulk load: the load's dirty pages (a GB with the
        # indexes) written out now, not by the checkpointer while the queries are timed (+5-10 ms each)
        conn.execute("CHECKPOINT")
    return url, time.perf_counter() - t


def time_queries(url: str, runs: int, log) -> dict:
    from zoo import Zoo

    zoo = Zoo(url)
    out = {}
    for key, expr, order_by in QUERIES:
        for _ in range(3):
            found = zoo.search(expr, order_by=order_by, limit=LIMIT)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            zoo.search(expr, order_by=order_by, limit=LIMIT)
            times.append(time.perf_counter() - t)
        out[key] = {
            "p50_ms": pct(times, 50) * 1e3,
            "p99_ms": pct(times, 99) * 1e3,
            "rows": len(found),
            "names": [i.name for i in found],
        }
        log(f"  {key}: p50 {out[key]['p50_ms']:.1f} ms, p99 {out[key]['p99_ms']:.1f} ms")
    return out


def missed(r: dict) -> bool:
    return r["p50_ms"] >= TARGET_P50_MS or r["p99_ms"] >= TARGET_P99_MS


def statements(url: str, key: str) -> list[tuple[str, object]]:
    """The SQL one search of a shape runs: each sqlite3 statement (zoo.registry.lite), or SQLAlchemy's."""
    from zoo import Zoo

    expr, order_by = next((e, o) for k, e, o in QUERIES if k == key)
    seen: list[tuple[str, object]] = []
    if url.startswith("sqlite"):
        from zoo.registry import lite

        connect = lite.connect_read

        def traced(*a, **k):
            con = connect(*a, **k)
            con.set_trace_callback(lambda sql: seen.append((sql, None)))
            return con

        lite.connect_read = traced
        try:
            Zoo(url).search(expr, order_by=order_by, limit=LIMIT)
        finally:
            lite.connect_read = connect
        return [(sql, None) for sql, _ in seen if sql.lstrip().upper().startswith("SELECT")]
    from sqlalchemy import event

    from zoo.registry import db

    def before(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement, parameters))

    event.listen(db.engine(url), "before_cursor_execute", before)
    try:
        Zoo(url).search(expr, order_by=order_by, limit=LIMIT)
    finally:
        event.remove(db.engine(url), "before_cursor_execute", before)
    return [(sql, p) for sql, p in seen if sql.lstrip().upper().startswith("SELECT")]


def plans_of_misses(url: str, timed: dict) -> dict:
    """The plan of each shape that missed the target on this backend."""
    out = {}
    for key, r in timed.items():
        if not missed(r):
            continue
        if url.startswith("sqlite"):
            import sqlite3

            con = sqlite3.connect(url.removeprefix("sqlite:///"))
            lines = []
            for sql, _ in statements(url, key):  # the trace shows each statement with its values in place
                if "EXPLAIN" in sql or "PRAGMA" in sql:
                    continue
                lines.append(sql[:160] + ("..." if len(sql) > 160 else ""))
                lines += ["    " + row[3] for row in con.execute("EXPLAIN QUERY PLAN " + sql)]
            con.close()
        else:
            from zoo.registry import db

            found = statements(url, key)
            sql, params = found[-1]  # the search itself; seeks and the like come before it
            with db.engine(url).connect() as conn:
                raw = conn.connection.dbapi_connection
                with raw.cursor() as cur:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                    lines = [sql[:160] + "...", *(row[0] for row in cur.fetchall())]
        out[key] = lines
    return out


def explain_sqlite(path: Path) -> dict:
    """SQLite's plan for each query as zoo.registry.lite runs it (the probe aside)."""
    import sqlite3

    from zoo.registry.where import compile_where, order_sql

    con = sqlite3.connect(path)
    plans = {}
    for key, expr, order_by in QUERIES:
        where, params = compile_where(expr)
        order, _, _ = order_sql(order_by)
        sql = f"SELECT models.id FROM models WHERE {where} ORDER BY {order} LIMIT ?"
        plans[key] = [r[3] for r in con.execute("EXPLAIN QUERY PLAN " + sql, [*params, LIMIT])]
    con.close()
    return plans


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="synthetic models (default 1,000,000)")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per query and backend (default 100)")
    ap.add_argument("--db", help="SQLite file to build into, or to reuse if it already holds models")
    ap.add_argument("--keep", action="store_true", help="keep the SQLite file")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument("--analyze", action="store_true", help="run ANALYZE on SQLite after the build (zoo never does)")
    ap.add_argument("--explain", action="store_true", help="print SQLite's plan for each query")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    sys.path.insert(0, str(ROOT))  # tests/pg.py starts the server

    path = Path(args.db).resolve() if args.db else Path(tempfile.mkdtemp(prefix="zoo_bench_1m_")) / "registry.db"
    url = f"sqlite:///{path}"
    result = {"n": args.n, "limit": LIMIT, "runs": args.runs, "backends": {}}
    server = None
    try:
        if path.exists():
            import sqlite3

            con = sqlite3.connect(path)
            result["n"] = con.execute("SELECT count(*) FROM models").fetchone()[0]
            con.close()
            log(f"reusing {path} ({result['n']:,} models)")
        else:
            log(f"SQLite: building {args.n:,} synthetic models in {path} ...")
            result["sqlite_build_s"] = build_sqlite(url, args.n)
        if args.analyze:
            import sqlite3

            con = sqlite3.connect(path)
            con.execute("ANALYZE")
            con.commit()
            con.close()
        log("SQLite: timing")
        result["backends"]["sqlite"] = time_queries(url, args.runs, log)
        result["missed_plans"] = {"sqlite": plans_of_misses(url, result["backends"]["sqlite"])}
        if args.explain:
            result["sqlite_plans"] = explain_sqlite(path)
        if not args.no_pg:
            from tests import pg

            try:
                server = pg.start()
            except Exception as e:  # no server binaries here: say so, keep the SQLite numbers
                log(f"PostgreSQL: not measured, the server could not start ({e})")
            else:
                log(f"PostgreSQL: loading {result['n']:,} models ...")
                pg_url, result["pg_build_s"] = build_postgresql(server, result["n"])
                log("PostgreSQL: timing")
                result["backends"]["postgresql"] = time_queries(pg_url, args.runs, log)
                result["missed_plans"]["postgresql"] = plans_of_misses(pg_url, result["backends"]["postgresql"])
    finally:
        if server is not None:
            server.stop()
        if not args.keep and not args.db:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            try:
                path.parent.rmdir()
            except OSError:
                pass

    backends = result["backends"]
    if len(backends) == 2:
        result["same_rows"] = {
            k: backends["sqlite"][k]["names"] == backends["postgresql"][k]["names"] for k, _, _ in QUERIES
        }
    result["met"] = {b: not any(missed(q) for q in r.values()) for b, r in backends.items()}
    if args.json:
        for r in backends.values():
            for q in r.values():
                q.pop("names")
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"\nZoo(url).search at {result['n']:,} models, limit {LIMIT} (the CLI's default), {args.runs} runs "
        f"after 3 warm-ups; ms"
    )
    rows = [
        [
            "query",
            "expression",
            "order",
            *(f"{b} {s}" for b in backends for s in ("p50", "p99")),
            *(["same rows"] if "same_rows" in result else []),
        ]
    ]
    for key, expr, order_by in QUERIES:
        rows.append(
            [
                key,
                expr,
                order_by or "name",
                *(f"{backends[b][key][s]:.1f}" for b in backends for s in ("p50_ms", "p99_ms")),
                *([str(result["same_rows"][key])] if "same_rows" in result else []),
            ]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for b, met in result["met"].items():
        print(
            f"target (every shape): p50 < {TARGET_P50_MS:.0f} ms and p99 < {TARGET_P99_MS:.0f} ms on {b} -> "
            f"{'met' if met else 'NOT met'}"
        )
    for b, plans in result.get("missed_plans", {}).items():
        for key, lines in plans.items():
            print(f"{b} plan of [{key}], which missed:")
            print("\n".join("  " + line for line in lines))
    for key, plan in result.get("sqlite_plans", {}).items():
        print(f"SQLite plan [{key}]: " + "; ".join(plan))
    if args.keep:
        print(f"kept {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
