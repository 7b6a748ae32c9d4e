"""zoo.get("timm/NAME") vs the plain `with torch.device("meta"): timm.create_model(NAME)`.

Measures, in one process, for a few timm models (resnet50, vit_large_patch16_224, convnext_xxlarge,
swin_large_patch4_window12_384, efficientnet_b7):

* cold: the first call of each for the model (zoo builds its template under forced meta with init
  skipped and checks it against the registry row; plain builds under torch.device("meta")).
  The order of the two cold calls alternates per model (column "first") so neither always
  profits from code paths the other warmed. Opening the registry is timed on its own beforehand.
* warm: after one warm-up of each, the median of N repeats (default 15), zoo and plain
  interleaved (the order alternates per repeat) so both share the machine's noise.

Every timed call is preceded by gc.collect() and timed with time.perf_counter(); torch, timm and
zoo are imported before anything is timed. Prints plain/zoo ratios per model and the median warm
ratio over models (target: >= 5x). Numbers only, no assertions.

Run:  .venv/bin/python bench/get_vs_create_model.py [--registry PATH_OR_URL] [-n 15] [--models a,b] [--json]
The registry defaults to $ZOO_REGISTRY, else the shipped registry.db at the repository root.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

MODELS = ("resnet50", "vit_large_patch16_224", "convnext_xxlarge", "swin_large_patch4_window12_384", "efficientnet_b7")
TARGET_WARM = 5.0
SHIPPED = Path(__file__).resolve().parent.parent / "registry.db"


def timed(fn):
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def nparams(m) -> int:
    return sum(p.numel() for p in m.parameters())


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--registry",
        default=os.environ.get("ZOO_REGISTRY", "").strip() or str(SHIPPED),
        help="registry path or SQLAlchemy URL (default: $ZOO_REGISTRY or the shipped registry.db)",
    )
    ap.add_argument("-n", "--repeats", type=int, default=15, help="warm repeats of each (default 15)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated timm model names")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]

    warnings.simplefilter("ignore")
    # Everything imported before timing: torch, timm, zoo and the modules zoo.get imports lazily.
    import timm
    import torch

    import zoo
    import zoo.build
    import zoo.inspection
    import zoo.meta
    import zoo.model_cache

    z = zoo.connect(args.registry)

    def zoo_get(name):
        return lambda: z.get(f"timm/{name}")

    def plain(name):
        def build():
            with torch.device("meta"):
                return timm.create_model(name)

        return build

    open_s, _ = timed(lambda: z.info(f"timm/{models[0]}"))  # opens the registry: a once-per-process cost

    results = []
    for i, name in enumerate(models):
        r = {"model": name}
        # cold: the first call of each in this process
        order = ("zoo", "plain") if i % 2 == 0 else ("plain", "zoo")
        mods = {}
        for who in order:
            s, mods[who] = timed(zoo_get(name) if who == "zoo" else plain(name))
            r[f"{who}_cold_s"] = s
        r["cold_first"] = order[0]
        r["same_class"] = type(mods["zoo"]) is type(mods["plain"])
        r["params_zoo"], r["params_plain"] = nparams(mods["zoo"]), nparams(mods["plain"])
        r["all_meta_zoo"] = all(t.is_meta for t in list(mods["zoo"].parameters()) + list(mods["zoo"].buffers()))
        mods = None
        # one warm-up of each, then interleaved repeats
        for fn in (zoo_get(name), plain(name)):
            timed(fn)
        zs, ps = [], []
        for k in range(args.repeats):
            pair = ((zs, zoo_get(name)), (ps, plain(name)))
            for acc, fn in pair if k % 2 == 0 else pair[::-1]:
                s, m = timed(fn)
                m = None  # noqa: F841 - freed before the next gc.collect
                acc.append(s)
        r["zoo_warm_s"], r["plain_warm_s"] = statistics.median(zs), statistics.median(ps)
        r["zoo_warm_min_s"], r["plain_warm_min_s"] = min(zs), min(ps)
        r["ratio_warm"] = r["plain_warm_s"] / r["zoo_warm_s"]
        r["ratio_cold"] = r["plain_cold_s"] / r["zoo_cold_s"]
        results.append(r)
        if not args.json:
            print(f"  {name}: done", file=sys.stderr)

    summary = {
        "registry": z.url,
        "repeats": args.repeats,
        "registry_open_s": open_s,
        "median_ratio_warm": statistics.median(r["ratio_warm"] for r in results),
        "median_ratio_cold": statistics.median(r["ratio_cold"] for r in results),
        "target_ratio_warm": TARGET_WARM,
        "torch": torch.__version__,
        "timm": timm.__version__,
    }
    summary["meets_target"] = summary["median_ratio_warm"] >= TARGET_WARM
    if args.json:
        print(json.dumps({"models": results, "summary": summary}, indent=1))
        return 0

    header = [
        "model",
        "zoo warm ms",
        "plain warm ms",
        "warm x",
        "zoo cold ms",
        "plain cold ms",
        "cold x",
        "first",
        "same class+params",
    ]
    rows = [header] + [
        [
            r["model"],
            fmt_ms(r["zoo_warm_s"]),
            fmt_ms(r["plain_warm_s"]),
            f"{r['ratio_warm']:.1f}x",
            fmt_ms(r["zoo_cold_s"]),
            fmt_ms(r["plain_cold_s"]),
            f"{r['ratio_cold']:.2f}x",
            r["cold_first"],
            "yes"
            if r["same_class"] and r["params_zoo"] == r["params_plain"]
            else f"NO ({r['params_zoo']:,} vs {r['params_plain']:,})",
        ]
        for r in results
    ]
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    print(
        f"zoo.get vs timm.create_model on meta  (registry {z.url}; torch {torch.__version__}, timm {timm.__version__})"
    )
    print(f"warm = median of {args.repeats} interleaved repeats after 1 warm-up; cold = first call in this process")
    for n, row in enumerate(rows):
        print(
            "  ".join(
                c.ljust(w) if j in (0, 7, 8) else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(f"registry open (first zoo call in the process, before the table): {fmt_ms(open_s)} ms")
    if not all(r["all_meta_zoo"] for r in results):
        print("WARNING: a zoo.get module had a tensor off the meta device")
    print(
        f"median ratio plain/zoo over models: warm {summary['median_ratio_warm']:.1f}x, "
        f"cold {summary['median_ratio_cold']:.2f}x"
    )
    print(
        f"target: warm median ratio >= {TARGET_WARM:.0f}x -> "
        f"{'met' if summary['meets_target'] else 'NOT met'} ({summary['median_ratio_warm']:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a registry at another schema revision, a missing model: say so in one line
        if type(e).__module__.startswith("zoo"):
            print(f"get_vs_create_model: zoo error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
