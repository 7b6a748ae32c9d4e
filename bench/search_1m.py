"""Search latency on a synthetic registry of 1,000,000 models (zoo's schema, SQLite).

Builds a temp SQLite registry through zoo's own schema (zoo.registry.db.upgrade, i.e. the alembic
migrations, with every index they create) and bulk-inserts N synthetic rows with SQLAlchemy Core
`insert(Model)` executemany, 50k rows a chunk, all in one transaction. Values: params log-uniform
in 1e5..1e12, bytes = 4 * params, family among timm/torchvision/hf/user, task among a handful or
NULL, names f"{family}/model_{i:07d}", status "ok". No ANALYZE is run (zoo never runs it), unless
--analyze.

Then times `Zoo(url).search(...)`, the full public path (parse + compile + SQL + ModelInfo rows), for:

  range/params   params>1e9 and params<2e9, order_by="params", limit 100   (target: p50 < 20 ms)
  range/name     the same, default order (by name), limit 100
  family+range   family=hf and params<7e9, limit 100
  glob           name~'*model_00001*', limit 100
  glob-prefix*   name~'hf/model_00001*', limit 100 (an extra row: a prefix glob, which an index could serve)
  all-rows       params>9e11, limit=None (every match as a ModelInfo)

p50 and p95 over 50 runs after 3 warm-ups each, plus the p50 of the same SQL run raw on the
DBAPI cursor (fetchall only), which splits the time between SQLite and zoo's Python. The plain
alternative is that raw SQL: what a hand-written query costs without zoo's layers. For each query
slower than the target, EXPLAIN QUERY PLAN of the exact statement zoo ran is printed (--explain:
for all). Numbers only, no assertions.

Run:  .venv/bin/python bench/search_1m.py [--n 1000000] [--runs 50] [--keep] [--db PATH] [--analyze]
          [--explain] [--json]
`--n 20000` for a quick try. The temp file is deleted at the end unless --keep; --db PATH builds
into (or, if it already holds rows, reuses) that file instead of a temp one.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

TARGET_MS = 20.0
CHUNK = 50_000
QUERIES = [  # (key, expression, order_by, limit)
    ("range/params", "params>1e9 and params<2e9", "params", 100),
    ("range/name", "params>1e9 and params<2e9", None, 100),
    ("family+range", "family=hf and params<7e9", None, 100),
    ("glob", "name~'*model_00001*'", None, 100),
    ("glob-prefix*", "name~'hf/model_00001*'", None, 100),  # extra: a prefix glob, which a B-tree could serve
    ("all-rows", "params>9e11", None, None),
]
FAMILIES = ["hf", "timm", "user", "torchvision"]
FAMILY_P = [0.55, 0.25, 0.15, 0.05]
TASKS = ["image-classification", "text-generation", "feature-extraction", "fill-mask", "object-detection",
         "image-segmentation", None]
TASK_P = [0.3, 0.25, 0.12, 0.08, 0.08, 0.07, 0.10]
ARCHS = {
    "hf": ["transformers.LlamaForCausalLM", "transformers.BertModel", "transformers.ViTModel", "transformers.GPT2LMHeadModel"],
    "timm": ["timm.models.resnet.ResNet", "timm.models.vision_transformer.VisionTransformer", "timm.models.convnext.ConvNeXt"],
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
            rows.append(dict(
                name=f"{fam}/{short}", short=short, family=fam, builder=short, kwargs="{}",
                arch=ARCHS[fam][archs[j] % len(ARCHS[fam])], task=TASKS[tasks[j]],
                input_size="[3, 224, 224]" if fam in ("timm", "torchvision") else None,
                versions='{"torch": "2.10.0"}', dtype="float32", params=p, trainable=p, buffers=b,
                tensors=int(tensors[j]), param_bytes=4 * p, buffer_bytes=4 * b, bytes=4 * p,
                status="ok", error=None, source_hash="".join(f"{int(h) & (2**64 - 1):016x}" for h in hashes[j]),
                indexed_at=base + timedelta(seconds=int(secs[j])),
            ))
        yield rows


def build(url: str, n: int) -> dict:
    from sqlalchemy import create_engine, insert, text

    from zoo.registry import db
    from zoo.registry.tables import Model

    t0 = time.perf_counter()
    db.upgrade(url)
    t1 = time.perf_counter()
    eng = create_engine(url)
    gen_s = 0.0
    with eng.begin() as conn:
        chunks = synth_rows(n)
        while True:
            g = time.perf_counter()
            rows = next(chunks, None)
            gen_s += time.perf_counter() - g
            if rows is None:
                break
            conn.execute(insert(Model), rows)
    t2 = time.perf_counter()
    with eng.connect() as conn:
        conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    eng.dispose()
    t3 = time.perf_counter()
    return {"schema_s": t1 - t0, "insert_s": t2 - t1, "of_which_generate_s": gen_s, "checkpoint_s": t3 - t2,
            "build_s": t3 - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="synthetic models (default 1,000,000)")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per query (default 50)")
    ap.add_argument("--raw-runs", type=int, default=20, help="timed runs of the raw SQL per query (default 20)")
    ap.add_argument("--db", help="SQLite file to build into, or to reuse if it already holds models")
    ap.add_argument("--keep", action="store_true", help="keep the registry file")
    ap.add_argument("--analyze", action="store_true", help="run ANALYZE after the build (zoo itself never does)")
    ap.add_argument("--explain", action="store_true", help="print EXPLAIN QUERY PLAN for every query, not only slow ones")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print

    import sqlalchemy  # noqa: F401  (imported before timing)
    from sqlalchemy import event

    from zoo import Zoo
    from zoo.registry import db

    path = Path(args.db).resolve() if args.db else Path(tempfile.mkdtemp(prefix="zoo_bench_1m_")) / "registry.db"
    url = f"sqlite:///{path}"
    result = {"n": args.n, "path": str(path)}
    reuse = False
    if path.exists():
        import sqlite3

        con = sqlite3.connect(path)
        try:
            have = con.execute("SELECT count(*) FROM models").fetchone()[0]
        except sqlite3.Error:
            have = 0
        con.close()
        reuse = have > 0
        if reuse:
            result["n"] = have
            log(f"reusing {path} ({have:,} models)")
    try:
        if not reuse:
            log(f"building {args.n:,} synthetic models in {path} ...")
            result["build"] = build(url, args.n)
        if args.analyze:
            import sqlite3

            con = sqlite3.connect(path)
            t = time.perf_counter()
            con.execute("ANALYZE")
            con.commit()
            con.close()
            result["analyze_s"] = time.perf_counter() - t
        result["file_bytes"] = path.stat().st_size
        result["analyzed"] = args.analyze

        zoo = Zoo(url)
        eng = db.open_registry(zoo.url)  # the engine zoo's searches run on
        captured = []
        event.listen(eng, "before_cursor_execute", lambda conn, cur, stmt, params, ctx, many: captured.append((stmt, params)))

        queries = []
        for key, expr, order_by, limit in QUERIES:
            for _ in range(3):
                zoo.search(expr, order_by=order_by, limit=limit)
            captured.clear()
            found = zoo.search(expr, order_by=order_by, limit=limit)
            stmt, params = captured[-1]
            times = []
            for _ in range(args.runs):
                t = time.perf_counter()
                zoo.search(expr, order_by=order_by, limit=limit)
                times.append(time.perf_counter() - t)
            raw = eng.raw_connection()  # plain: the same SQL on the DBAPI cursor, no ORM, no ModelInfo
            try:
                cur = raw.cursor()
                raw_times = []
                for _ in range(args.raw_runs + 1):
                    t = time.perf_counter()
                    cur.execute(stmt, params)
                    cur.fetchall()
                    raw_times.append(time.perf_counter() - t)
                raw_times = raw_times[1:]
                plan = [r[3] for r in cur.execute("EXPLAIN QUERY PLAN " + stmt, params).fetchall()]
                raw.rollback()
            finally:
                raw.close()
            queries.append({
                "key": key, "expr": expr, "order_by": order_by, "limit": limit, "rows": len(found),
                "p50_ms": pct(times, 50) * 1e3, "p95_ms": pct(times, 95) * 1e3, "min_ms": min(times) * 1e3,
                "raw_sql_p50_ms": statistics.median(raw_times) * 1e3, "sql": " ".join(stmt.split()),
                "params": list(params), "plan": plan,
            })
            log(f"  {key}: p50 {queries[-1]['p50_ms']:.1f} ms")
        result["queries"] = queries
        rng = next(q for q in queries if q["key"] == "range/params")
        result["target"] = {"query": "range/params", "p50_ms": rng["p50_ms"], "target_p50_ms": TARGET_MS,
                            "met": rng["p50_ms"] < TARGET_MS}
    finally:
        if not args.keep:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            if not args.db:
                try:
                    path.parent.rmdir()
                except OSError:
                    pass
        result["kept"] = args.keep

    if args.json:
        print(json.dumps(result, indent=1))
        return 0

    print(f"\nsynthetic registry: {result['n']:,} models, {result['file_bytes'] / 2**20:.0f} MiB"
          f"{' (ANALYZEd)' if args.analyze else ' (no ANALYZE)'}")
    if "build" in result:
        b = result["build"]
        print(f"build: {b['build_s']:.1f} s (schema {b['schema_s']:.2f} s, insert {b['insert_s']:.1f} s of which "
              f"generating rows {b['of_which_generate_s']:.1f} s, WAL checkpoint {b['checkpoint_s']:.1f} s)")
    print(f"Zoo(url).search latency over {args.runs} runs (after 3 warm-ups); raw = the same SQL on the DBAPI "
          f"cursor, median of {args.raw_runs}")
    rows = [["query", "expression", "order", "limit", "rows", "p50 ms", "p95 ms", "raw SQL p50 ms", "zoo/raw"]]
    for q in queries:
        rows.append([q["key"], q["expr"], q["order_by"] or "name", str(q["limit"]), str(q["rows"]),
                     f"{q['p50_ms']:.1f}", f"{q['p95_ms']:.1f}", f"{q['raw_sql_p50_ms']:.1f}",
                     f"{q['p50_ms'] / q['raw_sql_p50_ms']:.1f}x" if q["raw_sql_p50_ms"] else "-"])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    t = result["target"]
    print(f"target: range/params p50 < {TARGET_MS:.0f} ms -> {'met' if t['met'] else 'NOT met'} ({t['p50_ms']:.1f} ms)")
    for q in queries:
        if args.explain or q["p50_ms"] >= TARGET_MS:
            print(f"\nEXPLAIN QUERY PLAN [{q['key']}] (p50 {q['p50_ms']:.1f} ms, raw SQL {q['raw_sql_p50_ms']:.1f} ms)")
            print(f"  sql: {q['sql'][q['sql'].find('FROM'):]}   params: {q['params']}")
            for line in q["plan"]:
                print(f"  {line}")
    if args.keep:
        print(f"\nkept {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
