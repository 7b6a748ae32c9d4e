"""Indexing the whole zoo with `zoo index installed -j 2` vs building timm models the plain way (eager, with init).

Measures, in one run:

* zoo: `zoo index installed -j 2 -q --json` (every timm and torchvision architecture and pretrained variant,
  one process; `--families timm,torchvision,timm+pretrained,torchvision+pretrained` runs the same zoo as
  four commands) as a subprocess into a fresh temp registry: wall time, models/s, how many builds reused an
  analysis (zoo.structure), the failures it reports, and the seconds per stage for architectures and
  variants. The sum over the commands is the whole-zoo time (target: under 150 s with -j 2).
* plain: a serial eager build WITH init, `timm.create_model(name)` on CPU (no meta), of a seeded
  random sample of K timm models (default 40), each after gc.collect(), timed with perf_counter;
  the mean per model times the number of timm models is the extrapolated whole-timm time, and
  plain/zoo is that over zoo's timm index wall time.

Memory guard: a sampled model whose fp32 weights would exceed --max-gb (default a quarter of
the available memory) is not built eagerly (a 7B model needs 28 GB); its time is estimated
from its parameter count at the median seconds-per-parameter of the models that were built,
and the count of such models is printed. Parameter counts come from a meta build, untimed.
Numbers only, no assertions.

Run:  .venv/bin/python bench/index_zoo.py [--jobs 2] [--sample 40] [--seed 0] [--families timm,torchvision]
          [--max-gb G] [--repeat N] [--keep] [--json]
`--sample 0` skips the plain side. Wall time on a shared machine varies by a quarter between runs: `--repeat 3`
reports the median run, and every run's wall and CPU seconds (zoo index and its workers).
"""

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

TARGET_S = 150.0


def available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 16.0


def zoo_command() -> list[str]:
    script = Path(sys.executable).parent / "zoo"
    return [str(script)] if script.exists() else [sys.executable, "-m", "zoo.cli"]


