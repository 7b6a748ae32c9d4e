"""estimate: the memory to run a model at a batch, dtype and optimizer, measured by running it on meta:
weights (optionally weight-only quantized), KV cache, activations and the peak."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
from torch import nn

from zoo.analysis.autocast import MetaAutocast
from zoo.analysis.forward import accepts, device_context, loss_of, train_mode
from zoo.analysis.inputs import has_sequence, input_spec_of, make_inputs, tensor_leaves
from zoo.analysis.meters import LiveBytes, known_storages, replay_peak, storage_key
from zoo.dtypes import FLOAT_NAMES, float_dtype
from zoo.errors import AnalysisError, InvalidArgument, reason
from zoo.inspection import dtype_name, named_tensors

# What the KV cache may be held in (serving engines quantize it apart from the weights): bytes per element.
KV_DTYPES = {
    **{k: getattr(torch, v).itemsize for k, v in FLOAT_NAMES.items()},
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}
# Weight-only quantization formats (inference): bits per element of a quantized tensor. Their bytes:
#   int8, int4: ceil(elements x bits / 8) + an fp16 scale per group of `group_size` elements along each
#               row's last (input) dimension: rows x ceil(columns / group_size) x 2 bytes (symmetric, as
#               GPTQ/AWQ-style group quantization; no zero points).
#   fp8:        elements x 1 + one fp32 scale per tensor (4 bytes).
# Quantized tensors: the weight of every nn.Linear but the output head, and every parameter of 2+
# dimensions of an `experts` module (fused MoE experts); embeddings, norms, biases, the output head and
# buffers stay at `dtype`, as GPTQ/AWQ checkpoints keep them.
QUANTIZED = {"int8": 8, "int4": 4, "fp8": 8}
SCALE_BYTES = 2  # fp16 group scale (int8, int4)
FP8_SCALE_BYTES = 4  # fp32 per-tensor scale


@dataclass(frozen=True)
class Estimate:
    """Bytes to run a model, measured from meta runs at this batch and dtype.

    weights: parameters and buffers. gradients: one per trainable parameter (training).
    optimizer_states: what the optimizer keeps (adamw: exp_avg and exp_avg_sq per parameter, in
    the parameter's dtype, plus a step counter; sgd: a momentum buffer). inputs: the batch.
    activations: the peak of live activation bytes (layer outputs, tensors saved for backward,
    their gradients, temporaries; gradients of weights excluded), measured over the meta forward
    (inference) or forward + backward + optimizer step (training).
    total: the measured peak of everything together. Gradients accumulate while saved activations
    are freed, so total <= the sum of the parts (upper_bound).
    """

    name: str
    batch: int
    dtype: str
    training: bool
    optimizer: str | None
    seq_len: int | None
    weights: int
    gradients: int
    optimizer_states: int
    inputs: int
    activations: int
    total: int
    # kv_cache: the cache an inference forward with use_cache=True leaves behind (transformers models),
    # its elements at kv_dtype; not part of `activations`. weights_dtype: a weight-only quantization
    # (QUANTIZED) with its group size. checkpointing: each repeated block recomputed in backward.
    kv_cache: int = 0
    kv_dtype: str | None = None
    weights_dtype: str | None = None
    group_size: int | None = None
    checkpointing: bool = False
    notes: tuple = field(default_factory=tuple)

    @property
    def upper_bound(self) -> int:
        return self.weights + self.gradients + self.optimizer_states + self.inputs + self.activations + self.kv_cache

    def as_dict(self) -> dict:
        return {**asdict(self), "notes": list(self.notes), "upper_bound": self.upper_bound}  # as JSON reads back


OPTIMIZERS = ("adamw", "adam", "sgd", "none")


def make_optimizer(name: str, params):
    if name in ("adamw", "adam"):
        cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-3, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False)
    if name == "none":
        return None
    raise AnalysisError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {name!r}")


def _nbytes_distinct(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def quantized_bytes(t: torch.Tensor, fmt: str, group_size: int) -> int:
    """Bytes of one tensor in a weight-only format, by the formula stated at QUANTIZED."""
    numel = t.numel()
    if fmt == "fp8":
        return numel + FP8_SCALE_BYTES
    columns = t.shape[-1]
    groups = (numel // columns) * math.ceil(columns / group_size)
    return math.ceil(numel * QUANTIZED[fmt] / 8) + groups * SCALE_BYTES


def quantized_tensors(module: nn.Module) -> list[torch.Tensor]:
    """The tensors a weight-only quantization stores quantized (see QUANTIZED)."""
    head = None
    get_head = getattr(module, "get_output_embeddings", None)
    if callable(get_head):
        with contextlib.suppress(Exception):
            head = get_head()
    head_weight = getattr(head, "weight", None)
    found = {}
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear) and sub is not head and sub.weight is not head_weight:
            found[id(sub.weight)] = sub.weight
        elif name.rsplit(".", 1)[-1] == "experts":
            for p in sub.parameters():
                if p.dim() >= 2:
                    found[id(p)] = p
    return list(found.values())


def weight_bytes(module: nn.Module, fmt: str | None = None, group_size: int = 128) -> int:
    """Parameters and buffers, distinct tensors once; with fmt, the quantized ones by its formula."""
    if fmt is None:
        return _nbytes_distinct([*module.parameters(), *module.buffers()])
    quantized = {id(t): t for t in quantized_tensors(module)}
    rest = [t for t in [*module.parameters(), *module.buffers()] if id(t) not in quantized]
    return _nbytes_distinct(rest) + sum(quantized_bytes(t, fmt, group_size) for t in quantized.values())


def cache_tensors(value, depth: int = 4) -> list[torch.Tensor]:
    """The tensors of a transformers cache object (DynamicCache: layers[i].keys / .values; an
    encoder-decoder's self- and cross-attention caches)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth == 0 or value is None or isinstance(value, (str, int, float, bool)):
        return []
    items: Iterable[Any]
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "__dict__"):
        items = vars(value).values()
    else:
        return []
    return [t for v in items for t in cache_tensors(v, depth - 1)]


def measure_step(
    module: nn.Module,
    args: list,
    kwargs: dict,
    training: bool,
    optimizer: str | None,
    weights_dtype: str | None = None,
    group_size: int = 128,
    kv_bytes: int | None = None,
) -> dict:
    """Run one inference forward, or one training step (forward, backward, optimizer step) in steady
    state (optimizer states already there), under LiveBytes; works on meta and on real devices alike.
    Returns weights, gradients, optimizer_states, inputs, activations, total, kv_cache (bytes).

    Inference of a model whose forward takes use_cache runs with it, as a generate() prefill does (and
    with logits_to_keep=1 where taken: the prefill needs the last position's logits only): the cache it
    leaves is kv_cache, its elements at `kv_bytes` each (their own width if None), apart from the
    activations; the peak is replayed with the cache at that width."""
    params = [p for p in module.parameters()]
    weights = weight_bytes(module, weights_dtype, group_size)
    inputs = _nbytes_distinct(list(tensor_leaves((args, kwargs))))
    if not training:
        kwargs = dict(kwargs)
        cached = accepts(module, "use_cache")
        if cached:
            kwargs.setdefault("use_cache", True)
            if accepts(module, "logits_to_keep"):
                kwargs.setdefault("logits_to_keep", 1)
        known = known_storages(module, args, kwargs)
        log: list = []
        with device_context(module), train_mode(module, False), torch.no_grad():
            with LiveBytes(known, log=log) as live:
                out = module(*args, **kwargs)
                fields = getattr(out, "__dict__", {})  # `cache` (transformers 5.2x; the old name's property warns)
                cache = cache_tensors(fields.get("cache", fields.get("past_key_values"))) if cached else []
                held = {}
                for t in cache:
                    key, st = storage_key(t)
                    if key in live.serial:
                        held[live.serial[key]] = (st.nbytes(), t.element_size())
                del out, cache
        kv = sum(n * (kv_bytes or size) // size for n, size in held.values())
        activations = replay_peak(log, {k: 0 for k in held})
        peak = replay_peak(log, {k: (kv_bytes or size) / size for k, (n, size) in held.items()})
        return dict(
            weights=weights,
            gradients=0,
            optimizer_states=0,
            inputs=inputs,
            activations=activations,
            total=weights + inputs + peak,
            kv_cache=kv,
        )
    trainable = [p for p in {id(p): p for p in params}.values() if p.requires_grad]
    opt = make_optimizer(optimizer or "none", trainable)
    states = 0
    if opt is not None:  # steady state: the states exist before the measured step, as from step 2 on
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        states = _nbytes_distinct([v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])
    gradients = _nbytes_distinct(trainable)
    known = known_storages(module, args, kwargs)
    for s in opt.state.values() if opt is not None else ():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                key, _ = storage_key(v)
                known.add(key)
    live = LiveBytes(known)
    hooks = [
        p.register_post_accumulate_grad_hook(lambda p: live.add_grad(p.grad.numel() * p.grad.element_size()))
        for p in trainable
    ]
    try:
        with device_context(module), train_mode(module, True), torch.enable_grad(), live:
            out = module(*args, **kwargs)
            loss = loss_of(out)
            del out
            if loss is not None:
                loss.backward()
                del loss
            if opt is not None:
                opt.step()
            for p in trainable:  # zero_grad(set_to_none=True): the next step starts without them
                p.grad = None
    finally:
        for h in hooks:
            h.remove()
    return dict(
        weights=weights,
        gradients=gradients,
        optimizer_states=states,
        inputs=inputs,
        activations=live.peak_without_grads,
        total=weights + states + inputs + live.peak,
        kv_cache=0,
    )


# A checkpointed block keeps no KV cache, as transformers turns the cache off under gradient checkpointing:
# the recomputation in backward would append to it a second time.
_CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past", "cache")


def _checkpointed_call(checkpoint, module, forward, *args, **kwargs):
    kwargs.update({k: None for k in _CACHE_KWARGS if k in kwargs})
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    # the recomputation in backward runs outside the forward's torch-function modes: it gets fused attention
    # again, so it recomputes what the forward saved (torch.device("meta") cannot be re-entered there)
    return checkpoint(
        forward,
        *args,
        use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), _recompute_context(module)),
        **kwargs,
    )


