"""Plans from what zoo index records, on the shipped registry: how fast, and how close to a meta measurement.

1. `zoo search EXPR --fits SPEC` as a fresh process (`python -m zoo.cli`), median of --repeats runs beside a bare
   interpreter; target < 1 s. It plans every matching row from its plan_shapes and plan_activations columns.
2. `zoo plan` of Llama-3.1-405B (FSDP over 8 H100, training at seq 4096) as a fresh process and in this process;
   target < 3 s. Before the fits were recorded it built the model and measured it on meta: 17.5 s.
3. The recorded fit against zoo.estimate measured now, for --sample models drawn from the registry (seeded) in every
   recorded mode, at sizes away from the fitted points: the relative error of the activations (inputs included) the
   plan uses, max and median per mode. The step is measured without its optimizer, as the plan's activations are.

Run:  .venv/bin/python bench/plan_recorded.py [--repeats 7] [--sample 24] [--json]
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEARCH = ("params<7e9", "H100 train batch=8 seq=4096 fsdp=8 devices=8")
BIG = "hf/meta-llama/Llama-3.1-405B"
BIG_PLAN = dict(hardware="H100", training=True, fsdp=8, devices=8, seq_len=4096)
VISION_SIZES = [(3, None), (24, None), (200, None)]
TOKEN_SIZES = [(1, 40), (3, 500), (12, 1000), (2, 3000)]


def process_seconds(args: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True, cwd=ROOT)
        times.append(time.perf_counter() - t)
        if proc.returncode:
            raise SystemExit(f"zoo {' '.join(args)} exited {proc.returncode}: {proc.stderr[-400:]}")
    return statistics.median(times)


def accuracy(sample: int) -> dict:
    import zoo
    from zoo.planning import RECORDED_MODES, PlanOptions, estimate_options, recorded_activations, row_seq

    rows = zoo.search("scan_status=ok and kind=architecture", fields=["name", "plan_activations"])
    names = sorted(r["name"] for r in rows if all(isinstance(v, list) for v in (r["plan_activations"] or {}).values()))
    picked = random.Random(0).sample(names, min(sample, len(names)))
    errors: dict[str, list[float]] = {mode: [] for mode in RECORDED_MODES}
    worst: dict[str, tuple] = {}
    for name in picked:
        info, module = zoo.info(name), zoo.get(name)
        for mode, options in RECORDED_MODES.items():
            o = PlanOptions(hardware=1, **options).checked()
            act = recorded_activations(info, o)
            if act is None:
                continue
            for batch, seq in TOKEN_SIZES if row_seq(info) else VISION_SIZES:
                try:
                    e = zoo.estimate(module, batch=batch, seq_len=seq, **estimate_options(o))
                except Exception as ex:  # noqa: BLE001 - a size past the model's positions: reported, not fatal
                    print(f"  {name} {mode} ({batch}, {seq}): {type(ex).__name__}", file=sys.stderr)
                    continue
                real = e.activations + e.inputs
                err = abs(act.at(batch, seq) - real) / max(real, 1)
                errors[mode].append(err)
                if err >= worst.get(mode, (0,))[0]:
                    worst[mode] = (err, name, batch, seq)
        print(f"  {name}", file=sys.stderr)
    return {
        mode: {
            "points": len(v),
            "models": len(picked),
            "median_error": statistics.median(v) if v else None,
            "max_error": max(v) if v else None,
            "within_1pct": sum(x <= 0.01 for x in v) / len(v) if v else None,
            "worst": worst.get(mode),
        }
        for mode, v in errors.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sample", type=int, default=24, help="models for the accuracy check (0: skip it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    bare = statistics.median(subprocess_time([sys.executable, "-c", "pass"]) for _ in range(args.repeats))
    search = process_seconds(["search", SEARCH[0], "--fits", SEARCH[1], "--limit", "0"], args.repeats)
    flags = ["--hardware", "H100", "--training", "--fsdp", "8", "--devices", "8", "--seq-len", "4096"]
    big_process = process_seconds(["plan", BIG, *flags], 3)
    import zoo

    t = time.perf_counter()
    p = zoo.plan(BIG, **BIG_PLAN)
    big_here = time.perf_counter() - t
    found = zoo.search(SEARCH[0], fits=SEARCH[1], fields=["name"])
    result = {
        "search_fits_process_s": search,
        "bare_interpreter_s": bare,
        "search_rows_fitting": len(found),
        "search_rows_matching": len(zoo.search(SEARCH[0], fields=["name"])),
        "plan_405b_process_s": big_process,
        "plan_405b_in_process_s": big_here,
        "plan_405b_max_batch": p.max_batch,
        "accuracy": accuracy(args.sample) if args.sample else None,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f'zoo search "{SEARCH[0]}" --fits "{SEARCH[1]}" (process, median of {args.repeats}):')
    print(f"  {search * 1e3:.0f} ms (bare interpreter {bare * 1e3:.0f} ms); target < 1000 ms")
    print(f"  {result['search_rows_fitting']} of {result['search_rows_matching']} matching rows fit")
    print(f"zoo plan {BIG} {' '.join(flags)}:")
    print(f"  process {big_process * 1e3:.0f} ms (median of 3), in process {big_here * 1e3:.0f} ms; target < 3000 ms")
    print(f"  max_batch {p.max_batch}, per device {p.per_device['total'] / 2**30:.1f} GiB at batch {p.batch}")
    for mode, a in (result["accuracy"] or {}).items():
        if a["points"]:
            print(
                f"recorded fit vs meta now, {mode}: {a['points']} sizes of {a['models']} models, median error "
                f"{a['median_error']:.2%}, max {a['max_error']:.2%} ({a['worst'][1]} at {a['worst'][2:]}), "
                f"{a['within_1pct']:.0%} within 1%"
            )
    return 0


def subprocess_time(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True)
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