def index_family(registry: Path, family: str, jobs: int, log) -> dict:
    """family: a family name, or NAME+pretrained for its pretrained variants (after its architectures)."""
    name, _, pretrained = family.partition("+")
    cmd = [
        *zoo_command(),
        "--registry",
        str(registry),
        "index",
        name,
        "-j",
        str(jobs),
        "-q",
        "--json",
        *(["--pretrained"] if pretrained else []),
    ]
    log(f"  $ {' '.join(cmd)}")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("ZOO_REGISTRY", None)
    t, cpu = time.perf_counter(), _children_cpu_s()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t, _children_cpu_s() - cpu
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        out = {"indexed": 0, "unchanged": 0, "failed": {}}
        log(f"  WARNING: no JSON from zoo index {family} (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    n = out["indexed"] + out["unchanged"] + len(out["failed"])
    timings = out.get("timings", {})  # per built model: build_s, analysis_s, save_s (in the workers)
    stages = {k: sorted(t.get(k, 0.0) for t in timings.values()) for k in ("build_s", "analysis_s", "save_s")}
    parts = {}  # architectures and variants apart (`zoo index installed` does both in one run)
    for name, t in timings.items():
        part = parts.setdefault(
            "variants" if "." in name.partition("/")[2] else "architectures",
            {"models": 0, "build_reused": 0, "analysis_reused": 0, "build_s": 0.0, "analysis_s": 0.0, "save_s": 0.0},
        )
        part["models"] += 1
        part["build_reused"] += bool(t.get("build_reused"))
        part["analysis_reused"] += bool(t.get("analysis_reused"))
        for k in ("build_s", "analysis_s", "save_s"):
            part[k] += t.get(k, 0.0)
    return {
        "stage_sum_s": {k: sum(v) for k, v in stages.items()},
        "parts": parts,
        "stage_median_s": {k: v[len(v) // 2] if v else 0.0 for k, v in stages.items()},
        "slowest": sorted(
            ((sum(v for k, v in t.items() if k.endswith("_s")), name) for name, t in timings.items()), reverse=True
        )[:5],
        "analysis_reused": sum(bool(t.get("analysis_reused")) for t in timings.values()),
        "family": family,
        "wall_s": wall,
        "cpu_s": cpu,
        "rc": proc.returncode,
        "models": n,
        "indexed": out["indexed"],
        "unchanged": out["unchanged"],
        "failed": len(out["failed"]),
        "failed_names": sorted(out["failed"]),
        "models_per_s": n / wall if wall else 0.0,
    }


def _children_cpu_s() -> float:
    """CPU seconds of the finished child processes (zoo index and its workers): the work, apart from how busy the
    machine was (wall time on a shared machine varies by a quarter from one run to the next)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plain_sample(k: int, seed: int, max_gb: float, log) -> dict:
    import timm
    import torch

    names = timm.list_models()
    sample = random.Random(seed).sample(names, min(k, len(names)))
    built, skipped, failed = [], [], []
    for i, name in enumerate(sample):
        try:
            with torch.device("meta"):  # untimed: the parameter count, for the memory guard
                params = sum(p.numel() for p in timm.create_model(name).parameters())
        except Exception as e:
            failed.append({"model": name, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        if params * 4 / 2**30 > max_gb:
            skipped.append({"model": name, "params": params})
            log(f"  [{i + 1}/{len(sample)}] {name}: {params / 1e9:.1f}B params, over --max-gb {max_gb:.1f}: estimated")
            continue
        gc.collect()
        try:
            t = time.perf_counter()
            m = timm.create_model(name)
            s = time.perf_counter() - t
        except Exception as e:
            failed.append({"model": name, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        m = None  # noqa: F841 - frees the model before the next build
        built.append({"model": name, "params": params, "s": s})
        log(f"  [{i + 1}/{len(sample)}] {name}: {s:.2f} s ({params / 1e6:.1f}M params)")
    rate = statistics.median(b["s"] / b["params"] for b in built if b["params"]) if built else 0.0
    for sk in skipped:
        sk["s_estimated"] = sk["params"] * rate
    times = [b["s"] for b in built] + [sk["s_estimated"] for sk in skipped]
    mean = statistics.fmean(times) if times else 0.0
    return {
        "timm_models": len(names),
        "sample": len(sample),
        "seed": seed,
        "built": built,
        "skipped": skipped,
        "failed": failed,
        "mean_s": mean,
        "mean_built_only_s": statistics.fmean(b["s"] for b in built) if built else 0.0,
        "median_s": statistics.median(times) if times else 0.0,
        "extrapolated_s": mean * len(names),
        "measured_s": sum(b["s"] for b in built),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", "-j", type=int, default=2, help="zoo index worker processes (default 2)")
    ap.add_argument("--sample", type=int, default=40, help="timm models to build eagerly (default 40; 0: skip)")
    ap.add_argument("--seed", type=int, default=0, help="sample seed (default 0)")
    ap.add_argument(
        "--families",
        default="installed",
        help="families to index in order, one `zoo index` each; NAME+pretrained: its pretrained variants; "
        "installed: the whole zoo, architectures and variants of timm and torchvision in one run "
        "(the default; timm,torchvision,timm+pretrained,torchvision+pretrained is the same zoo in "
        "four runs)",
    )
    ap.add_argument(
        "--max-gb",
        type=float,
        default=None,
        help="largest fp32 model to build eagerly, GB (default: a quarter of available memory)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="index the zoo this many times, each into a fresh registry; the median run is reported",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temp registry")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    max_gb = args.max_gb if args.max_gb is not None else available_gb() / 4

    warnings.simplefilter("ignore")
    tmp = Path(tempfile.mkdtemp(prefix="zoo_bench_index_"))
    registry = tmp / "registry.db"
    result = {"jobs": args.jobs, "families": families, "registry": str(registry), "cpus": os.cpu_count()}
    try:
        runs = []
        for i in range(max(1, args.repeat)):
            run_registry = registry if i == 0 else tmp / f"registry-{i}.db"
            log(f"zoo index into fresh {run_registry} (-j {args.jobs})")
            runs.append([index_family(run_registry, f, args.jobs, log) for f in families])
        totals = [sum(r["wall_s"] for r in run) for run in runs]
        result["zoo_runs_s"] = totals
        result["zoo_runs_cpu_s"] = [sum(r["cpu_s"] for r in run) for run in runs]
        result["zoo"] = runs[sorted(range(len(runs)), key=totals.__getitem__)[len(runs) // 2]]  # the median run
        result["zoo_total_s"] = sum(r["wall_s"] for r in result["zoo"])
        result["zoo_total_models"] = sum(r["models"] for r in result["zoo"])
        result["registry_bytes"] = sum(p.stat().st_size for p in tmp.glob("registry.db*"))  # the first run's
        if args.sample > 0:
            log(f"plain: eager timm.create_model with init, {args.sample} sampled models (seed {args.seed}), serial")
            result["plain"] = plain_sample(args.sample, args.seed, max_gb, log)
    finally:
        if args.keep:
            log(f"kept {registry}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    result["target_s"] = TARGET_S
    result["meets_target"] = result["zoo_total_s"] < TARGET_S
    # plain builds timm's architectures only: against `installed`, zoo's side also holds torchvision and every
    # variant, so the ratio understates zoo's lead there
    zt = next((r for r in result["zoo"] if r["family"] in ("timm", "installed")), None)
    if "plain" in result and zt:
        result["ratio_plain_over_zoo_timm"] = result["plain"]["extrapolated_s"] / zt["wall_s"]
    if args.json:
        print(json.dumps(result, indent=1))
        return 0

    print(f"\nzoo index, fresh registry, -j {args.jobs} ({os.cpu_count()} CPUs)")
    rows = [["family", "models", "indexed", "failed", "analysis reused", "wall s", "models/s"]]
    for r in result["zoo"]:
        rows.append(
            [
                r["family"],
                str(r["models"]),
                str(r["indexed"]),
                str(r["failed"]),
                str(r["analysis_reused"]),
                f"{r['wall_s']:.1f}",
                f"{r['models_per_s']:.1f}",
            ]
        )
    rows.append(
        [
            "whole zoo",
            str(result["zoo_total_models"]),
            "",
            "",
            "",
            f"{result['zoo_total_s']:.1f}",
            f"{result['zoo_total_models'] / result['zoo_total_s']:.1f}",
        ]
    )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for r in result["zoo"]:
        if r["failed"]:
            print(f"  {r['family']} failed: {', '.join(r['failed_names'][:10])}{' ...' if r['failed'] > 10 else ''}")
    for r in result["zoo"]:
        for part, t in sorted(r["parts"].items()):
            print(
                f"  {r['family']} {part}: {t['models']} models, build reused {t['build_reused']}, analysis reused "
                f"{t['analysis_reused']}; summed over "
                f"workers: build {t['build_s']:.0f} s, analysis {t['analysis_s']:.0f} s, save {t['save_s']:.0f} s"
            )
        st, med = r["stage_sum_s"], r["stage_median_s"]
        print(
            f"  {r['family']} per model (summed over workers): "
            + ", ".join(f"{k[:-2]} {st[k]:.0f} s (median {med[k] * 1e3:.0f} ms)" for k in st)
            + "; slowest: "
            + ", ".join(f"{n} {s:.1f} s" for s, n in r["slowest"][:3])
        )
    print(f"registry size: {result['registry_bytes'] / 2**20:.1f} MiB")
    print(
        "runs: "
        + ", ".join(f"{w:.1f} s wall, {c:.0f} CPU s" for w, c in zip(result["zoo_runs_s"], result["zoo_runs_cpu_s"]))
        + (" (the median one above)" if len(result["zoo_runs_s"]) > 1 else "")
    )
    if "plain" in result:
        p = result["plain"]
        print(
            f"\nplain: serial eager timm.create_model (init, CPU, {p['torch_threads']} torch threads), "
            f"{p['sample']} models sampled with seed {p['seed']}"
        )
        print(
            f"  built {len(p['built'])} in {p['measured_s']:.1f} s; mean {p['mean_s']:.2f} s/model "
            f"(built only {p['mean_built_only_s']:.2f}), median {p['median_s']:.2f} s"
        )
        if p["skipped"]:
            print(
                f"  {len(p['skipped'])} over --max-gb {max_gb:.1f}, time estimated from params: "
                + ", ".join(f"{s['model']} ~{s['s_estimated']:.1f} s" for s in p["skipped"])
            )
        if p["failed"]:
            print(f"  {len(p['failed'])} failed to build: " + ", ".join(f["model"] for f in p["failed"]))
        slow = sorted(p["built"], key=lambda b: -b["s"])[:3]
        print("  slowest: " + ", ".join(f"{b['model']} {b['s']:.1f} s" for b in slow))
        print(
            f"  extrapolated to all {p['timm_models']} timm models: {p['extrapolated_s']:.0f} s "
            f"({p['extrapolated_s'] / 60:.1f} min)"
        )
        if zt:
            print(
                f"ratio plain/zoo ({zt['family']}): {result['ratio_plain_over_zoo_timm']:.1f}x "
                f"({p['extrapolated_s']:.0f} s extrapolated vs {zt['wall_s']:.1f} s)"
            )
    print(
        f"target: whole zoo under {TARGET_S:.0f} s with -j {args.jobs} -> "
        f"{'met' if result['meets_target'] else 'NOT met'} ({result['zoo_total_s']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