def _recompute_context(module):
    from zoo.analysis.meters import FusedAttention

    meta = any(p.is_meta for p in module.parameters())
    return FusedAttention() if meta else contextlib.nullcontext()


@contextlib.contextmanager
def checkpointed(module: nn.Module):
    """Activation checkpointing: each block of the model's longest stack of repeated blocks (an
    nn.ModuleList or nn.Sequential of one class: transformer layers, ViT blocks) runs under
    torch.utils.checkpoint (non-reentrant), which keeps its inputs and recomputes the rest in backward.
    The blocks' forwards are restored afterwards."""
    from torch.utils.checkpoint import checkpoint

    best: list[nn.Module] = []
    for sub in module.modules():
        if isinstance(sub, (nn.ModuleList, nn.Sequential)) and len(sub) >= 2:
            kinds = {type(m) for m in sub}
            if len(kinds) == 1 and len(sub) > len(best):
                best = list(sub)
    if not best:
        raise AnalysisError(
            "activation checkpointing needs a stack of repeated blocks (an nn.ModuleList or "
            "nn.Sequential of one class), and this model has none"
        )
    for block in best:
        block.forward = functools.partial(_checkpointed_call, checkpoint, module, block.forward)
    try:
        yield module
    finally:
        for block in best:
            block.__dict__.pop("forward", None)


