"""Readers while one writer writes, as separate processes (tests/test_concurrency.py, bench/readers_writer.py).

`python -m tests.readers writer URL WRITES DONE`: re-indexes `user/flip` (tests.builders:tied_net) WRITES times,
alternating dim 4 and 8, so that each write changes the row and its tensor table together; then creates the
file DONE. `python -m tests.readers reader URL DONE [get]`: search, info with tensors (and get) in a loop until
DONE exists; prints JSON: latencies per operation, errors, and torn reads (a row and its tensor table that
disagree, or a model the row says built without its table).
"""

import json
import sys
import time
import traceback
from pathlib import Path

NAME = "user/flip"


def torn(info) -> str | None:
    """Why a row and its tensor table disagree (None: they agree)."""
    if info.status != "ok":
        return None
    table = info.tensor_table
    if table is None:
        return "no tensor table"
    own = [t for t in table if t.tied_to is None]
    if (
        info.tensors != len(own)
        or info.bytes != sum(t.bytes for t in own)
        or info.params != sum(t.numel for t in own if t.kind == "parameter")
    ):
        return f"row says {info.params} params in {info.tensors} tensors; its table {len(own)} tensors"
    return None


def writer(url: str, writes: int, done: str) -> dict:
    import zoo

    registry, t = zoo.connect(url), time.perf_counter()
    try:
        for i in range(writes):
            registry.index_builder("tests.builders:tied_net", "flip", {"dim": 4 if i % 2 else 8}, force=True)
    finally:
        Path(done).touch()
    return {"writes": writes, "seconds": time.perf_counter() - t}


def reader(url: str, done: str, with_get: bool) -> dict:
    import zoo

    registry, end = zoo.connect(url), time.monotonic() + 600  # a writer that never finishes: stop anyway
    latencies: dict[str, list[float]] = {"search": [], "info": []} | ({"get": []} if with_get else {})
    errors, torn_reads = [], []
    while not Path(done).exists() and time.monotonic() < end:
        for op in latencies:
            t = time.perf_counter()
            try:
                if op == "search":
                    found = registry.search("family=user", limit=100)
                    if NAME not in {i.name for i in found}:
                        torn_reads.append("search: the model is missing")
                elif op == "info":
                    why = torn(registry.info(NAME, tensors=True))
                    if why:
                        torn_reads.append(f"info: {why}")
                else:
                    registry.get(NAME)
            except Exception:
                errors.append(f"{op}: {traceback.format_exc(limit=3)}")
            latencies[op].append(time.perf_counter() - t)
    calls = {op: len(times) for op, times in latencies.items()}
    for times in latencies.values():  # the first call imports (torch, for get): not what a warm reader waits
        del times[:1]
    return {
        "calls": calls,
        "latencies": latencies,
        "errors": errors[:5],
        "error_count": len(errors),
        "torn": torn_reads[:5],
        "torn_count": len(torn_reads),
    }


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    out = (
        writer(url, int(sys.argv[3]), sys.argv[4])
        if role == "writer"
        else reader(url, sys.argv[3], "get" in sys.argv[4:])
    )
    print(json.dumps(out))
