"""zoo.plan's max_batch against published, measured memory limits: timm's RTX 3090 training benchmark, per family,
with the GPU overheads (zoo.planning.CUDA_RESERVE, ALLOCATOR_FRACTION) calibrated on half of the models and the
agreement reported on the other half.

The published limits: catalog/timm-results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv, `train_batch_size`, the
largest batch of benchmark.py's retry sequence that trained on an RTX 3090 (24 GiB) at `train_img_size`. The file was
added to timm at 5e7d47ca (2022-07-19, "w/ 0.6.6 code") and last updated at c865028c (2022-07-27); benchmark.py at
c865028c (timm 0.6.6) configures the run as follows:

- precision: `--amp` (bulk_runner.py's example line: `benchmark.py --amp -b 512`): resolve_precision('amp') keeps
  the model and the input in float32 (model_dtype, data_dtype) and runs under torch.cuda.amp.autocast
  (BenchmarkRunner.__init__, `self.amp_autocast`), fp16 by default; no GradScaler. NCHW: `--channels-last` unset.
- the model: create_model(name, in_chans=3, global_pool=None (model default), drop_rate=0, drop_path_rate and
  drop_block_rate None (model defaults)), moved to cuda in float32; TrainBenchmarkRunner.__init__ calls
  self.model.train().
- the input: torch.randn((batch,) + input_size) in float32, input_size from resolve_data_config(use_test_size=not
  use_train_size), and the CSV's train_img_size is that input_size[-1]: this bench plans at it.
- the loss: nn.CrossEntropyLoss() of the output against random int64 targets; `.backward()` runs inside the
  autocast region (TrainBenchmarkRunner.run, `_step`), so autocast's cached weight casts live through backward.
- the optimizer: create_optimizer_v2(model, opt=kwargs.pop('opt', 'sgd'), lr=1e-4) (TrainBenchmarkRunner.__init__;
  `--opt` defaults to 'sgd'): timm's 'sgd' is torch.optim.SGD(momentum=0.9, nesterov=True) (optim_factory.py), weight
  decay 0: one fp32 momentum buffer per parameter. `optimizer.zero_grad()` (PyTorch 1.12: set_to_none=False) keeps
  the fp32 gradients allocated between steps.
- the batch: `-b 512`, then on a RuntimeError (out of memory) _try_run calls torch.cuda.empty_cache(), builds the
  runner again at decay_batch_step(batch) (timm/utils/decay_batch.py, num_intra_steps=2): 512, 384, 256, 192, 128,
  96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1. 512 was the first batch tried: 512 means "at least 512".
- `torch.backends.cudnn.benchmark = True` at import: cuDNN tries its algorithms with workspaces at the first step.
- attention: PyTorch 1.12 has no scaled_dot_product_attention; timm 0.6.6 computes q @ k^T, softmax (fp32 under
  autocast) and @ v explicitly. This bench sets TIMM_FUSED_ATTN=0 before timm is imported, so today's timm builds
  the same explicit attention.

The plan: zoo.planning.plan with hardware="RTX 3090", training=True, dtype="amp-fp16" (autocast emulated on meta,
zoo.analysis.autocast), optimizer="sgd", batch = the published one, input_size = (3, train_img_size, train_img_size).
Its max_batch is mapped onto the retry sequence (the largest step <= max_batch, 512 at most) and compared with the
published step: exact, within one step, more than one step above (over) or below (under).

Calibration: models are split by the parity of the first byte of sha256(name): even calibrates, odd is held out.
CUDA_RESERVE (bytes, whatever the batch: the CUDA context, cuDNN's handles and workspaces) and ALLOCATOR_FRACTION
(a fraction of the activations: the caching allocator's rounding, block splitting and fragmentation) are searched on a
grid for the most exact agreements on the calibration half (ties: most within one step, then the smaller values); the
held-out half is reported with them. The constants shipped in zoo/planning.py are printed beside the fitted ones, and
the tables are computed by zoo.planning.plan itself with the shipped constants.

Each model's meta measurements (the two regimes planning.fit_activations fits, as zoo.plan does) are cached in
.bench-cache/ (a JSON file), so a rerun takes seconds; a first run builds and measures each model on meta (1-3 s
a model).

Run `.venv/bin/python bench/plan_vs_published.py [--limit N] [--registry R] [--cache PATH] [--json]`.
"""

import argparse
import csv
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402 - after the checkout is put on the path
from zoo import planning  # noqa: E402 - after the checkout is put on the path

TABLE = ROOT / "catalog" / "timm-results" / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"
HARDWARE = "RTX 3090"
# what a cached measurement was measured with
VERSION = "amp-fp16 train without optimizer, TIMM_FUSED_ATTN=0, MetaAutocast v1, two regimes"
MIN_FAMILY = 8  # smaller families are pooled as "(other)"


