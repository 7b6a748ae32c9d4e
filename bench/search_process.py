"""Wall time of a fresh `zoo search` process against a bare interpreter (`python -c pass`) on the same machine.

A small search of the shipped registry is a few milliseconds of SQL; as a process it was 150-230 ms, 5-8x a bare
interpreter, nearly all of it imports a search never runs. Both commands run as fresh subprocesses, alternating
(bare, zoo, bare, zoo, ...; who goes first alternates per round), once untimed each to warm the page cache and the
.pyc files, then --repeats timed rounds (default 7): the median of each, and the ratio zoo/bare. The runs leave out
PYTHONDONTWRITEBYTECODE, if set here: with it no .pyc is written, and every run compiled zoo's modules from source
(about 25 ms), which an installed zoo (pip writes the .pyc files) never does.

zoo runs as `python -m zoo.cli --registry R search EXPR` from the repository root, so it is this checkout's zoo
(an installed console script may import another copy). Target: zoo/bare <= 2.5x.

Run:  .venv/bin/python bench/search_process.py [--registry PATH_OR_URL] [--expr EXPR] [--repeats 7] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 2.5
ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        print(f"WARNING: {cmd[1:4]} exited {proc.returncode}: {proc.stderr.strip()[-300:]}", file=sys.stderr)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", default=str(ROOT / "registry.db"), help="registry (default: the shipped registry.db)")
    ap.add_argument(
        "--expr", default="name~'timm/vit_*' and kind=architecture", help="the search (default: %(default)s)"
    )
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()

    # --registry says it all; .pyc files as an installed zoo has them (see above)
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_REGISTRY", "PYTHONDONTWRITEBYTECODE")}
    commands = {
        "bare (python -c pass)": [sys.executable, "-c", "pass"],
        "zoo search (python -m zoo.cli)": [sys.executable, "-m", "zoo.cli", "--registry", args.registry, "search"]
        + [args.expr],
    }
    bare, zoo = commands
    for cmd in commands.values():  # untimed: page cache, .pyc files
        timed(cmd, env)
    times: dict[str, list[float]] = {k: [] for k in commands}
    for r in range(args.repeats):
        for k in (bare, zoo) if r % 2 == 0 else (zoo, bare):
            times[k].append(timed(commands[k], env))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med[zoo] / med[bare]
    if args.json:
        print(json.dumps({"expr": args.expr, "median_s": med, "runs_s": times, "ratio": ratio, "target": TARGET}))
        return 0
    print(f"fresh-process wall time, median of {args.repeats} alternating runs; zoo: search {args.expr!r}")
    width = max(map(len, commands))
    print(f"{'command'.ljust(width)}  median ms  min ms")
    for k in commands:
        print(f"{k.ljust(width)}  {med[k] * 1e3:9.1f}  {min(times[k]) * 1e3:6.1f}")
    print(f"zoo/bare: {ratio:.2f}x; target <= {TARGET}x -> {'met' if ratio <= TARGET else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
