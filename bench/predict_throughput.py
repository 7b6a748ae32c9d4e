"""The roofline estimate (zoo.throughput.roofline) against timm's measured throughput: how far off it is, per device and
per family, and what a per-family correction fitted on one device does on devices it was not fitted on.

For every (architecture, size) of each benchmark CSV in catalog/timm-results whose registry row
(timm/<model>, kind=architecture) records input_size [3, size, size] (the CSV's infer_img_size;
train_img_size for the training file) and has flops, bytes and train_activation_bytes, the prediction at
the batch size the CSV measured is compared with the measurement: ratio = measured / predicted (below 1:
slower than the roofline), error = max(ratio, 1 / ratio). A model's family is the timm module of its
class as the registry records it (`arch`, e.g. timm.models.resnet.ResNet -> resnet), read with sqlite3:
no torch, no timm (it differs from the module of timm's entrypoint for 92 of 1,371 architectures, e.g. deit's
and vitamin's entrypoints build vision_transformer classes: --family-by entrypoint imports timm for those). The
correction is the median ratio of each family on --fit (every other family: the median over all of --fit's rows); it is
applied to the held-out devices' predictions.

The correction zoo.plan uses (zoo.throughput.correction) is fitted here too, per mode over the GPU columns of
--correct-on pooled, on half of the models (sha256 of the name) and checked on the other half: the script prints the
held-out error with the mode's median for every model and with the per-family table, and --write stores the table
(zoo/throughput/step_correction.json).

Run `.venv/bin/python bench/predict_throughput.py [--registry R] [--fit infer_4090_amp] [--family-by class|entrypoint]
[--json [--pairs]] [--write [PATH]]`.
"""

import argparse
import csv
import json
import os
import sqlite3
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo.families.timm import BENCHMARKS  # noqa: E402 - after the sys.path insert; torch-free: the benchmark files' names
from zoo.throughput import correction as step  # noqa: E402 - after the sys.path insert
from zoo.throughput.roofline import HARDWARE, load_hardware, predict  # noqa: E402 - after the sys.path insert

HELD_OUT = ("infer_5090_amp", "infer_pro6000_amp")
# The GPU columns the plan's correction pools, per mode (the CPU's batch-1 compiled runs say nothing of a GPU step)
CORRECT_ON = ("infer_4090_amp", "infer_5090_amp", "infer_pro6000_amp", "train_3090_amp")


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def summary(ratios):
    errors = [max(r, 1 / r) for r in ratios]
    return {
        "n": len(ratios),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_p90": quantile(ratios, 0.9),
        "error_median": statistics.median(errors) if errors else None,
        "error_p90": quantile(errors, 0.9),
    }


def entrypoint_modules():
    """{model: timm module of its entrypoint}, by timm's public listing (imports timm, and so torch: seconds)."""
    import timm

    return {m: module for module in timm.list_modules() for m in timm.list_models(module=module)}


def registry_rows(path, modules=None):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT name, arch, input_size, flops, bytes, train_activation_bytes FROM models "
        "WHERE family = 'timm' AND kind = 'architecture' AND name LIKE 'timm/%'"
    ).fetchall()
    con.close()
    out = {}
    for name, arch, input_size, flops, nbytes, activations in rows:
        module = arch.split(".")[2] if arch and arch.startswith("timm.models.") else "?"
        if modules is not None:
            module = modules.get(name[len("timm/") :], module)
        out[name[len("timm/") :]] = {
            "family": module,
            "arch": arch,
            "input_size": json.loads(input_size) if input_size else None,
            "flops": flops,
            "bytes": nbytes,
            "train_activation_bytes": activations,
        }
    return out


def compare(rows, devices, results):
    """{column: [(model, size, family, measured, predicted)]} and {column: skipped counts by reason}."""
    pairs, skipped = {}, {}
    for column, device in devices.items():
        mode = column.split("_", 1)[0]
        pairs[column], skipped[column] = [], {"no row": 0, "other input size": 0, "no analysis": 0}
        with open(Path(results) / BENCHMARKS[column], newline="") as f:
            for r in csv.DictReader(f):
                size, row = int(r[f"{mode}_img_size"]), rows.get(r["model"])
                if row is None:
                    skipped[column]["no row"] += 1
                elif row["input_size"] != [3, size, size]:
                    skipped[column]["other input size"] += 1
                elif not all(row[k] for k in ("flops", "bytes", "train_activation_bytes")):
                    skipped[column]["no analysis"] += 1
                else:
                    est = predict(row, device, int(r[f"{mode}_batch_size"]))
                    pairs[column].append(
                        (
                            r["model"],
                            size,
                            row["family"],
                            float(r[f"{mode}_samples_per_sec"]),
                            est.samples_per_s,
                            est.bound,
                        )
                    )
    return pairs, skipped


