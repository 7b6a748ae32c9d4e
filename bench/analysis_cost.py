"""What zoo's analysis costs at index time, and how zoo.estimate compares with a real training step.

1. Index time: for a seeded sample of timm models and every torchvision model, the time of the
   meta build as the indexer records it (build, inspect, describe) and the extra time of
   zoo.analysis.analyze on the same module (a FLOP-counted eval forward and a training forward).
   Prints the median extra seconds per model, its ratio to the build, and the slowest models.
2. Memory: zoo.estimate (meta, training step with AdamW, fp32) against one real forward + backward +
   optimizer step on CPU for three small models, measured three ways: PyTorch's MemTracker (live
   tensor bytes, plus the input batch), zoo's LiveBytes tracker on the real tensors, and the growth
   of the process's peak RSS (VmHWM after a reset, in a fresh subprocess: includes allocator and kernel
   workspace overhead that no tensor count sees). Also what `accelerate estimate-memory` reports
   (it counts parameters only: weights, and 4x weights for training with Adam).

Run: .venv/bin/python bench/analysis_cost.py [--sample 40] [--batch 8] [--skip-index] [--json]
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODELS = [("timm", "resnet18"), ("timm", "vit_tiny_patch16_224"), ("torchvision", "mobilenet_v3_small")]


def index_cost(sample: int, seed: int) -> dict:
    import timm
    import torch
    from torchvision.models import list_models

    from zoo.analysis import analyze
    from zoo.build import build_meta
    from zoo.families import family
    from zoo.inspection import inspect_module
    from zoo.recipe import Recipe

    torch.set_num_threads(1)
    names = [("timm", b) for b in random.Random(seed).sample(timm.list_models(), sample)]
    names += [("torchvision", b) for b in list_models()]
    rows = []
    for fam_name, builder in names:
        fam = family(fam_name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            module = build_meta(Recipe(fam_name, builder))
            inspect_module(module)
            described = fam.describe(builder, module)
            built = time.perf_counter() - start
            start = time.perf_counter()
            result = analyze(module, described.get("input"))
            extra = time.perf_counter() - start
        rows.append({"name": f"{fam_name}/{builder}", "build_s": built, "analysis_s": extra, "status": result.status})
        del module
    out = {}
    for label, subset in (
        ("timm", [r for r in rows if r["name"].startswith("timm/")]),
        ("torchvision", [r for r in rows if r["name"].startswith("torchvision/")]),
        ("all", rows),
    ):
        out[label] = {
            "models": len(subset),
            "median_build_s": statistics.median(r["build_s"] for r in subset),
            "median_analysis_s": statistics.median(r["analysis_s"] for r in subset),
            "p90_analysis_s": statistics.quantiles([r["analysis_s"] for r in subset], n=10)[-1],
            "total_analysis_s": sum(r["analysis_s"] for r in subset),
            "analysed_ok": sum(r["status"] == "ok" for r in subset),
        }
    out["slowest"] = sorted(rows, key=lambda r: -r["analysis_s"])[:5]
    return out


_RSS_CHILD = r"""
import json, sys, torch, warnings
warnings.simplefilter("ignore")
torch.set_num_threads(1)
from zoo.analysis import loss_of, make_optimizer
from zoo.build import build_real
from zoo.recipe import Recipe
fam, builder, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
model = build_real(Recipe(fam, builder), "cpu").train()
x = torch.rand(batch, 3, 224, 224)
opt = make_optimizer("adamw", model.parameters())
def status(key):  # kB in /proc/self/status; VmHWM is this address space's peak RSS
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) * 1024
open("/proc/self/clear_refs", "w").write("5")  # reset the peak to the current RSS (ru_maxrss survives exec)
base = status("VmRSS")
for _ in range(3):
    loss = loss_of(model(x)); loss.backward(); del loss; opt.step(); opt.zero_grad(set_to_none=True)
