"""plan: the memory a run needs on each device under DDP, FSDP2 and tensor parallelism, whether it fits a device of
catalog/hardware.csv, the largest batch that does, and a predicted step time.

Torch-free. Model states come from the registry's tensor table, shard by shard; activations from a few measured
points (Zoo.plan measures them with zoo.estimate on meta) fitted in batch and sequence length; the device from the
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
- activations: zoo.estimate's activations plus inputs at batch 1 and 2 (and, for token models, at twice the
  sequence length), fitted as c + batch x (a x seq + q x seq^2): q is what an attention that materializes its
  scores adds; a fused attention measures q = 0. Under TP they are not divided (an upper bound: the split
  attention and MLP intermediates are counted whole on every rank).
- kv_cache (inference of a model that keeps one): measured per token, times batch x seq_len.
- other: what the framework adds, each term in OTHER. On a GPU of the hardware table, what no meta run sees: the
  CUDA context and cuDNN's workspaces (CUDA_RESERVE) and the caching allocator's rounding and fragmentation
  (ALLOCATOR_FRACTION of the activations), calibrated against published limits (bench/plan_vs_published.py).
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from zoo.dtypes import FLOAT_NAMES
from zoo.errors import AnalysisError, HardwareNotFound, InvalidArgument
from zoo.throughput.roofline import HARDWARE, INPUTS, Device, load_hardware, predict

# dtype -> (compute bytes, master bytes, the dtype the forward runs in). amp-*: autocast (or FSDP2's
# MixedPrecisionPolicy(param_dtype=...)) over fp32 parameters, the fp32 master weights torch.amp keeps.
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
PRECISIONS = {k: (_BYTES[v], _BYTES[v], k) for k, v in FLOAT_NAMES.items()} | {
    "amp-bf16": (2, 4, "bf16"),
    "amp-fp16": (2, 4, "fp16"),
}
STATES = {"adamw": 2, "adam": 2, "sgd": 1, "none": 0}  # optimizer tensors per parameter
STEP_BYTES = {"adamw": 4, "adam": 4, "sgd": 0, "none": 0}  # adam's 0-d float32 step, one per parameter
# The standard tensor-parallel plan (Megatron-LM; torch's parallelize_module with ColwiseParallel/RowwiseParallel,
# as torchtitan's Llama plan): the last module name of each split Linear.
TP_COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "qkv", "fc1", "w1", "w3")
TP_ROWWISE = ("o_proj", "down_proj", "proj", "fc2", "w2")
OTHER = {
    "fsdp_gathered": "FSDP2: the unsharded parameters at the compute dtype of the root (not resharded after "
    "forward) and of two blocks at once (the one running and the one prefetched), and one block's unsharded "
    "gradients before its reduce-scatter",
    "ddp_buckets": "DDP: its all-reduce buckets, one more copy of the gradients (gradient_as_bucket_view=False, "
    "the default; torch's DistributedDataParallel documentation)",
    "amp_copies": "amp-* under FSDP2 without autocast: low-precision copies of the weights, kept for backward",
    "cuda_reserve": "a GPU of the hardware table: the CUDA context, cuDNN's and cuBLAS's handles and workspaces",
    "allocator": "a GPU of the hardware table: the caching allocator's rounding and fragmentation (of activations)",
}
# Calibrated on half of timm's RTX 3090 training benchmark (bench/plan_vs_published.py: the largest batch of its retry
# sequence that fit 24 GiB, AMP, SGD); held out: 92.8% of 320 models exact, 99.4% within one step (README).
CUDA_RESERVE = 32 * 2**20  # bytes, whatever the batch
ALLOCATOR_FRACTION = 0.115  # of the activations (and inputs) measured on meta
# Measured / predicted throughput of the median model, p50 and p90 errors the band (docs/guides/speed.md)
MEDIAN_RATIO = {"infer": (0.457, 2.19, 3.28), "train": (0.312, 3.20, 4.54)}
_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(frozen=True)
class PlanOptions:
    """What a plan is of: zoo.plan's keyword arguments, checked together before any model is built."""

    hardware: Any = None  # a device of catalog/hardware.csv, "cpu", or bytes ("24GiB", 24 * 2**30)
    devices: int = 1
    training: bool = False
    batch: int | None = None  # per device; None: the plan at max_batch
    seq_len: int | None = None
    input_size: tuple[int, ...] | None = None  # a vision model's (C, H, W), in place of its row's
    dtype: str | None = None  # default: amp-bf16 training, bf16 inference
    optimizer: str | None = None  # default: adamw training
    fsdp: int = 1
    tp: int = 1
    checkpointing: bool = False
    kv_dtype: str | None = None

    @classmethod
    def of(cls, options: dict) -> PlanOptions:
        """The options from keyword arguments; an unknown one is refused with the known ones named."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(options) - set(known)):
            raise InvalidArgument(f"unknown plan option {', '.join(unknown)}: the options are {', '.join(known)}")
        return cls(**options)

    def checked(self) -> PlanOptions:
        """The options with their defaults filled in, once every one is valid (InvalidArgument otherwise)."""
        if self.hardware is None:
            raise InvalidArgument("give hardware: a device ('H100', 'RTX 4090'), 'cpu' or bytes ('24GiB')", "hardware")
        hardware_of(self.hardware)  # HardwareNotFound before any model is built
        for label in ("devices", "fsdp", "tp", "batch", "seq_len"):
            value = getattr(self, label)
            if (value is not None or label in ("devices", "fsdp", "tp")) and not _whole(value):
                raise InvalidArgument(f"{label} must be a whole number from 1 to 2**31 - 1, not {value!r:.40}", label)
        if self.devices % (self.fsdp * self.tp):
            raise InvalidArgument(
                f"devices ({self.devices}) must be a multiple of fsdp x tp ({self.fsdp} x {self.tp}): the devices are "
                "DDP replicas of FSDP groups of TP groups",
                "devices",
            )
        dtype = str(self.dtype or ("amp-bf16" if self.training else "bf16")).lower().removeprefix("torch.")
        if dtype not in PRECISIONS:
            raise InvalidArgument(f"dtype must be one of {', '.join(PRECISIONS)}, not {self.dtype!r:.40}", "dtype")
        optimizer = (self.optimizer or "adamw") if self.training else None
        if optimizer is not None and optimizer not in STATES:
            raise InvalidArgument(f"optimizer must be one of {', '.join(STATES)}, not {optimizer!r:.40}", "optimizer")
        if self.checkpointing and not self.training:
            raise InvalidArgument("checkpointing applies to training: give training=True with it", "checkpointing")
        size = self.input_size
        if size is not None and not (
            isinstance(size, (list, tuple)) and len(size) == 3 and all(_whole(d) for d in size)
        ):
            raise InvalidArgument(f"input_size must be (channels, height, width), not {size!r:.40}", "input_size")
        if self.kv_dtype is not None and self.training:
            raise InvalidArgument("kv_dtype applies to inference: leave it unset with training=True", "kv_dtype")
        return replace(self, dtype=dtype, optimizer=optimizer, input_size=tuple(size) if size else None)


@dataclass(frozen=True)
class Hardware:
    name: str
    capacity: int  # bytes
    device: Device | None = None  # peak FLOP/s and bandwidth, for the step time
    interconnect: float | None = None  # bytes/s each way between two devices


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value < 2**31


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().replace("nvidia", "").replace("geforce", ""))


def load_devices(path=HARDWARE) -> dict[str, Hardware]:
    """The devices of the hardware table by every name they go by (normalized: case, spaces and hyphens aside)."""
    import csv

    devices = load_hardware(path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, Hardware] = {}
    for row in rows:
        ic = (row.get("interconnect_gbs") or "").strip()
        hw = Hardware(
            row["device"],
            int(float(row["memory_gib"]) * 2**30),
            devices[row["column"]],
            float(ic) * 1e9 if ic else None,
        )
        for name in [row["device"], row["column"], *(row.get("aliases") or "").split(";")]:
            if name.strip():
                out.setdefault(_key(name), hw)
    return out


def ram_bytes() -> int:
    """This machine's physical memory (hardware="cpu")."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def hardware_of(value) -> Hardware:
    """A device by any of its names, "cpu", or an amount of memory: bytes, or text with a unit ("24GiB", "80 GB")."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return Hardware(f"{value} bytes", value)
    text = str(value).strip()
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)", text.lower()):
        return Hardware(text, int(float(m.group(1)) * _UNITS[m.group(2)]))
    if text.lower() == "cpu":
        return Hardware("cpu (this machine's RAM)", ram_bytes())
    devices = load_devices()
    if _key(text) in devices:
        return devices[_key(text)]
    names = sorted({h.name for h in devices.values()})
    close = [n for n in names if _key(text) and _key(text) in _key(n)] or difflib.get_close_matches(text, names, 5, 0.4)
    raise HardwareNotFound(text, close or names)


@dataclass(frozen=True)
class Activations:
    """Activation bytes per device as c + batch x (a x seq + q x seq^2), and the KV cache per token."""

    c: float
    a: float
    q: float
    kv_per_token: float
    seq: int | None

    def at(self, batch: int, seq: int | None) -> int:
        s = seq or 1
        return math.ceil(self.c + batch * (self.a * s + self.q * s * s))


def fit_activations(measure: Callable[[int, int | None], tuple[int, int]], seq: int | None) -> Activations:
    """Fit from measure(batch, seq) -> (activations + inputs, kv_cache) at (b, s), (2b, s) and, with a sequence,
    (b, 2s): exact wherever the model is affine in batch. b is 1, or 2 where BatchNorm refuses a batch of one."""
    try:
        b, (first, kv) = 1, measure(1, seq)
    except AnalysisError:  # measured at 2 and 4 instead; fails as batch 1 did where that was not the reason
        b, (first, kv) = 2, measure(2, seq)
    per_sample = (measure(2 * b, seq)[0] - first) / b
    if seq is None:
        return Activations(first - b * per_sample, per_sample, 0.0, 0.0, None)
    longer = (measure(b, 2 * seq)[0] - (first - b * per_sample)) / b  # per sample at 2s
    q = max(0.0, (longer - 2 * per_sample) / (2 * seq * seq))  # a x 2s + q x 4s^2 = longer, a x s + q x s^2 = per
    return Activations(first - b * per_sample, (per_sample - q * seq * seq) / seq, q, kv / (b * seq), seq)


def measurer(estimate: Callable[..., Any], o: PlanOptions) -> Callable[[int, int | None], tuple[int, int]]:
    """measure(batch, seq_len) -> (activations + inputs, kv_cache) from zoo.estimate of one module with the plan's
    dtype (amp-*: under autocast to its compute dtype, but for FSDP2), training, optimizer, checkpointing, kv_dtype
    and input_size."""
    o = o.checked()
    kw = dict(dtype=PRECISIONS[o.dtype or "bf16"][2], training=o.training, optimizer=o.optimizer or "none")
    kw |= dict(amp=True) if autocast(o) else {}
    kw |= dict(input_size=tuple(o.input_size)) if o.input_size else {}

    def measure(batch: int, seq_len: int | None) -> tuple[int, int]:
        e = estimate(batch=batch, seq_len=seq_len, checkpointing=o.checkpointing, kv_dtype=o.kv_dtype, **kw)
        return e.activations + e.inputs, e.kv_cache

    return measure


def autocast(o: PlanOptions) -> bool:
    """Whether the step runs under torch.autocast over fp32 parameters (amp-* without FSDP2, whose
    MixedPrecisionPolicy casts the parameters instead): its weight casts are then measured with the activations."""
    return o.dtype in ("amp-bf16", "amp-fp16") and o.fsdp == 1


def _chunk(rows: int, ranks: int, rank: int) -> tuple[int, int]:
    """(rows held, rows stored) by `rank` of a dim of `rows` split as torch.chunk (and fully_shard) splits it."""
    size = -(-rows // ranks)
    return max(0, min(size, rows - rank * size)), size


def _tp_split(name: str, shape: tuple, tp: int, rank: int = 0) -> tuple:
    """A tensor's shape on TP rank `rank`, split as DTensor's Shard splits it: torch.chunk, unpadded (rank 0 most)."""
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 else ""
    if tp == 1 or not shape:
        return shape
    if module in TP_COLWISE:
        return (_chunk(shape[0], tp, rank)[0], *shape[1:])
    if module in TP_ROWWISE and parts[-1] == "weight" and len(shape) == 2:
        return (shape[0], _chunk(shape[1], tp, rank)[0])
    return shape


def model_states(tensors: Sequence, o: PlanOptions, rank: int = 0) -> dict[str, int]:
    """Weights, gradients and optimizer states on device `rank` of an (fsdp, tp) mesh (FSDP rank rank // tp, TP rank
    rank % tp) of a tensor table (zoo.inspection.TensorInfo rows), as the module docstring counts them. Rank 0 most."""
    compute, master, _ = PRECISIONS[o.dtype or "bf16"]
    k = STATES[o.optimizer] if o.training and o.optimizer else 0
    out = {"weights": 0, "gradients": 0, "optimizer": 0}
    for t in tensors:
        if t.tied_to is not None:
            continue
        floating = t.dtype in _BYTES
        if t.kind != "parameter":
            out["weights"] += t.numel * (
                (compute if master == compute else 4) if floating else t.bytes // max(t.numel, 1)
            )
            continue
        shape = _tp_split(t.name, tuple(t.shape), o.tp, rank % o.tp)
        rest = math.prod(shape[1:]) if shape else 1
        held, stored = _chunk(shape[0], o.fsdp, rank // o.tp) if shape else (1, 1)  # fsdp=1: the whole dim
        out["weights"] += stored * rest * master
        if o.training:
            out["gradients"] += stored * rest * master
            out["optimizer"] += k * held * rest * master + STEP_BYTES[o.optimizer or "none"]
    return out


def blocks(tensors: Sequence) -> tuple[list[int], int]:
    """The parameters' element counts of each block of the longest stack of repeated blocks (names `stack.N.`),
    and of the rest: FSDP2's units when each block and the root are fully_shard-ed."""
    stacks: dict[str, dict[str, int]] = {}
    params = [t for t in tensors if t.kind == "parameter" and t.tied_to is None]
    for t in params:
        parts = t.name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part.isdigit():
                prefix = ".".join(parts[:i])
                stacks.setdefault(prefix, {}).setdefault(part, 0)
                stacks[prefix][part] += t.numel
                break
    if not stacks:
        return [], sum(t.numel for t in params)
    best = max(stacks, key=lambda p: len(stacks[p]))
    counts = list(stacks[best].values())
    return counts, sum(t.numel for t in params) - sum(counts)