def steps(start: int = 512) -> list[int]:
    """timm's retry sequence from `start`: decay_batch_step(batch, num_intra_steps=2) until 0."""
    out, batch = [], start
    while batch:
        out.append(batch)
        if batch <= 1:
            break
        base = 2 ** int(math.log2(batch - 1))
        size = max(base // 2, 1)
        batch = base + ((batch - base - 1) // size) * size
    return out


STEPS = steps()


def step_of(max_batch: int) -> int:
    """The step a benchmark run would report for a model whose largest fitting batch is max_batch (0: none fits)."""
    return next((s for s in STEPS if s <= max_batch), 0)


def distance(predicted: int, published: int) -> int:
    """Steps from the published step to the predicted one (positive: the plan says more fits)."""
    index = {s: i for i, s in enumerate([*STEPS, 0])}
    return index[published] - index[predicted]


def held_out(name: str) -> bool:
    return hashlib.sha256(name.encode()).digest()[0] % 2 == 1


def options(size: int, batch: int) -> planning.PlanOptions:
    return planning.PlanOptions(
        hardware=HARDWARE,
        training=True,
        dtype="amp-fp16",
        optimizer="sgd",
        batch=batch,
        input_size=(3, size, size),
    ).checked()


def measured(z, name: str, o, cache: dict) -> dict:
    """{"fit": Activations.as_json()} of one model at the run's size (planning.fit_activations on meta, as zoo.plan
    measures it), from the cache or measured now."""
    key = f"{name}@{o.input_size[1]}"
    old = cache.get(key, {})
    if old.get("version") == VERSION:
        return cache[key]
    start = time.perf_counter()
    entry: dict = {}
    try:
        module = z.get(name)
        fit = planning.fit_activations(planning.measurer(lambda **kw: z.estimate(module, **kw), o), None)
        entry["fit"] = fit.as_json()
    except Exception as e:  # noqa: BLE001 - a model that fails on meta is counted, not fatal
        entry = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    entry |= {"version": VERSION, "seconds": round(time.perf_counter() - start, 2)}
    cache[key] = entry
    return entry


def family_of(arch: str | None) -> str:
    parts = (arch or "").split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["timm", "models"] else "?"


def collect(z, limit: int | None, cache_path: Path) -> tuple[list[dict], dict]:
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with open(TABLE, newline="") as f:
        published = list(csv.DictReader(f))
    rows, skipped = [], {"no registry row": 0, "fails on meta": 0}
    known = {m.name.removeprefix("timm/") for m in z.search("family=timm and kind=architecture", fields=None)}
    todo = [r for r in published if r["model"] in known]
    skipped["no registry row"] = len(published) - len(todo)
    for i, r in enumerate(todo[:limit]):
        name, size, batch = f"timm/{r['model']}", int(r["train_img_size"]), int(r["train_batch_size"])
        o = options(size, batch)
        entry = measured(z, name, o, cache)
        if i % 25 == 24:
            cache_path.write_text(json.dumps(cache))
        if "error" in entry:
            skipped["fails on meta"] += 1
            continue
        info = z.info(name, tensors=True)
        shapes = info.plan_shapes or planning.shape_groups(info.tensor_table)
        states = planning.model_states(shapes, o)
        base = sum(states.values()) + sum(planning.other_bytes(shapes, o, states).values())
        rows.append(
            {
                "model": r["model"],
                "family": family_of(info.arch),
                "size": size,
                "published": batch,
                "held_out": held_out(r["model"]),
                "fixed": base,  # model states and the layout's other terms, without the calibrated two
                "act": planning.Activations.from_json(entry["fit"]),
                "shapes": shapes,
                "row": info,
                "options": o,
            }
        )
    cache_path.write_text(json.dumps(cache))
    return rows, skipped


def predicted(row: dict, reserve: float, fraction: float, capacity: int) -> int:
    """max_batch by zoo.planning.plan's formula with these two constants (the calibration's fast path): the smaller
    of the two regimes' largest batches."""
    act, scale = row["act"], 1 + fraction
    return min(
        planning._solve(
            int(row["fixed"] + reserve + math.ceil(r.at(0, None) * scale)), r.per_sample(None) * scale, capacity
        )
        for r in (act.low, act.high)
    )


def score(rows: list[dict], batches: list[int]) -> dict:
    d = [distance(step_of(b), r["published"]) for r, b in zip(rows, batches)]
    n = len(d)
    return {
        "n": n,
        "exact": sum(x == 0 for x in d),
        "within_one": sum(abs(x) <= 1 for x in d),
        "over": sum(x > 1 for x in d),
        "under": sum(x < -1 for x in d),
        "above": sum(x > 0 for x in d),
        "below": sum(x < 0 for x in d),
    }


def calibrate(rows: list[dict], capacity: int) -> tuple[float, float, dict]:
    best = None
    for reserve in range(0, 3 * 2**30 + 1, 32 * 2**20):
        for fraction in [i / 200 for i in range(0, 81)]:
            s = score(rows, [predicted(r, reserve, fraction, capacity) for r in rows])
            key = (s["exact"], s["within_one"], -reserve, -fraction)
            if best is None or key > best[0]:
                best = (key, reserve, fraction, s)
    assert best is not None
    return best[1], best[2], best[3]


def table(rows: list[dict], batches: list[int]) -> dict:
    families: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        families.setdefault(r["family"], []).append(i)
    small = [f for f, ix in families.items() if len(ix) < MIN_FAMILY]
    for f in small:
        families.setdefault("(other)", []).extend(families.pop(f))
    out = {f: score([rows[i] for i in ix], [batches[i] for i in ix]) for f, ix in sorted(families.items())}
    out["ALL"] = score(rows, batches)
    return out


def pct(a: int, n: int) -> str:
    return f"{100 * a / n:5.1f}%" if n else "    -"


def show(title: str, t: dict) -> None:
    print(f"\n{title}")
    print(f"  {'family':<22}{'n':>5}{'exact':>9}{'within 1':>10}{'over':>6}{'under':>7}{'above':>7}{'below':>7}")
    for f, s in t.items():
        n = s["n"]
        print(
            f"  {f:<22}{n:>5}{pct(s['exact'], n):>9}{pct(s['within_one'], n):>10}"
            f"{s['over']:>6}{s['under']:>7}{s['above']:>7}{s['below']:>7}"
        )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--registry", default=os.environ.get("ZOO_REGISTRY") or str(ROOT / "registry.db"))
    p.add_argument("--cache", default=str(ROOT / ".bench-cache" / "plan_vs_published.json"))
    p.add_argument("--limit", type=int, default=None, help="the first N models of the table the registry holds")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if "timm" in sys.modules:
        p.error("run as a script: TIMM_FUSED_ATTN must be set before timm is imported")
    os.environ["TIMM_FUSED_ATTN"] = "0"  # PyTorch 1.12's (and timm 0.6.6's) explicit attention: see the docstring
    start = time.perf_counter()
    z = zoo.Zoo(a.registry)
    rows, skipped = collect(z, a.limit, Path(a.cache))
    capacity = planning.hardware_of(HARDWARE).capacity
    calibration = [r for r in rows if not r["held_out"]]
    held = [r for r in rows if r["held_out"]]
    reserve, fraction, fit = calibrate(calibration, capacity)
    shipped = (planning.CUDA_RESERVE, planning.ALLOCATOR_FRACTION)

    def plans(part: list[dict]) -> list[int]:
        return [planning.plan(r["row"].name, r["shapes"], r["row"], r["options"], r["act"]).max_batch for r in part]

    misses = [
        {k: r[k] for k in ("model", "family", "size", "published", "held_out")} | {"predicted": step_of(b)}
        for r, b in zip(rows, plans(rows))
        if step_of(b) != r["published"]
    ]

    report: dict = {
        "models": len(rows),
        "skipped": skipped,
        "fitted": {"cuda_reserve": reserve, "allocator_fraction": fraction, "calibration": fit},
        "shipped": {"cuda_reserve": shipped[0], "allocator_fraction": shipped[1]},
        "uncalibrated": {
            name: score(part, [predicted(r, 0, 0.0, capacity) for r in part])
            for name, part in (("calibration", calibration), ("held_out", held))
        },
        "calibration": table(calibration, plans(calibration)),
        "held_out": table(held, plans(held)),
        "misses": misses,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if a.json:
        print(json.dumps(report, indent=1))
        return report
    print(f"{len(rows)} models planned ({len(calibration)} calibration, {len(held)} held out); skipped: {skipped}")
    print(
        f"fitted on the calibration half: CUDA_RESERVE {reserve / 2**20:.0f} MiB, ALLOCATOR_FRACTION {fraction:.3f} "
        f"({fit['exact']}/{fit['n']} exact); shipped in zoo/planning.py: {shipped[0] / 2**20:.0f} MiB, {shipped[1]:.3f}"
    )
    for name, s in report["uncalibrated"].items():
        print(
            f"without the two terms, {name}: {pct(s['exact'], s['n'])} exact, {pct(s['within_one'], s['n'])} within one"
        )
    show("calibration half (zoo.plan, shipped constants)", report["calibration"])
    show("held out (zoo.plan, shipped constants)", report["held_out"])
    print("\nnot exact (published -> predicted step, * held out):")
    for m in misses:
        print(
            f"  {m['model']:<34}{m['family']:<22}{m['size']:>4} px {m['published']:>4} -> {m['predicted']:<4}"
            + (" *" if m["held_out"] else "")
        )
    h = report["held_out"]["ALL"]
    print(
        f"\nheld out: {pct(h['exact'], h['n'])} exact (target 75%), {pct(h['within_one'], h['n'])} within one step "
        f"(target 95%), n={h['n']}; {report['seconds']} s"
    )
    return report


if __name__ == "__main__":
    main()
