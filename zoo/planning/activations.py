"""Activation bytes per device, fitted in batch and sequence length from measured points (zoo.estimate on meta), and
the modes zoo index records them in (plan_activations)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any

from zoo.errors import AnalysisError
from zoo.planning.options import PRECISIONS, PlanOptions, autocast

# Where activations are measured (zoo.estimate on meta; a size costs nothing there). For a token model, a low regime at
# batch 1 and 2 on a sixteenth of the row's sequence and twice that: few tokens, where what is batch-independent rules
# the peak (a weight's gradient or cast in backward); and a high regime at HIGH_BATCH and twice it on the row's
# sequence and twice it: many tokens, where the samples' activations rule it. Another model (an image's activations
# rule its peak from batch 1) is the line through batch 1 and twice HIGH_BATCH.
HIGH_BATCH = 64
LOW_SEQ_DIVISOR = 16


@dataclass(frozen=True)
class Regime:
    """Activation bytes c0 + c1 x seq + batch x (a x seq + q x seq^2): exact for a model whose peak falls at the same
    point of the step at every size, with q what an attention that materializes its scores adds (0 when fused)."""

    c0: float
    c1: float
    a: float
    q: float

    def at(self, batch: int, seq: int | None) -> float:
        s = seq or 1
        return self.c0 + self.c1 * s + batch * (self.a * s + self.q * s * s)

    def per_sample(self, seq: int | None) -> float:
        s = seq or 1
        return self.a * s + self.q * s * s


@dataclass(frozen=True)
class Activations:
    """Activation (and input) bytes per device: the larger of the two regimes, and the KV cache per token."""

    low: Regime
    high: Regime
    kv_per_token: float = 0.0  # bytes per token of one sample, at the compute dtype

    def at(self, batch: int, seq: int | None) -> int:
        return max(0, math.ceil(max(self.low.at(batch, seq), self.high.at(batch, seq))))

    def scaled(self, factor: float) -> Activations:
        low, high = (Regime(r.c0 * factor, r.c1 * factor, r.a * factor, r.q * factor) for r in (self.low, self.high))
        return Activations(low, high, self.kv_per_token)

    def as_json(self) -> list:
        return [*astuple(self.low), *astuple(self.high), self.kv_per_token]

    @classmethod
    def from_json(cls, values: list) -> Activations:
        return cls(Regime(*values[:4]), Regime(*values[4:8]), values[8])


def fit_points(seq: int | None, low_batch: int = 1) -> list[tuple[int, int | None]]:
    """The (batch, seq) points fit_activations measures: for a token model two regimes, each at a batch and its double
    and at a length and twice it; for another, its smallest batch and twice HIGH_BATCH (one regime through both)."""
    if not seq:
        return [(low_batch, None), (2 * HIGH_BATCH, None)]
    low_seq = max(1, seq // LOW_SEQ_DIVISOR)
    return [
        (b, s)
        for batch, at in ((low_batch, low_seq), (HIGH_BATCH, seq))
        for s in (at, 2 * at)
        for b in (batch, 2 * batch)
    ]


def _regime(f: dict, b: int, s: int) -> Regime:
    """The regime through f's four points at (b, s), (2b, s), (b, 2s), (2b, 2s)."""
    per = (f[2 * b, s] - f[b, s]) / b
    longer = (f[2 * b, 2 * s] - f[b, 2 * s]) / b  # a x 2s + q x 4s^2, with per = a x s + q x s^2
    q = (longer - 2 * per) / (2 * s * s)
    c, c_longer = f[b, s] - b * per, f[b, 2 * s] - b * longer
    c1 = (c_longer - c) / s
    return Regime(c - c1 * s, c1, (per - q * s * s) / s, q)


def fit_activations(measure: Callable[[int, int | None], tuple[int, int]], seq: int | None) -> Activations:
    """Fit from measure(batch, seq) -> (activations + inputs, kv_cache) at fit_points: exact at each of them, and
    wherever the model's peak is one of the two regimes. The low regime is at batch 2 and 4 where BatchNorm refuses a
    batch of one."""
    low_seq = max(1, seq // LOW_SEQ_DIVISOR) if seq else None
    try:
        low, first = 1, measure(1, low_seq)
    except AnalysisError:  # measured at 2 and 4 instead; fails as batch 1 did where that was not the reason
        low, first = 2, measure(2, low_seq)
    f = {(low, low_seq): first[0]}
    for b, s in fit_points(seq, low)[1:]:
        f[b, s] = measure(b, s)[0]
    if not seq:  # the line through the smallest and the largest batch: exact at both, within a regime's change between
        per = (f[2 * HIGH_BATCH, None] - f[low, None]) / (2 * HIGH_BATCH - low)
        line = Regime(f[low, None] - low * per, 0.0, per, 0.0)
        return Activations(line, line, 0.0)
    assert low_seq is not None  # a token model's
    return Activations(_regime(f, low, low_seq), _regime(f, HIGH_BATCH, seq), first[1] / (low * low_seq))


def mode_of(o: PlanOptions) -> str:
    """What the activations of a plan depend on besides batch and sequence: the key they are recorded under."""
    o = o.checked()
    bits = PRECISIONS[o.dtype or "bf16"][0] * 8
    if not o.training:
        return f"infer-{bits}"
    return f"train-{'amp' if autocast(o) else bits}" + ("-ckpt" if o.checkpointing else "")


# The modes `zoo index` records for every model (zoo.analysis.plan_record), with options that have them: the
# defaults of inference (bf16), of training (amp-bf16) and of FSDP2 training (amp-bf16 there casts the parameters,
# not the ops, as bf16 training does).
RECORDED_MODES: dict[str, dict[str, Any]] = {
    "infer-16": dict(dtype="bf16"),
    "train-amp": dict(training=True, dtype="amp-bf16"),
    "train-16": dict(training=True, dtype="bf16"),
}


def recorded_activations(row, o: PlanOptions) -> Activations | None:
    """The activations a row records for these options (zoo index measured them), None where it records none: a mode
    not in RECORDED_MODES, an input_size of its own, a row indexed before they were recorded."""
    values = (getattr(row, "plan_activations", None) or {}).get(mode_of(o))
    if not isinstance(values, list) or o.input_size is not None:  # text: why zoo index could not measure it
        return None
    return Activations.from_json(values)


def measurer(estimate: Callable[..., Any], o: PlanOptions) -> Callable[[int, int | None], tuple[int, int]]:
    """measure(batch, seq_len) -> (activations + inputs, kv_cache) from zoo.estimate of one module with the plan's
    dtype (amp-*: under autocast to its compute dtype, but for FSDP2), training, optimizer, checkpointing and
    input_size; the KV cache at the compute dtype (Plan scales it to kv_dtype)."""
    kw = estimate_options(o)

    def measure(batch: int, seq_len: int | None) -> tuple[int, int]:
        e = estimate(batch=batch, seq_len=seq_len, **kw)
        return e.activations + e.inputs, e.kv_cache

    return measure


def estimate_options(o: PlanOptions) -> dict:
    """zoo.estimate's options for the activations of a plan (its mode_of). The step is measured without an optimizer:
    its states are model states, counted exactly apart; its transient temporaries are not counted (module docstring)."""
    o = o.checked()
    kw: dict[str, Any] = dict(dtype=PRECISIONS[o.dtype or "bf16"][2], training=o.training)
    kw |= dict(optimizer="none", checkpointing=o.checkpointing) if o.training else {}
    kw |= dict(amp=True) if autocast(o) else {}
    kw |= dict(input_size=tuple(o.input_size)) if o.input_size else {}
    return kw