def other_bytes(tensors: Sequence, o: PlanOptions, states: dict[str, int]) -> dict[str, int]:
    """The terms of OTHER that apply to this layout."""
    compute, master, _ = PRECISIONS[o.dtype or "bf16"]
    out = {}
    if o.fsdp > 1:
        counts, root = blocks(tensors)
        largest = max(counts, default=0)
        out["fsdp_gathered"] = (root + 2 * largest) * compute // o.tp + (largest * compute // o.tp if o.training else 0)
    elif master != compute and not autocast(o):
        params = sum(t.numel for t in tensors if t.kind == "parameter" and t.tied_to is None)
        out["amp_copies"] = params * compute // o.tp if o.training else 0
    if o.training and o.devices // (o.fsdp * o.tp) > 1 and o.fsdp == 1:
        out["ddp_buckets"] = states["gradients"]
    return out


@dataclass(frozen=True)
class Plan:
    """A run planned on one device of a layout; every byte figure is per device (see zoo.planning's docstring).

    per_device: weights, gradients, optimizer, activations, kv_cache, other and total, in bytes. capacity: the
    device's memory. max_batch: the largest per-device batch that fits with everything else as given (0: none
    does). max_context, max_tokens (inference of a model with a KV cache): the longest sequence that fits at this
    batch, and the tokens the KV cache can hold beside the rest. step_seconds: predicted (the roofline over the
    median model's measured fraction of it, plus communication), None with the reason in notes.
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
    """Compute (roofline / median fraction) alongside FSDP's or DDP's collectives, then TP's all-reduces."""
    if hw.device is None:
        notes.append("step_seconds: none for hardware given as bytes or cpu (no peak FLOP/s or bandwidth)")
        return None
    numbers: dict[str, Any] = {k: getattr(row, k, None) for k in INPUTS} if row is not None else {}
    row_seq = _row_seq(row)
    if seq and row_seq and all(isinstance(v, (int, float)) for v in numbers.values()):
        numbers = {k: float(v) * seq / row_seq for k, v in numbers.items()}  # linear in tokens: no s^2 term
    mode = "train" if o.training else "infer"
    compute_bytes, master_bytes, _ = PRECISIONS[o.dtype or "bf16"]
    try:
        est = predict(numbers, replace(hw.device, mode=mode, element_bytes=compute_bytes), batch)
    except InvalidArgument as e:
        notes.append(f"step_seconds: none ({e})")
        return None
    ratio, p50, p90 = MEDIAN_RATIO[mode]
    compute = batch / est.samples_per_s / o.tp / ratio
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
    notes.append(
        f"step_seconds: roofline / {ratio} (the median model's measured fraction, {mode}); the median model is "
        f"within x{p50} of it, 90% within x{p90} (docs/guides/speed.md); communication at the listed interconnect"
    )
    return max(compute, comm) + tp_comm