@contextlib.contextmanager
def cast_to(module: nn.Module, dtype: torch.dtype):
    """Cast a meta module's floating parameters and buffers to a dtype, and back afterwards: a module the
    caller handed in comes back as it was (on meta a cast allocates nothing). Parameters stay the same
    objects (their .data changes), so ties and optimizers' references hold."""
    saved = []

    def set_dtype(owner, local, is_param, dtype):
        if is_param:
            t = owner._parameters[local]
            t.data = t.data.to(dtype)
        else:
            owner._buffers[local] = owner._buffers[local].to(dtype)

    for kind in ("_parameters", "_buffers"):
        for _, owner, local, t in named_tensors(module, kind):
            if t.is_floating_point() and t.dtype != dtype:
                saved.append((owner, local, kind == "_parameters", t.dtype))
                set_dtype(owner, local, kind == "_parameters", dtype)
    try:
        yield module
    finally:
        for owner, local, is_param, original in reversed(saved):
            set_dtype(owner, local, is_param, original)


@dataclass(frozen=True)
class EstimateOptions:
    """What an estimate is of: zoo.estimate's keyword arguments, checked together before any model is built."""

    batch: int = 1
    dtype: Any = "bf16"
    training: bool = False
    optimizer: str = "adamw"
    seq_len: int | None = None
    kv_dtype: Any = None  # the KV cache's ("fp8"); default: dtype
    weights_dtype: Any = None  # weight-only quantization: "int8", "int4" (with group_size), "fp8"
    group_size: int = 128
    checkpointing: bool = False  # training with activation checkpointing
    amp: bool = False  # fp32 parameters, the forward under autocast to dtype (zoo.analysis.autocast)
    input_size: Any = None  # (C, H, W): a vision model's input, in place of its row's

    @classmethod
    def of(cls, options: dict) -> EstimateOptions:
        """The options from keyword arguments; an unknown one is refused with the known ones named."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(options) - set(known)):
            raise InvalidArgument(f"unknown estimate option {', '.join(unknown)}: the options are {', '.join(known)}")
        return cls(**options)

    def checked(self) -> torch.dtype:
        """The torch dtype of the forward, once every option is known to be valid (AnalysisError otherwise)."""
        for label, value in (("batch", self.batch), ("seq_len", self.seq_len), ("group_size", self.group_size)):
            if (value is not None or label == "batch") and (
                not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**31
            ):  # torch's sizes stay int64
                raise AnalysisError(f"{label} must be a whole number from 1 to 2**31 - 1, not {value!r:.40}")
        if self.training and self.optimizer not in OPTIMIZERS:
            raise AnalysisError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {self.optimizer!r}")
        if self.kv_dtype is not None and str(self.kv_dtype).lower() not in KV_DTYPES:
            raise AnalysisError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, not {self.kv_dtype!r}")
        if self.weights_dtype is not None:
            if str(self.weights_dtype).lower() not in QUANTIZED:
                raise AnalysisError(
                    f"weights_dtype (weight-only quantization) must be one of {', '.join(QUANTIZED)}, "
                    f"not {self.weights_dtype!r}; for float weights, set dtype"
                )
            if self.training:
                raise AnalysisError(
                    "weight-only quantization is for inference: leave weights_dtype unset with training=True"
                )
        if self.checkpointing and not self.training:
            raise AnalysisError("activation checkpointing applies to training: give training=True with it")
        size = self.input_size
        if size is not None and (
            not isinstance(size, (list, tuple)) or len(size) != 3 or not all(isinstance(d, int) and d > 0 for d in size)
        ):
            raise AnalysisError(f"input_size must be (channels, height, width), whole and positive, not {size!r:.40}")
        if self.amp and float_dtype(self.dtype) not in (torch.float16, torch.bfloat16):
            raise AnalysisError(f"amp autocasts to fp16 or bf16: give dtype='fp16' or 'bf16', not {self.dtype!r}")
        return float_dtype(self.dtype)


def estimate(module: nn.Module, name: str | None = None, **options) -> Estimate:
    """Memory to run a model at `batch` in `dtype`: weights, gradients, optimizer states, KV cache and
    activations, the activations measured by running the model on meta at that batch (not scaled from batch 1).

    Inference of a transformers model runs its prefill with use_cache=True: the cache it keeps is the
    kv_cache term, at `kv_dtype` (default: `dtype`). `weights_dtype`: weight-only quantization of the
    weights term ("int8", "int4" with `group_size`, "fp8": formulas at QUANTIZED); the forward still runs
    at `dtype`, as dequantizing kernels do. Training measures a whole step (forward, backward from the
    sum of the outputs, optimizer step) with the optimizer's states already allocated, as in every step
    after the first; `checkpointing` recomputes each repeated block in backward (see checkpointed). `amp`: fp32
    parameters and inputs, the step under autocast to dtype (zoo.analysis.autocast); `input_size`: (C, H, W).
    """
    if not isinstance(module, nn.Module):
        raise AnalysisError(f"estimate takes a module, not {type(module).__name__}: use zoo.estimate for a name")
    return estimate_at(module, input_spec_of(module), name, **options)


def estimate_at(module: nn.Module, spec: dict | None, name: str | None = None, **options) -> Estimate:
    """estimate with the input spec given (zoo index has the spec of a module it built, which zoo.get does not know
    yet): the spec as zoo.analysis.inputs.described gives it."""
    o = EstimateOptions.of(options)
    tdtype = o.checked()
    weights_dtype = str(o.weights_dtype).lower() if o.weights_dtype is not None else None
    if not spec:
        raise AnalysisError("this model has no recorded input spec: estimate needs one to run its forward")
    if any(not (t.is_meta) for t in [*module.parameters(), *module.buffers()]):
        raise AnalysisError("estimate runs on meta: give a registered name or a module from zoo.get")
    if o.seq_len is not None and not has_sequence(spec):
        raise AnalysisError("seq_len applies to models with token inputs: this model's input has no sequence")
    if o.kv_dtype is not None and not accepts(module, "use_cache"):
        raise AnalysisError("kv_dtype applies to the inference of a model that keeps a KV cache; this one keeps none")
    if o.input_size is not None:
        image = [a for a in spec.get("args", []) if len(a["shape"] if isinstance(a, dict) else a) == 3]
        if has_sequence(spec) or spec.get("kwargs") or len(spec.get("args", [])) != 1 or not image:
            raise AnalysisError("input_size applies to a model of one image input (channels, height, width)")
        spec = {"args": [list(o.input_size)]}
    args, kwargs = make_inputs(spec, batch=o.batch, seq_len=o.seq_len, dtype=torch.float32 if o.amp else tdtype)
    kv_bytes = KV_DTYPES[str(o.kv_dtype).lower()] if o.kv_dtype is not None else None
    precision = MetaAutocast(tdtype) if o.amp else cast_to(module, tdtype)
    try:
        with precision, checkpointed(module) if o.checkpointing else contextlib.nullcontext():
            parts = measure_step(
                module,
                args,
                kwargs,
                o.training,
                o.optimizer if o.training else None,
                weights_dtype,
                o.group_size,
                kv_bytes,
            )
    except AnalysisError:
        raise
    except Exception as e:
        raise AnalysisError(f"the model cannot run on meta, so nothing is estimated: {reason(e)}") from e
    notes = []
    if weights_dtype:
        notes.append(
            f"weights: {weights_dtype} weight-only "
            + (
                "with one fp32 scale per tensor"
                if weights_dtype == "fp8"
                else f"with an fp16 scale per group of {o.group_size}"
            )
            + f"; output head, embeddings, norms at {dtype_name(tdtype)}"
        )
    if parts["kv_cache"]:
        latent = getattr(getattr(module, "config", None), "kv_lora_rank", None)  # DeepSeek's multi-latent attention
        notes.append(
            "kv_cache: what transformers' cache holds after the prefill"
            + (
                " (multi-latent attention: its decompressed keys and values, more than a latent cache)"
                if latent
                else ""
            )
        )
    return Estimate(
        name=name or type(module).__name__,
        batch=o.batch,
        dtype=dtype_name(tdtype),
        training=o.training,
        optimizer=o.optimizer if o.training else None,
        seq_len=o.seq_len if o.seq_len is not None else spec.get("seq_len"),
        **parts,
        kv_dtype=(str(o.kv_dtype).lower() if o.kv_dtype is not None else dtype_name(tdtype))
        if parts["kv_cache"]
        else None,
        weights_dtype=weights_dtype,
        group_size=o.group_size if weights_dtype in ("int8", "int4") else None,
        checkpointing=o.checkpointing,
        notes=tuple(notes),
    )
