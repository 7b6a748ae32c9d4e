"""plan: the memory a run needs on each device under DDP, FSDP2 and tensor parallelism, whether it fits a device of
catalog/hardware.csv, the largest batch that does, and a predicted step time.

Torch-free. Model states come from the model's parameter shapes (shape_groups of its tensor table), shard by shard;
activations from measured points (zoo.estimate on meta) fitted in batch and sequence length; the device from the
hardware table. zoo index records both for RECORDED_MODES (the plan_shapes and plan_activations columns), so a plan in
one of them, and `zoo search --fits`, build no module; another mode is measured when planned. What each term counts,
per device (`batch` is each device's micro-batch):

hardware table. What each term counts, per device (`batch` is each device's micro-batch):

- weights: every parameter once (tied names once), at the master dtype (fp32 under amp-*, else dtype), and every
  buffer replicated (floating buffers at dtype, fp32 under amp-*). Under FSDP2 (`fsdp` = N) a parameter is
  sharded on dim 0 as fully_shard does: each rank keeps ceil(dim0 / N) rows, the last ranks' shards padded (rank
  r holds rows [r*c, min((r+1)*c, dim0)) of c = ceil(dim0 / N), stored in a buffer of c rows). Under tensor
  parallelism of degree `tp` the standard plan splits first (TP_COLWISE on dim 0 with their biases, TP_ROWWISE on
  dim 1, biases replicated); embeddings, norms and the output head stay whole. DDP replicates.
- gradients (training): one per parameter at the master dtype, in the same padded shards (FSDP2 reduce-scatters
  into a padded buffer per group).
- optimizer (training): adam/adamw keep exp_avg and exp_avg_sq, sgd a momentum buffer, each like its parameter's
  local (unpadded) shard; adam adds a 4-byte step counter per parameter (torch.optim keeps a 0-d float32).
- activations: zoo.estimate's activations plus inputs, fitted from measured points (zoo.planning.activations): for a
  token model the larger of two regimes, each c0 + c1 x seq + batch x (a x seq + q x seq^2) through four points, at
  batch 1 and 2 (2 and 4 where BatchNorm refuses one) on a sixteenth of the row's sequence and twice it, where few
  tokens let what is batch-independent rule the peak (a weight's gradient or cast in backward), and at HIGH_BATCH
  and twice it on the row's sequence and twice it, where the samples' activations rule it; for another model the
  line through batch 1 and twice HIGH_BATCH. q is what an attention that materializes its scores adds; a fused
  attention measures q = 0. Under TP they are not divided (an upper bound: the split
  attention and MLP intermediates are counted whole on every rank). The step is measured without its optimizer:
  the optimizer's states are counted exactly above; the temporaries of its step are not (torch.optim's
  single-tensor Adam holds about two of the largest parameter at once, after backward has freed the activations;
  its foreach step, the CUDA default, a copy of the second moments of a whole parameter group).
- kv_cache (inference of a model that keeps one): measured per token, times batch x seq_len.
- other: what the framework adds, each term in OTHER. On a GPU of the hardware table, what no meta run sees: the
  CUDA context and cuDNN's workspaces (CUDA_RESERVE) and the caching allocator's rounding and fragmentation
  (ALLOCATOR_FRACTION of the activations), calibrated against published limits (bench/plan_vs_published.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from zoo.errors import InvalidArgument
from zoo.planning.activations import (
    HIGH_BATCH,
    RECORDED_MODES,
    Activations,
    Regime,
    estimate_options,
    fit_activations,
    fit_points,
    measurer,
    mode_of,
    recorded_activations,
)
from zoo.planning.hardware import Hardware, hardware_of, load_devices, ram_bytes
from zoo.planning.options import KV_BYTES, PRECISIONS, STATES, PlanOptions, autocast
from zoo.planning.states import (
    OTHER,
    TP_COLWISE,
    TP_ROWWISE,
    blocks,
    model_states,
    other_bytes,
    param_count,
    shape_groups,
)
from zoo.throughput.correction import correction
from zoo.throughput.roofline import INPUTS, predict

__all__ = [
    "ALLOCATOR_FRACTION",
    "Activations",
    "CUDA_RESERVE",
    "HIGH_BATCH",
    "Hardware",
    "KV_BYTES",
    "OTHER",
    "PRECISIONS",
    "Plan",
    "PlanOptions",
    "RECORDED_MODES",
    "Regime",
    "STATES",
    "TP_COLWISE",
    "TP_ROWWISE",
    "autocast",
    "blocks",
    "estimate_options",
    "fit_activations",
    "fit_points",
    "hardware_of",
    "load_devices",
    "measurer",
    "mode_of",
    "model_states",
    "other_bytes",
    "param_count",
    "plan",
    "ram_bytes",
    "recorded_activations",
    "row_seq",
    "shape_groups",
]

# Calibrated on half of timm's RTX 3090 training benchmark (bench/plan_vs_published.py: the largest batch of its retry
# sequence that fit 24 GiB, AMP, SGD); held out: 93.4% of 320 models exact, 99.7% within one step (bench/README.md).
CUDA_RESERVE = 32 * 2**20  # bytes, whatever the batch
ALLOCATOR_FRACTION = 0.115  # of the activations (and inputs) measured on meta


@dataclass(frozen=True)
class Plan:
    """A run planned on one device of a layout; every byte figure is per device (see zoo.planning's docstring).

    per_device: weights, gradients, optimizer, activations, kv_cache, other and total, in bytes. capacity: the
    device's memory. max_batch: the largest per-device batch that fits with everything else as given (0: none
    does). max_context, max_tokens (inference of a model with a KV cache): the longest sequence that fits at this
    batch, and the tokens the KV cache can hold beside the rest. step_seconds: predicted (the roofline over the
    measured fraction of it the model's family reaches, plus communication), None with the reason in notes;
    step_band: the seconds 90% of held-out models measured within, and why (zoo.throughput.correction.Correction).
    """

    name: str
    hardware: str
    devices: int
    ddp: int
    fsdp: int
    tp: int
    training: bool
    dtype: str
    optimizer: str | None
    batch: int
    seq_len: int | None
    per_device: dict[str, int]
    capacity: int
    fits: bool
    max_batch: int
    max_context: int | None = None
    max_tokens: int | None = None
    step_seconds: float | None = None
    step_band: dict[str, Any] | None = None
    other: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {**asdict(self), "notes": list(self.notes)}


def _solve(fixed: int, per: float, capacity: int) -> int:
    """The largest whole n >= 0 with fixed + ceil(n x per) <= capacity (below 2**31)."""
    if fixed > capacity:
        return 0
    n = 2**31 - 1 if per <= 0 else min(2**31 - 1, int((capacity - fixed) / per))
    while n > 0 and fixed + math.ceil(n * per) > capacity:  # float rounding: step down to the exact bound
        n -= 1
    while n < 2**31 - 1 and fixed + math.ceil((n + 1) * per) <= capacity:
        n += 1
    return n


def _step_seconds(row, o: PlanOptions, hw: Hardware, batch: int, seq: int | None, params: int, notes: list):
    """Compute (roofline / family fraction) alongside FSDP's or DDP's collectives, then TP's; and its band."""
    if hw.device is None:
        notes.append("step_seconds: none for hardware given as bytes or cpu (no peak FLOP/s or bandwidth)")
        return None, None
    numbers: dict[str, Any] = {k: getattr(row, k, None) for k in INPUTS} if row is not None else {}
    analysed_seq = row_seq(row)
    if seq and analysed_seq and all(isinstance(v, (int, float)) for v in numbers.values()):
        numbers = {k: float(v) * seq / analysed_seq for k, v in numbers.items()}  # linear in tokens: no s^2 term
    mode = "train" if o.training else "infer"
    compute_bytes, master_bytes, _ = PRECISIONS[o.dtype or "bf16"]
    try:
        est = predict(numbers, hw.device.replace(mode=mode, element_bytes=compute_bytes), batch)
        c = correction(mode, getattr(row, "arch", None))
    except InvalidArgument as e:
        notes.append(f"step_seconds: none ({e})")
        return None, None
    compute = batch / est.samples_per_s / o.tp / c.ratio
    comm, tp_comm = 0.0, 0.0
    ddp = o.devices // (o.fsdp * o.tp)
    if o.devices > 1 and hw.interconnect is None:
        notes.append("step_seconds: no interconnect listed for this device; communication left out")
    elif o.devices > 1 and hw.interconnect:
        n = o.fsdp
        if n > 1:  # all-gather in forward (and again in backward), reduce-scatter of the gradients, at compute dtype
            comm += (3 if o.training else 1) * compute_bytes * params * (n - 1) / n / hw.interconnect
        if o.training and ddp > 1:  # ring all-reduce: 2 (d - 1) / d of the gradients (master dtype) each way
            comm += 2 * (ddp - 1) / ddp * master_bytes * params / n / hw.interconnect
        layers, hidden = getattr(row, "layers", None), getattr(row, "hidden_size", None)
        if o.tp > 1 and layers and hidden:  # Megatron: 2 all-reduces per layer forward, 2 more backward
            size = batch * (seq or 1) * hidden * compute_bytes
            tp_comm = (4 if o.training else 2) * layers * 2 * (o.tp - 1) / o.tp * size / hw.interconnect
    notes.append(f"step_seconds: {c.note()}; communication at the listed interconnect")
    return max(compute, comm) + tp_comm, c.band(compute, comm, tp_comm)


def row_seq(row) -> int | None:
    """The sequence length a token model's row was analysed at (its token ids' second dimension); None for others."""
    for spec in getattr(row, "inputs", None) or ():
        if isinstance(spec, dict) and spec.get("dtype") == "int64" and len(spec.get("shape") or ()) == 2:
            return spec["shape"][1]
    return None


def plan(name: str, shapes: dict, row, options: PlanOptions, activations: Activations) -> Plan:
    """The Plan of a model: its shape_groups, its registry row (a ModelInfo, or None for a module without one) and its
    activations on one device (recorded_activations, or fit_activations of zoo.estimate on meta).

    Raises InvalidArgument for a TP degree that does not divide the heads, HardwareNotFound for unknown hardware.
    """
    o = options.checked()
    hw = hardware_of(o.hardware)
    heads = [getattr(row, k, None) for k in ("heads", "kv_heads")]
    if o.tp > 1 and (not heads[0] or any(h and h % o.tp for h in heads)):
        raise InvalidArgument(
            f"tp={o.tp} must divide the attention heads ({heads[0]}) and key-value heads ({heads[1]}) the model's "
            "row records: tensor parallelism splits whole heads (a row without them: plan with tp=1)",
            "tp",
        )
    if o.kv_dtype is not None and not activations.kv_per_token:
        raise InvalidArgument("kv_dtype applies to the inference of a model that keeps a KV cache; this one keeps none")
    if o.seq_len and row is not None and row_seq(row) is None:
        raise InvalidArgument("seq_len applies to models with token inputs: this model's input has no sequence")
    seq = o.seq_len or row_seq(row)
    compute = PRECISIONS[o.dtype or "bf16"][0]
    kv = activations.kv_per_token * (KV_BYTES[o.kv_dtype] if o.kv_dtype else compute) / compute
    act = activations
    states = model_states(shapes, o)
    other = other_bytes(shapes, o, states) | ({"cuda_reserve": CUDA_RESERVE} if hw.device else {})
    if hw.device and ALLOCATOR_FRACTION:
        act = activations.scaled(1 + ALLOCATOR_FRACTION)
    fixed = sum(states.values()) + sum(other.values())

    def total(batch: int, s: int | None = seq) -> int:
        return fixed + act.at(batch, s) + math.ceil(batch * (s or 0) * kv)

    max_batch = min(
        _solve(fixed + math.ceil(r.at(0, seq)), r.per_sample(seq) + (seq or 0) * kv, hw.capacity)
        for r in (act.low, act.high)
    )
    while max_batch and total(max_batch) > hw.capacity:  # ceil of the sum vs the sum of ceils
        max_batch -= 1
    while max_batch < 2**31 - 1 and total(max_batch + 1) <= hw.capacity:
        max_batch += 1
    batch = o.batch or max(max_batch, 1)
    max_context = max_tokens = None
    if kv and not o.training:
        lo, hi = 0, 2**31 - 1  # the longest sequence at this batch: total grows with it
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if total(batch, mid) <= hw.capacity else (lo, mid - 1)
        max_context = lo
        spare = hw.capacity - fixed - act.at(batch, seq)
        max_tokens = max(0, int(spare // kv))
    if act is not activations:
        other["allocator"] = act.at(batch, seq) - activations.at(batch, seq)
    parts = {
        **states,
        "activations": activations.at(batch, seq),
        "kv_cache": math.ceil(batch * (seq or 0) * kv),
        "other": sum(other.values()),
    }
    parts["total"] = sum(parts.values())
    notes = [f"other: {k} ({OTHER[k]})" for k, v in other.items() if v]
    if o.tp > 1:
        notes.append(f"tp: column-parallel {', '.join(TP_COLWISE)}; row-parallel {', '.join(TP_ROWWISE)}")
    step, band = _step_seconds(row, o, hw, batch, seq, param_count(shapes), notes)
    return Plan(
        name=name,
        hardware=hw.name,
        devices=o.devices,
        ddp=o.devices // (o.fsdp * o.tp),
        fsdp=o.fsdp,
        tp=o.tp,
        training=o.training,
        dtype=o.dtype or "bf16",
        optimizer=o.optimizer,
        batch=batch,
        seq_len=seq,
        per_device=parts,
        capacity=hw.capacity,
        fits=parts["total"] <= hw.capacity,
        max_batch=max_batch,
        max_context=max_context,
        max_tokens=max_tokens,
        step_seconds=step,
        step_band=band,
        other=other,
        notes=tuple(notes),
    )