def _row_seq(row) -> int | None:
    inputs = getattr(row, "inputs", None) or []
    shape = inputs[0].get("shape") if inputs and isinstance(inputs[0], dict) else None
    return shape[1] if getattr(row, "kv_bytes_per_token", None) is not None and shape and len(shape) == 2 else None


def plan(
    name: str,
    tensors: Sequence,
    row,
    options: PlanOptions,
    measure: Callable[[int, int | None], tuple[int, int]],
) -> Plan:
    """The Plan of a model: its tensor table and registry row (a ModelInfo, or None for a module without one),
    `measure(batch, seq_len) -> (activation + input bytes, kv_cache bytes)` on one device (zoo.estimate on meta).

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
    seq = o.seq_len or _row_seq(row)
    act = measured = fit_activations(measure, seq)
    states = model_states(tensors, o)
    other = other_bytes(tensors, o, states) | ({"cuda_reserve": CUDA_RESERVE} if hw.device else {})
    if hw.device and ALLOCATOR_FRACTION:
        act = replace(act, **{k: getattr(act, k) * (1 + ALLOCATOR_FRACTION) for k in ("c", "a", "q")})
    fixed = sum(states.values()) + sum(other.values())

    def total(batch: int, s: int | None = seq) -> int:
        return fixed + act.at(batch, s) + math.ceil(batch * (s or 0) * act.kv_per_token)

    per_sample = act.a * (seq or 1) + act.q * (seq or 1) ** 2 + (seq or 0) * act.kv_per_token
    max_batch = _solve(fixed + math.ceil(act.c), per_sample, hw.capacity)
    while max_batch and total(max_batch) > hw.capacity:  # ceil of the sum vs the sum of ceils
        max_batch -= 1
    while max_batch < 2**31 - 1 and total(max_batch + 1) <= hw.capacity:
        max_batch += 1
    batch = o.batch or max(max_batch, 1)
    max_context = max_tokens = None
    if act.kv_per_token and not o.training:
        lo, hi = 0, 2**31 - 1  # the longest sequence at this batch: total grows with it
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if total(batch, mid) <= hw.capacity else (lo, mid - 1)
        max_context = lo
        spare = hw.capacity - fixed - act.at(batch, seq)
        max_tokens = max(0, int(spare // act.kv_per_token))
    if act is not measured:
        other["allocator"] = act.at(batch, seq) - measured.at(batch, seq)
    parts = {
        **states,
        "activations": measured.at(batch, seq),
        "kv_cache": math.ceil(batch * (seq or 0) * act.kv_per_token),
        "other": sum(other.values()),
    }
    parts["total"] = sum(parts.values())
    notes = [f"other: {k} ({OTHER[k]})" for k, v in other.items() if v]
    if o.tp > 1:
        notes.append(f"tp: column-parallel {', '.join(TP_COLWISE)}; row-parallel {', '.join(TP_ROWWISE)}")
    params = sum(t.numel for t in tensors if t.kind == "parameter" and t.tied_to is None)
    step = _step_seconds(row, o, hw, batch, seq, params, notes)
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
        other=other,
        notes=tuple(notes),
    )
