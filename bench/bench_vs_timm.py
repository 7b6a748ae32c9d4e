"""`zoo bench` against timm's own benchmark.py, in one process (same threads, batch, mode and input size).

timm's benchmark.py is not in the timm package: give the path of a copy outside this repository (a checkout of
huggingface/pytorch-image-models) with --timm-benchmark or $TIMM_BENCHMARK; it is imported from there, never
copied here. Each round runs timm's inference benchmark (fp32, --use-train-size: the model's own input size, as the
registry row records it) and then zoo bench on the same model, in turns, so that a busy machine slows both alike;
the medians and their ratio are printed. zoo's runs are recorded in a scratch copy of the shipped registry (or
--registry), then found again by a search on bench_cpu.

    TIMM_BENCHMARK=/path/to/pytorch-image-models/benchmark.py python bench/bench_vs_timm.py --batch 8
"""

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import zoo

ROOT = Path(__file__).resolve().parent.parent


def load_timm_benchmark(path: str):
    path = Path(path).resolve()
    if ROOT in path.parents:
        sys.exit(f"{path} is inside this repository: run timm's benchmark.py from a copy outside it")
    spec = importlib.util.spec_from_file_location("timm_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timm_run(bench, model: str, batch: int, steps: int, warmup: int) -> dict:
    args = bench.parser.parse_args(
        [
            "--model",
            model,
            "--bench",
            "inference",
            "--device",
            "cpu",
            "-b",
            str(batch),
            "--use-train-size",
            "--num-warm-iter",
            str(warmup),
            "--num-bench-iter",
            str(steps),
            "--precision",
            "float32",
            "--no-retry",
        ]
    )
    result = bench.benchmark(args)
    if "error" in result:
        sys.exit(f"timm's benchmark.py failed on {model}: {result['error']}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--timm-benchmark",
        default=os.environ.get("TIMM_BENCHMARK"),
        help="timm's benchmark.py, outside this repository (default: $TIMM_BENCHMARK)",
    )
    p.add_argument("--models", nargs="+", default=["resnet18", "vit_tiny_patch16_224"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--registry", help="where zoo's runs are recorded (default: a scratch copy of the shipped one)")
    args = p.parse_args()
    if not args.timm_benchmark:
        sys.exit("give timm's benchmark.py: --timm-benchmark PATH or TIMM_BENCHMARK=PATH")
    bench = load_timm_benchmark(args.timm_benchmark)
    scratch = None
    if args.registry is None:
        scratch = tempfile.mkdtemp(prefix="zoo-bench-vs-timm-")
        args.registry = os.path.join(scratch, "registry.db")
        shutil.copy(ROOT / "registry.db", args.registry)
    registry = zoo.connect(args.registry)
    print(
        f"CPU threads {torch.get_num_threads()}, batch {args.batch}, fp32 inference, {args.steps} timed steps "
        f"after {args.warmup}, {args.rounds} rounds (median); torch {torch.__version__}"
    )
    try:
        for model in args.models:
            timm_speeds, zoo_speeds = [], []
            for _ in range(args.rounds):
                t = timm_run(bench, model, args.batch, args.steps, args.warmup)
                timm_speeds.append(t["infer_samples_per_sec"])
                z = zoo.bench(
                    f"timm/{model}", registry=registry, batch=args.batch, steps=args.steps, warmup=args.warmup
                )
                zoo_speeds.append(z["samples_per_s"])
            size = z["inputs"][0]["shape"][-1]
            if size != t["infer_img_size"]:
                sys.exit(f"{model}: zoo ran at {size} px, timm at {t['infer_img_size']} px")
            tm, zm = statistics.median(timm_speeds), statistics.median(zoo_speeds)
            print(
                f"{model:24s} {size} px  timm {tm:8.2f} samples/s  zoo {zm:8.2f} samples/s  zoo/timm {zm / tm:.3f}"
                f"  (timm {', '.join(f'{v:.1f}' for v in timm_speeds)};"
                f" zoo {', '.join(f'{v:.1f}' for v in zoo_speeds)})"
            )
        found = [r["name"] for r in registry.search("bench_cpu>0", fields=("name",))]
        print(f"recorded and searchable (zoo search 'bench_cpu>0'): {', '.join(found)}")
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
