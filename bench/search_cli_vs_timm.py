"""Wall time of a fresh `zoo search` CLI process vs a fresh `python -c "import timm; timm.list_models(...)"`.

Measures, as fresh subprocesses in one run:

* zoo via `python -m zoo.cli --registry R search EXPR --limit 0`
* zoo via the installed console script (`zoo` beside sys.executable, e.g. .venv/bin/zoo), if present
* plain: `python -c "import timm; timm.list_models('vit_*')"`

Each command runs once untimed (warms the page cache), then 5 timed times (--repeats), the commands
interleaved round-robin so they share the machine's noise; the median of each is reported with
the ratio plain/zoo (target: >= 20x). Afterwards, untimed, the names each side returns are
compared: zoo's table rows (family prefix "timm/" stripped) against timm.list_models(PATTERN);
a WARNING line is printed if the sets differ. Numbers only, no assertions.

EXPR defaults to "name~'timm/vit_*' and kind=architecture", the exact equivalent of timm's list: a
registry name carries its family prefix ("timm/vit_base..."), and the registry also holds a row per
pretrained variant ("timm/vit_base_patch16_224.augreg_in21k"), which timm.list_models leaves to
list_pretrained. A bare "name~'vit_*'" also returns those variants and other families' vit_* models
(torchvision's); the name check reports them.

Run:  .venv/bin/python bench/search_cli_vs_timm.py [--registry PATH_OR_URL] [--expr EXPR] [--pattern 'vit_*']
          [--repeats 5] [--json]
The registry defaults to $ZOO_REGISTRY, else the shipped registry.db at the repository root.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 20.0
SHIPPED = Path(__file__).resolve().parent.parent / "registry.db"


def run(cmd, env) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - t, proc


def table_names(stdout: str) -> list[str]:
    """First column of `zoo search`'s table, header dropped."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("name"):
        return []
    return [ln.split()[0] for ln in lines[1:]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--registry",
        default=os.environ.get("ZOO_REGISTRY", "").strip() or str(SHIPPED),
        help="registry path or SQLAlchemy URL (default: $ZOO_REGISTRY or the shipped registry.db)",
    )
    ap.add_argument(
        "--expr", default="name~'timm/vit_*' and kind=architecture", help="zoo search expression (default: %(default)s)"
    )
    ap.add_argument("--pattern", default="vit_*", help="timm.list_models pattern (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each command (default 5)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()

    env = {k: v for k, v in os.environ.items() if k != "ZOO_REGISTRY"}  # --registry says it all
    env["PYTHONWARNINGS"] = "ignore"
    search_args = ["--registry", args.registry, "search", args.expr, "--limit", "0"]
    commands = {"zoo (python -m zoo.cli)": [sys.executable, "-m", "zoo.cli", *search_args]}
    script = Path(sys.executable).parent / "zoo"
    script = script if script.exists() else (Path(shutil.which("zoo")) if shutil.which("zoo") else None)
    if script is not None:
        commands[f"zoo ({script})"] = [str(script), *search_args]
    plain_key = "plain (import timm; list_models)"
    commands[plain_key] = [sys.executable, "-c", f"import timm; timm.list_models({args.pattern!r})"]

    times = {k: [] for k in commands}
    outputs = {}
    for k, cmd in commands.items():  # untimed warm-up: page cache, .pyc files
        _, outputs[k] = run(cmd, env)
    for r in range(args.repeats):
        keys = list(commands)
        keys = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate who goes first
        for k in keys:
            s, proc = run(commands[k], env)
            times[k].append(s)
            if proc.returncode != 0:
                print(f"WARNING: {k} exited {proc.returncode}: {proc.stderr.strip()[-300:]}", file=sys.stderr)

    # Names, untimed: zoo's from the warm-up's table; timm's from a printing twin of the plain command.
    listing = subprocess.run(
        [sys.executable, "-c", f"import json, timm; print(json.dumps(timm.list_models({args.pattern!r})))"],
        capture_output=True,
        text=True,
        env=env,
    )
    timm_names = set(json.loads(listing.stdout))
    checks = {}
    for k in commands:
        if k == plain_key:
            continue
        rows = table_names(outputs[k].stdout)
        zoo_timm = {n.removeprefix("timm/") for n in rows if n.startswith("timm/")}
        checks[k] = {
            "rows": len(rows),
            "timm_rows": len(zoo_timm),
            "other_family_rows": len(rows) - len(zoo_timm),
            "missing_from_zoo": sorted(timm_names - zoo_timm),
            "extra_in_zoo": sorted(zoo_timm - timm_names),
            "same_set": zoo_timm == timm_names,
        }

    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "registry": args.registry,
        "expr": args.expr,
        "pattern": args.pattern,
        "repeats": args.repeats,
        "median_s": med,
        "min_s": {k: min(v) for k, v in times.items()},
        "runs_s": times,
        "ratio_plain_over_zoo": {k: med[plain_key] / med[k] for k in commands if k != plain_key},
        "timm_names": len(timm_names),
        "name_check": checks,
        "target_ratio": TARGET,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0

    print(f"fresh-process wall time, median of {args.repeats} interleaved runs (registry {args.registry})")
    print(f"zoo: search {args.expr!r} --limit 0    plain: timm.list_models({args.pattern!r})")
    rows = [["command", "median ms", "min ms", "rows", "plain/zoo"]]
    for k in commands:
        n = str(checks[k]["rows"]) if k in checks else str(len(timm_names))
        ratio = "-" if k == plain_key else f"{result['ratio_plain_over_zoo'][k]:.1f}x"
        rows.append([k, f"{med[k] * 1e3:.0f}", f"{min(times[k]) * 1e3:.0f}", n, ratio])
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for k, c in checks.items():
        if not c["same_set"]:
            print(
                f"WARNING: {k} returned {c['timm_rows']} timm names, timm.list_models returned {len(timm_names)} "
                f"({len(c['missing_from_zoo'])} missing from zoo, e.g. {c['missing_from_zoo'][:3]}; "
                f"{len(c['extra_in_zoo'])} only in zoo, e.g. {c['extra_in_zoo'][:3]})"
            )
            if c["rows"] == 0 and args.expr.replace(" ", "").startswith("name~") and "/" not in args.expr:
                print(
                    f"         (names carry their family prefix, 'timm/...': try --expr \"name~'timm/{args.pattern}'\")"
                )
        if c["other_family_rows"]:
            print(f"note: {k} also returned {c['other_family_rows']} rows of other families (not in timm's list)")
    best = max(result["ratio_plain_over_zoo"].values())
    worst = min(result["ratio_plain_over_zoo"].values())
    print(
        f"target: plain/zoo >= {TARGET:.0f}x -> {'met' if worst >= TARGET else 'NOT met'} "
        f"({worst:.1f}x .. {best:.1f}x over the zoo variants)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