print(json.dumps({"rss_growth": status("VmHWM") - base}))
"""


def memory(batch: int) -> list[dict]:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from zoo.analysis import estimate, loss_of, make_optimizer, measure_step
    from zoo.build import build_meta, build_real
    from zoo.recipe import Recipe
    from zoo.state import ZooState, set_state

    torch.set_num_threads(1)
    rows = []
    for fam, builder in MODELS:
        recipe = Recipe(fam, builder)
        meta = build_meta(recipe)
        set_state(meta, ZooState(recipe))  # what zoo.get attaches: estimate reads the input spec through it
        start = time.perf_counter()
        got = estimate(meta, batch=batch, dtype="fp32", training=True, optimizer="adamw")
        estimate_s = time.perf_counter() - start

        torch.manual_seed(0)
        real = build_real(recipe, "cpu").train()
        x = torch.rand(batch, 3, 224, 224)
        opt = make_optimizer("adamw", real.parameters())
        for p in real.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(real, opt)
        start = time.perf_counter()
        with warnings.catch_warnings(), tracker:
            warnings.simplefilter("ignore")
            loss = loss_of(real(x))
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        step_s = time.perf_counter() - start
        memtracker = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] + x.numel() * x.element_size()
        live = measure_step(build_real(recipe, "cpu"), [x], {}, True, "adamw")["total"]
        child = subprocess.run(
            [sys.executable, "-c", _RSS_CHILD, fam, builder, str(batch)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )
        rss_growth = json.loads(child.stdout.strip().splitlines()[-1])["rss_growth"] if child.returncode == 0 else None
        if rss_growth is None:
            print(f"RSS child for {fam}/{builder} failed: {child.stderr[-500:]}", file=sys.stderr)
        # RSS grows by what the steps allocate: everything but the weights and the batch, built before.
        steps_bytes = got.total - got.weights - got.inputs
        param_bytes = sum(p.numel() * p.element_size() for p in meta.parameters())
        rows.append(
            {
                "model": f"{fam}/{builder}",
                "batch": batch,
                "estimate": got.as_dict(),
                "estimate_s": estimate_s,
                "real_step_s": step_s,
                "memtracker_peak": memtracker,
                "livebytes_peak": live,
                "ratio_estimate_to_memtracker": got.total / memtracker,
                "ratio_estimate_to_livebytes": got.total / live,
                "rss_growth": rss_growth,
                "estimated_step_bytes": steps_bytes,
                "ratio_estimate_to_rss_growth": steps_bytes / rss_growth if rss_growth else None,
                "accelerate_style_training": 4 * param_bytes,  # accelerate estimate-memory: Adam training = 4 x size
                "ratio_accelerate_to_memtracker": 4 * param_bytes / memtracker,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sample", type=int, default=40, help="timm models sampled for the index-time cost")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--batch", type=int, default=8, help="batch for the memory comparison")
    p.add_argument("--skip-index", action="store_true", help="only the memory comparison")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = {"memory": memory(args.batch)}
    if not args.skip_index:
        result["index"] = index_cost(args.sample, args.seed)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    mib = 2**20
    print(f"zoo.estimate (meta) vs a real training step on CPU: fp32, AdamW, batch {args.batch}")
    print(
        f"{'model':34s} {'estimate':>10s} {'MemTracker':>10s} {'ratio':>6s} {'LiveBytes':>10s} {'ratio':>6s} "
        f"{'RSS growth':>10s} {'est.':>8s} {'ratio':>6s} {'accelerate':>10s} {'ratio':>6s}"
    )
    for r in result["memory"]:
        rss = f"{r['rss_growth'] / mib:8.1f}Mi" if r["rss_growth"] else "-"
        rss_ratio = f"{r['ratio_estimate_to_rss_growth']:6.2f}" if r["rss_growth"] else "-"
        print(
            f"{r['model']:34s} {r['estimate']['total'] / mib:8.1f}Mi {r['memtracker_peak'] / mib:8.1f}Mi "
            f"{r['ratio_estimate_to_memtracker']:6.3f} {r['livebytes_peak'] / mib:8.1f}Mi "
            f"{r['ratio_estimate_to_livebytes']:6.3f} {rss:>10s} {r['estimated_step_bytes'] / mib:6.1f}Mi "
            f"{rss_ratio:>6s} {r['accelerate_style_training'] / mib:8.1f}Mi {r['ratio_accelerate_to_memtracker']:6.3f}"
        )
    if "index" in result:
        print("\nextra index time per model from the analysis (single thread)")
        for label in ("timm", "torchvision", "all"):
            s = result["index"][label]
            print(
                f"  {label:12s} {s['models']:4d} models: median build {s['median_build_s']:.3f} s, median analysis "
                f"{s['median_analysis_s']:.3f} s (p90 {s['p90_analysis_s']:.3f} s), {s['analysed_ok']} analysed ok"
            )
        print("  slowest: " + ", ".join(f"{r['name']} {r['analysis_s']:.1f} s" for r in result["index"]["slowest"]))


if __name__ == "__main__":
    main()