def by_family(pairs):
    out = {}
    for _, _, family, measured, predicted, _ in pairs:
        out.setdefault(family, []).append(measured / predicted)
    return out


def step_correction(rows, pairs, devices, columns, min_models):
    """zoo.plan's correction table: per mode, the columns of that mode pooled (zoo.throughput.correction.fit)."""
    modes = {}
    for column in columns:
        modes.setdefault(devices[column].mode, []).append(column)
    out = {}
    for mode, cols in modes.items():
        ratios = [
            (m, step.family_of(rows[m]["arch"]), meas / pred) for c in cols for m, _, _, meas, pred, _ in pairs[c]
        ]
        out[mode] = {"columns": cols, **step.fit(ratios, min_models)}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--registry", default=os.environ.get("ZOO_REGISTRY") or str(ROOT / "registry.db"))
    p.add_argument("--hardware", default=str(HARDWARE))
    p.add_argument("--results", default=str(ROOT / "catalog" / "timm-results"))
    p.add_argument("--fit", default="infer_4090_amp", help="the device column the per-family correction is fitted on")
    p.add_argument("--min-family", type=int, default=10, help="families with fewer rows on --fit are not printed")
    p.add_argument(
        "--family-by",
        choices=("class", "entrypoint"),
        default="class",
        help="class: the module of the model's class, from the registry's arch (no timm import); "
        "entrypoint: the module of timm's entrypoint (imports timm)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--correct-on",
        default=",".join(CORRECT_ON),
        help="the device columns zoo.plan's per-family correction pools, per mode (comma-separated)",
    )
    p.add_argument("--min-models", type=int, default=step.MIN_MODELS, help="calibration models a family needs")
    p.add_argument(
        "--write",
        nargs="?",
        const=str(step.TABLE),
        default=None,
        metavar="PATH",
        help=f"write zoo.plan's correction table (default {step.TABLE.relative_to(ROOT)})",
    )
    p.add_argument(
        "--pairs", action="store_true", help="with --json: every compared (model, size, measured, predicted)"
    )
    a = p.parse_args(argv)
    if "://" in a.registry:
        p.error("--registry: a SQLite file (this script reads it with sqlite3)")
    devices = {c: d for c, d in load_hardware(a.hardware).items() if c in BENCHMARKS}  # measured ones only
    modules = entrypoint_modules() if a.family_by == "entrypoint" else None
    rows = registry_rows(a.registry, modules)
    pairs, skipped = compare(rows, devices, a.results)
    correct_on = [c for c in a.correct_on.split(",") if c]
    if unknown := [c for c in correct_on if c not in devices]:
        p.error(f"--correct-on: {', '.join(unknown)} not among {', '.join(devices)}")
    plan_modes = step_correction(rows, pairs, devices, correct_on, a.min_models)

    fit = by_family(pairs[a.fit])
    overall = statistics.median(r for rs in fit.values() for r in rs)
    correction = {family: statistics.median(rs) for family, rs in fit.items()}
    report = {
        "devices": {},
        "families": {},
        "correction": {"fit_on": a.fit, "default": overall, "per_family": correction, "held_out": {}},
    }
    for column, device in devices.items():
        ratios = [m / p_ for _, _, _, m, p_, _ in pairs[column]]
        report["devices"][column] = {
            "device": device.device,
            **summary(ratios),
            "skipped": skipped[column],
            "memory_bound": sum(b == "memory" for *_, b in pairs[column]),
        }
        report["families"][column] = {f: summary(rs) for f, rs in sorted(by_family(pairs[column]).items())}
    for column in [c for c in HELD_OUT if c in pairs and c != a.fit]:
        before = [m / p_ for _, _, _, m, p_, _ in pairs[column]]
        after = [m / (p_ * correction.get(f, overall)) for _, _, f, m, p_, _ in pairs[column]]
        report["correction"]["held_out"][column] = {"before": summary(before), "after": summary(after)}

    report["step_correction"] = plan_modes
    if a.write:
        about = (
            "zoo.plan's correction of the roofline (zoo.throughput.correction), written by bench/predict_throughput.py"
            f" --write from catalog/timm-results (timm's published benchmark CSVs: {', '.join(correct_on)}) and the "
            f"registry's rows; per mode the columns pooled; calibration: models with an even first byte of "
            f"sha256(name); a family (module of the class) needs {a.min_models} calibration models; band: error "
            "= max(ratio, 1/ratio) of the corrected prediction on the held-out (odd) models"
        )
        Path(a.write).write_text(json.dumps({"about": about, "modes": plan_modes}, indent=1) + "\n")
    if a.pairs:
        report["pairs"] = {c: [[m, size, meas, pred] for m, size, _, meas, pred, _ in v] for c, v in pairs.items()}
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(
        f"roofline estimate vs timm's measured throughput (ratio = measured / predicted; error = max(ratio, "
        f"1/ratio)); registry {a.registry}"
    )
    print(
        f"{'device column':<22} {'n':>5} {'mem-bound':>9} {'ratio p50':>9} {'ratio p90':>9} {'err p50':>8} "
        f"{'err p90':>8}  skipped (no row / other size / no analysis)"
    )
    for column, d in report["devices"].items():
        s = d["skipped"]
        print(
            f"{column:<22} {d['n']:>5} {d['memory_bound']:>9} {d['ratio_median']:>9.3f} {d['ratio_p90']:>9.3f} "
            f"{d['error_median']:>8.2f} {d['error_p90']:>8.2f}  {s['no row']} / {s['other input size']} / "
            f"{s['no analysis']}"
        )
    shown = sorted((f for f, rs in fit.items() if len(rs) >= a.min_family), key=lambda f: -len(fit[f]))
    print(
        f"\nper family (timm module of the model's {a.family_by}), median ratio per device; families with >= "
        f"{a.min_family} rows on {a.fit}"
    )
    columns = list(devices)
    print(f"{'family':<22} {'n':>4} " + " ".join(f"{c[:15]:>15}" for c in columns))
    for f in shown:
        cells = [report["families"][c].get(f, {}).get("ratio_median") for c in columns]
        print(f"{f:<22} {len(fit[f]):>4} " + " ".join(f"{x:>15.3f}" if x else f"{'-':>15}" for x in cells))
    print(
        f"\nper-family correction fitted on {a.fit} ({len(correction)} families; others x{overall:.3f}), "
        "error = max(ratio, 1/ratio) on held-out devices"
    )
    print(
        f"{'held out':<22} {'n':>5} {'err p50 before':>14} {'err p90 before':>14} {'err p50 after':>13} "
        f"{'err p90 after':>13}"
    )
    for column, d in report["correction"]["held_out"].items():
        b, af = d["before"], d["after"]
        print(
            f"{column:<22} {b['n']:>5} {b['error_median']:>14.2f} {b['error_p90']:>14.2f} "
            f"{af['error_median']:>13.2f} {af['error_p90']:>13.2f}"
        )
    print(
        f"\nzoo.plan's correction, per mode over {', '.join(correct_on)} pooled, fitted on the models with an even "
        f"sha256(name), families with >= {a.min_models} of them; error of the corrected prediction on the odd half"
    )
    print(
        f"{'mode':<6} {'families':>8} {'median':>7} {'n':>5} {'per-mode p50':>12} {'p90':>5} {'per-family p50':>14} "
        f"{'p90':>5}   band: with a family (n p50 p90) / mode median (n p50 p90)"
    )
    for mode, t in plan_modes.items():
        pm, pf, bf, bm = (
            t["held_out"]["per_mode"],
            t["held_out"]["per_family"],
            t["band"]["family"],
            t["band"]["median"],
        )
        print(
            f"{mode:<6} {len(t['families']):>8} {t['median']:>7.3f} {pm['n']:>5} {pm['p50']:>12.2f} {pm['p90']:>5.2f} "
            f"{pf['p50']:>14.2f} {pf['p90']:>5.2f}   {bf['n']} {bf['p50']:.2f} {bf['p90']:.2f} / {bm['n']} "
            f"{bm['p50']:.2f} {bm['p90']:.2f}"
        )
    if a.write:
        print(f"wrote {a.write}")


if __name__ == "__main__":
    main()
