"""The per-family correction of the roofline: the fraction of its roofline a family's models reach, fitted on timm's
published benchmarks, written as a table (step_correction.json beside this file) that zoo.plan reads.

Pure Python, no torch: a model's family is the module of its class (`arch` of its registry row, e.g.
timm.models.resnet.ResNet -> timm.models.resnet). bench/predict_throughput.py --write computes the table: for each
mode it pools the measured / predicted ratios of timm's GPU benchmark CSVs of that mode, splits the models by
sha256 of their name (as bench/plan_vs_published.py does: an even first byte calibrates, an odd one is held out),
keeps the median ratio of every family with at least MIN_MODELS calibration models and of the whole mode (the
fallback), and measures on the held-out models how far the corrected prediction is from the measurement: the band
a plan reports (error = max(ratio, 1 / ratio); p50 and p90, separately for models whose family has a correction
and for those that fall back to the mode's median).
"""

import hashlib
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from zoo.errors import InvalidArgument

TABLE = Path(__file__).resolve().parent / "step_correction.json"
# Held out (docs/guides/speed.md), 1, 2 and 3 do alike (p90 1.56-1.59 infer, 1.53-1.55 train), 5 to 20 worse; under 3
# the fallback's band rests on few held-out rows of odd families (24 infer rows at 1, p90 x8.8; 135 at 3, x2.2)
MIN_MODELS = 3


@dataclass(frozen=True)
class Correction:
    """How a predicted step is corrected: divide the roofline's time by `ratio`; the measured time then lies within
    x`p50` of it for half the held-out models and within x`p90` for 90% of them."""

    mode: str  # infer or train
    family: str | None  # the module whose median this is; None: the mode's median (no family correction)
    ratio: float  # measured / predicted samples/s
    p50: float
    p90: float

    def band(self, compute: float, overlapped: float = 0.0, serial: float = 0.0) -> dict:
        """A step's band: its compute time off by the p90 error either way, its communication as predicted.

        Args:
            compute: the corrected compute time of a step (seconds).
            overlapped: communication that runs beside the compute (FSDP's, DDP's collectives).
            serial: communication after it (TP's all-reduces).

        Returns:
            {"low", "high"} (seconds: 90% of held-out models measured within), "p50", "p90", "ratio", "family".
        """
        return {
            "low": max(compute / self.p90, overlapped) + serial,
            "high": max(compute * self.p90, overlapped) + serial,
            "p50": self.p50,
            "p90": self.p90,
            "ratio": self.ratio,
            "family": self.family,
        }

    def note(self) -> str:
        """What the correction is and how far off it was on held-out models, for a plan's notes."""
        basis = f"the measured fraction of {self.family} models" if self.family else "the median model's fraction"
        return (
            f"roofline / {self.ratio} ({basis}, {self.mode}); held out, half the models measured within x{self.p50} "
            f"of such a prediction, 90% within x{self.p90} (docs/guides/speed.md)"
        )


def family_of(arch: str | None) -> str | None:
    """The family a correction is kept for: the module of the model's class.

    Args:
        arch: a registry row's `arch` (the class's qualified name), or None.

    Returns:
        The module ("timm.models.resnet" for "timm.models.resnet.ResNet"), or None without one.

    Examples:
        >>> family_of("timm.models.resnet.ResNet")
        'timm.models.resnet'
    """
    return arch.rsplit(".", 1)[0] if isinstance(arch, str) and "." in arch else None


def held_out(model: str) -> bool:
    """Whether a model is in the held-out half: odd first byte of sha256(name), as bench/plan_vs_published.py."""
    return hashlib.sha256(model.encode()).digest()[0] % 2 == 1


def quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile of values, the element at int(q x n) of the sorted ones (no interpolation)."""
    ordered = sorted(values)
    if not ordered:
        raise InvalidArgument("a quantile of no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _band(ratios: list[float]) -> dict:
    errors = [max(r, 1 / r) for r in ratios]
    return {"n": len(errors), "p50": round(quantile(errors, 0.5), 3), "p90": round(quantile(errors, 0.9), 3)}


def fit(rows: Iterable[tuple[str, str | None, float]], min_models: int = MIN_MODELS) -> dict:
    """One mode's correction from (model, family, measured / predicted) rows, fitted on the calibration half.

    Args:
        rows: every measured row of the mode (a model may have several: sizes, devices).
        min_models: the calibration models a family needs for a correction of its own.

    Returns:
        {"median", "families": {family: {"ratio", "models", "rows"}}, "band": {"family", "median"} (each n, p50, p90
        on the held-out rows that use it), "held_out": {"per_mode", "per_family"} (the held-out half's error with
        the mode's median for every model, and with the table)}.

    Raises:
        InvalidArgument: no calibration or no held-out rows.
    """
    rows = [(m, f, r) for m, f, r in rows if r > 0 and math.isfinite(r)]
    calibration = [row for row in rows if not held_out(row[0])]
    held = [row for row in rows if held_out(row[0])]
    if not calibration or not held:
        raise InvalidArgument(f"a correction needs calibration and held-out rows: {len(calibration)}, {len(held)}")
    median = statistics.median(r for _, _, r in calibration)
    ratios: dict[str, list[float]] = {}
    models: dict[str, set[str]] = {}
    for model, family, ratio in calibration:
        if family is not None:
            ratios.setdefault(family, []).append(ratio)
            models.setdefault(family, set()).add(model)
    families = {
        f: {"ratio": round(statistics.median(ratios[f]), 4), "models": len(models[f]), "rows": len(ratios[f])}
        for f in sorted(ratios)
        if len(models[f]) >= min_models
    }
    own = [r / families[f]["ratio"] for _, f, r in held if f in families]
    rest = [r / median for _, f, r in held if f not in families]
    return {
        "median": round(median, 4),
        "families": families,
        "band": {"family": _band(own), "median": _band(rest or [r / median for _, _, r in held])},
        "held_out": {
            "per_mode": _band([r / median for _, _, r in held]),
            "per_family": _band([r / (families[f]["ratio"] if f in families else median) for _, f, r in held]),
        },
    }


@cache
def load(path: Path = TABLE) -> dict:
    """The correction table (its modes), checked: every ratio and band a finite positive number.

    Raises:
        InvalidArgument: the table cannot be read or has a bad number (regenerate it: bench/predict_throughput.py
            --write).
    """
    try:
        modes = json.loads(Path(path).read_text())["modes"]
        for mode in modes.values():
            numbers = [mode["median"], *(f["ratio"] for f in mode["families"].values())]
            numbers += [mode["band"][k][q] for k in ("family", "median") for q in ("p50", "p90")]
            if not all(isinstance(x, (int, float)) and 0 < x < math.inf for x in numbers):
                raise ValueError("a ratio or band that is not a positive number")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InvalidArgument(
            f"cannot read the step correction table {path}: {e}; rebuild it: bench/predict_throughput.py --write"
        ) from None
    return modes


def correction(mode: str, arch: str | None, path: Path = TABLE) -> Correction:
    """The correction a model's predicted step takes: its family's where the table has one, else the mode's median.

    Args:
        mode: "infer" or "train".
        arch: the model's class (its registry row's `arch`), or None.
        path: the table (default: the shipped one).

    Returns:
        The Correction, with the band measured on held-out models that take the same kind of correction.

    Raises:
        InvalidArgument: a mode the table lacks, or a table that cannot be read.

    Examples:
        >>> correction("infer", "timm.models.resnet.ResNet").family
        'timm.models.resnet'
    """
    modes = load(path)
    if mode not in modes:
        raise InvalidArgument(f"no step correction for mode {mode!r}: the table has {', '.join(modes)}")
    table, family = modes[mode], family_of(arch)
    kind = "family" if family in table["families"] else "median"
    ratio = table["families"][family]["ratio"] if kind == "family" else table["median"]
    band = table["band"][kind]
    return Correction(mode, family if kind == "family" else None, ratio, band["p50"], band["p90"])
