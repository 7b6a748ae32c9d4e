"""Analysis without weights: FLOPs, activation memory and output shapes from forwards on the meta device.

Nothing here reads a weight or allocates one: a model built on meta runs its own forward on meta
tensors, which computes every shape and dtype and no value. Three things are measured:

* FLOPs and MACs: ``torch.utils.flop_counter.FlopCounterMode`` over an inference forward at
  batch 1. It counts 2 FLOPs per multiply-accumulate in matmuls, convolutions and attention
  (and nothing for elementwise ops, norms or pooling), so ``macs = flops // 2`` and MACs are what
  torchvision publishes as "GFLOPS".
* Activation bytes: in training mode, the tensors autograd saves for backward
  (``torch.autograd.graph.saved_tensors_hooks``), counted once per storage; in inference, the peak
  of live activation storages during an eval, no-grad forward (``LiveBytes``, below). Weights,
  buffers and the model's inputs are not activations and are not counted.
* Output shapes and dtypes of the model's output (``analyze``) or of every module (``scan``).

A forward that cannot run on meta (data-dependent shapes such as ``nonzero`` in detection
post-processing, ``.item()`` on an activation, an op with no meta kernel) is recorded as an error
with its reason: nothing is faked and nothing is estimated.

Input specs (a family's ``describe(...)["input"]``), JSON data::

    {"args": [ARG, ...], "kwargs": {"name": ARG}, "seq_len": 128}

where ARG is a shape without the batch (``[3, 224, 224]``: a float tensor of shape
``[batch, 3, 224, 224]``) or ``{"shape": [...], "dtype": "int64", "list": true, "batch": true}``:
``list`` gives a Python list of ``batch`` tensors of that shape (torchvision detection),
``batch: false`` leaves the shape as written, and a ``"seq"`` entry in a shape is the sequence length
(``seq_len`` by default, ``estimate(seq_len=...)`` to change it).
"""

from __future__ import annotations

import json
import time
import traceback
import weakref
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from zoo.errors import ZooError
from zoo.inspection import dtype_name

SCAN_OK, SCAN_ERROR, SCAN_NO_INPUT = "ok", "error", "no-input"
DEFAULT_BUDGET_S = 120.0  # per model at index time; a forward past it is recorded as an error, not waited for
DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp64": torch.float64, "float64": torch.float64,
}


class AnalysisTimeout(RuntimeError):
    """The meta forward ran past its time budget."""


class AnalysisError(ZooError, ValueError):
    """scan / estimate cannot run: no input spec, a module not on meta, a bad dtype or optimizer."""


# --------------------------------------------------------------------------------------------
# Inputs


def make_inputs(spec: dict, batch: int = 1, seq_len: int | None = None, dtype=None) -> tuple[list, dict]:
    """The (args, kwargs) an input spec describes, on meta. Float tensors take `dtype` (float32 by
    default); integer ones (token ids) stay integers."""
    seq = seq_len if seq_len is not None else spec.get("seq_len")

    def one(arg):
        if isinstance(arg, (list, tuple)):
            arg = {"shape": list(arg)}
        shape = []
        for d in arg["shape"]:
            if d == "seq":
                if seq is None:
                    raise AnalysisError("the input has a sequence dimension: give seq_len")
                d = seq
            shape.append(int(d))
        kind = getattr(torch, arg["dtype"]) if arg.get("dtype") else None
        float_dtype = kind is None or kind.is_floating_point
        tdtype = (dtype or torch.float32) if float_dtype else kind

        def tensor(s):
            return torch.empty(s, dtype=tdtype, device="meta")

        if arg.get("list"):
            return [tensor(shape) for _ in range(batch)]
        return tensor([batch, *shape] if arg.get("batch", True) else shape)

    return [one(a) for a in spec.get("args", [])], {k: one(v) for k, v in spec.get("kwargs", {}).items()}


def input_spec_of(module: nn.Module) -> dict | None:
    """The input spec of a module that zoo.get built (its family's describe()); None if it has none."""
    recipe = getattr(module, "_zoo_recipe", None)
    if recipe is None:
        return None
    from zoo.families import family

    return family(recipe.family).describe(recipe.builder, module).get("input")


def _as_input(value):
    """A scan input: a shape (tuple / torch.Size of ints) becomes a meta tensor; tensors go to meta."""
    if isinstance(value, torch.Tensor):
        return value if value.is_meta else value.to("meta")
    if isinstance(value, (tuple, torch.Size)) and all(isinstance(d, int) for d in value):
        return torch.empty(tuple(value), device="meta", dtype=torch.float32)
    if isinstance(value, (list, tuple)):
        return type(value)(_as_input(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_input(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------------------------
# Measuring


def _storage_key(t: torch.Tensor):
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, some subclasses
        return None, None
    return st._cdata, st


def _tensor_leaves(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensor_leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensor_leaves(v)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the storages that ops create while it is active, as they live and die.

    Sound because every tensor an aten op creates passes through __torch_dispatch__ as an output,
    and PyTorch keeps a storage's Python object alive as long as its C++ storage lives (however
    many views share it, whoever holds it: autograd's saved tensors included), so a weakref
    finalizer on the storage fires exactly when the memory would be freed. Storages that existed
    before (weights, buffers, inputs, `known`) are not counted; a view of a counted storage adds
    nothing. On meta this is the allocation pattern of the same program on a real device, without
    allocator rounding, caching or kernels' internal workspaces.

    `grads`: bytes of gradients that have landed in .grad (add_grad) are tracked apart so the
    activation peak can be read without them. A `deadline` (time.perf_counter) stops a forward
    that runs too long.
    """

    def __init__(self, known=(), deadline: float | None = None):
        super().__init__()
        self.known = set(known)
        self.live: dict[int, int] = {}
        self.current = self.peak = 0
        self.grads = 0
        self.peak_without_grads = 0
        self.deadline = deadline

    def _free(self, key):
        self.current -= self.live.pop(key, 0)

    def add_grad(self, nbytes: int):
        self.grads += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise AnalysisTimeout("the meta forward ran past its time budget")
        for t in _tensor_leaves(out):
            key, st = _storage_key(t)
            if key is None or key in self.known:
                continue
            nbytes = st.nbytes()
            old = self.live.get(key)
            if old is None:
                self.live[key] = nbytes
                self.current += nbytes
                weakref.finalize(st, self._free, key)
            elif old != nbytes:  # resized in place (out= kernels)
                self.live[key] = nbytes
                self.current += nbytes - old
        if self.current > self.peak:
            self.peak = self.current
        if self.current - self.grads > self.peak_without_grads:
            self.peak_without_grads = self.current - self.grads
        return out


class FusedAttention(torch.overrides.TorchFunctionMode):
    """On meta, run scaled_dot_product_attention as the fused kernel a real device would pick.

    On meta, SDPA falls back to its math path, which materializes (and in training saves) the
    batch x heads x queries x keys attention matrix; on CPU (and CUDA) PyTorch runs a flash kernel
    that saves only the output and a log-sum-exp. Wherever PyTorch's own CPU selection
    (torch._fused_sdp_choice, asked with stride-0 stand-ins of the same shapes, dtypes and
    options) picks flash, this calls the same aten op CPU calls, whose meta kernel allocates as it
    does. Elsewhere (dropout, grouped heads, ...) the math path stays, as on CPU.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            fused = _flash_for_cpu(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _flash_for_cpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    tensors = [query, key, value] + ([attn_mask] if attn_mask is not None else [])
    if not all(isinstance(t, torch.Tensor) and t.is_meta for t in tensors) or query.dim() != 4:
        return None
    if key.size(1) != query.size(1) or attn_mask is not None and attn_mask.dtype == torch.bool:
        return None  # grouped heads and boolean masks: leave them to the math path, as they are

    def stand_in(t):  # CPU, one row of storage: the choice reads shapes, dtypes, the last stride, requires_grad
        row = torch.zeros((1,) * (t.dim() - 1) + (t.shape[-1],), dtype=t.dtype, device="cpu",
                          requires_grad=t.requires_grad and torch.is_grad_enabled())
        return row.expand(t.shape)

    from torch.nn.attention import SDPBackend

    try:
        choice = torch._fused_sdp_choice(stand_in(query), stand_in(key), stand_in(value),
                                         attn_mask=stand_in(attn_mask) if attn_mask is not None else None,
                                         dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    except (RuntimeError, ValueError, TypeError):  # shapes SDPA itself will refuse: let it say so
        return None
    if choice != int(SDPBackend.FLASH_ATTENTION):
        return None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _flash_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode has no formula for the CPU flash op: the one it has for the other fused kernels."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


class _GlobalOnly:
    """Stands in for FlopCounterMode's ModuleTracker: totals only. The tracker's per-module hooks cost
    time, and they assert on views of parameters made under no_grad (timm's CaiT class token)."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def flop_counter():
    """torch.utils.flop_counter.FlopCounterMode counting the whole forward (get_total_flops)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu_flops})
    counter.mod_tracker = _GlobalOnly()
    return counter


def _known_storages(module: nn.Module, *values) -> set[int]:
    keys = set()
    for t in [*module.parameters(), *module.buffers(), *_tensor_leaves(values)]:
        key, _ = _storage_key(t)
        if key is not None:
            keys.add(key)
    return keys


class SavedBytes:
    """Bytes autograd holds for backward, once per storage, weights and inputs excluded: `bytes` is what
    is still held now (a saved tensor of a graph branch that was dropped is freed with it)."""

    def __init__(self, known=(), deadline: float | None = None):
        self.known = set(known)
        self.held: dict[int, int] = {}
        self.bytes = 0
        self.deadline = deadline
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise AnalysisTimeout("the meta forward ran past its time budget")
        key, st = _storage_key(t)
        if key is not None and key not in self.known and key not in self.held:
            self.held[key] = st.nbytes()
            self.bytes += self.held[key]
            weakref.finalize(st, self._release, key)
        return t

    def _release(self, key):
        self.bytes -= self.held.pop(key, 0)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


class _mode:
    """Run a module in train or eval mode, restoring each submodule's own flag afterwards."""

    def __init__(self, module: nn.Module, training: bool):
        self.module, self.training = module, training

    def __enter__(self):
        self.saved = [(m, m.training) for m in self.module.modules()]
        self.module.train(self.training)

    def __exit__(self, *exc):
        for m, flag in self.saved:
            m.training = flag


def _device_context(module: nn.Module):
    """For a forward of a meta module: factory calls without a device land on meta too, and attention
    allocates as the fused kernel would (FusedAttention). A real module runs as it is."""
    import contextlib

    first = next(iter([*module.parameters(), *module.buffers()]), None)
    if first is not None and not first.is_meta:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.device("meta"))
    stack.enter_context(FusedAttention())
    return stack


def outputs_of(value, path: str = "") -> list:
    """[path, shape, dtype] for every tensor in a (nested) output; path "" for a lone tensor."""
    if isinstance(value, torch.Tensor):
        return [[path, list(value.shape), dtype_name(value.dtype)]]
    out = []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        fields = getattr(value, "_fields", None)
        items = zip(fields, value) if fields else enumerate(value)
    else:
        return out
    for k, v in items:
        out += outputs_of(v, f"{path}.{k}" if path else str(k))
    return out


def reason(e: BaseException) -> str:
    """One line: the exception, its message's first sentences, and the model code it came from."""
    message = " ".join(str(e).split())
    first = message.find(". ")  # the first sentence says what failed; the rest is advice on torch settings
    if first >= 40:
        message = message[: first + 1]
    if len(message) > 300:
        message = message[:300] + "..."
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    # The innermost frame outside torch and zoo: the model line that asked for the op.
    model = [f for f in frames if "/torch/" not in f.filename and "/zoo/" not in f.filename
             and "/site-packages/" in f.filename]
    at = ""
    if model:
        f = model[-1]
        at = f" (at {f.filename.rsplit('/site-packages/', 1)[-1]}:{f.lineno})"
    return f"{type(e).__name__}: {message}{at}"


def loss_of(output) -> torch.Tensor | None:
    """A scalar to run backward from: the sum of every floating output that requires grad."""
    terms = [t.float().sum() for t in _tensor_leaves(output) if t.is_floating_point() and t.requires_grad]
    return torch.stack(terms).sum() if terms else None


# --------------------------------------------------------------------------------------------
# Index-time analysis


@dataclass(frozen=True)
class Analysis:
    status: str  # "ok", "error" or "no-input"
    error: str | None = None
    flops: int | None = None  # batch 1, inference
    macs: int | None = None
    train_activation_bytes: int | None = None  # saved for backward, training mode, batch 1
    peak_activation_bytes: int | None = None  # peak live activations, inference, batch 1
    output_shapes: list | None = None  # [[path, shape, dtype], ...] of the inference output

    def columns(self) -> dict:
        """The registry columns (zoo.registry.tables.Model) this analysis fills."""
        return {
            "flops": self.flops, "macs": self.macs, "train_activation_bytes": self.train_activation_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
            "output_shapes": json.dumps(self.output_shapes, separators=(",", ":")) if self.output_shapes is not None else None,
            "scan_status": self.status, "scan_error": self.error,
        }


def analyze(module: nn.Module, spec: dict | None, budget_s: float | None = DEFAULT_BUDGET_S) -> Analysis:
    """Measure a meta module at batch 1 with its input spec; never raises for the model's sake.

    Two forwards: eval + no_grad under FlopCounterMode and LiveBytes (flops, inference peak,
    output shapes), then train mode with grad under SavedBytes (activation bytes saved for
    backward). The module's train/eval flags are restored; its tensors are not changed.
    """
    if not spec:
        return Analysis(SCAN_NO_INPUT)
    deadline = time.perf_counter() + budget_s if budget_s else None
    try:
        args, kwargs = make_inputs(spec, batch=1)
        known = _known_storages(module, args, kwargs)
        with _device_context(module), _mode(module, False), torch.no_grad():
            counter = flop_counter()
            live = LiveBytes(known, deadline)
            with counter, live:
                out = module(*args, **kwargs)
            shapes = outputs_of(out)
            del out
    except Exception as e:  # recorded, not raised: a model that cannot run on meta is a finding
        return Analysis(SCAN_ERROR, reason(e))
    flops = int(counter.get_total_flops())
    saved, error = None, None
    # A model that cannot take a training step at batch 1 (BatchNorm over a single value)
    # keeps its inference figures; the training figure stays empty, with the reason.
    try:
        args, kwargs = make_inputs(spec, batch=1)
        known = _known_storages(module, args, kwargs)
        with _device_context(module), _mode(module, True), torch.enable_grad():
            with SavedBytes(known, deadline) as sb:
                out = module(*args, **kwargs)
            saved = sb.bytes
            del out
    except Exception as e:
        error = f"training forward: {reason(e)}"
    return Analysis(SCAN_OK, error, flops, flops // 2, saved, live.peak, shapes)


# --------------------------------------------------------------------------------------------
# scan: per-module output shapes


@dataclass
class ModuleScan:
    name: str  # "" for the root
    type: str  # class name
    depth: int
    params: int  # distinct parameters of the module and its children
    param_bytes: int
    buffer_bytes: int
    outputs: list = field(default_factory=list)  # [[path, shape, dtype], ...] of its first call
    calls: int = 0  # forwards that returned
    entered: int = 0  # forwards that started (more than calls: the forward stopped inside it)

    @property
    def bytes(self) -> int:
        return self.param_bytes + self.buffer_bytes


@dataclass
class Scan:
    modules: list[ModuleScan]
    outputs: list  # the model's output: [[path, shape, dtype], ...]
    error: str | None = None  # strict=False: why the forward stopped; modules after that have no outputs

    def __getitem__(self, name: str) -> ModuleScan:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(name)

    def as_dict(self) -> dict:
        return {"outputs": self.outputs, "modules": [{**asdict(m), "bytes": m.bytes} for m in self.modules]}


def _resolve(name_or_module, registry=None) -> nn.Module:
    if isinstance(name_or_module, nn.Module):
        return name_or_module
    from zoo.api import Zoo

    zoo = registry if hasattr(registry, "get") else Zoo(registry)
    return zoo.get(name_or_module)


def _sizes(module: nn.Module) -> dict[str, tuple[int, int, int]]:
    """name -> (params, param_bytes, buffer_bytes) over distinct tensors of each module's subtree."""
    out = {}
    for name, mod in module.named_modules():
        params = {id(p): p for p in mod.parameters()}.values()
        buffers = {id(b): b for b in mod.buffers()}.values()
        out[name] = (sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params),
                     sum(b.numel() * b.element_size() for b in buffers))
    return out


def scan(name_or_module, *inputs, batch: int = 1, train: bool = False, registry=None, strict: bool = True,
         **kwargs) -> Scan:
    """Every module's output shapes and dtypes from one forward on meta: no weights, no values.

    `name_or_module`: a registered name (built with zoo.get) or any module on meta (one from
    zoo.get, or your own). `inputs`: tensors (moved to meta) or shapes (tuples of ints, made meta
    float32 tensors); none means the model's recorded input spec at `batch`. Keyword arguments go
    to the forward. Raises what the forward raises (a data-dependent op, a wrong shape), unless
    strict=False: then the modules that ran keep their outputs and Scan.error says why it stopped.
    """
    module = _resolve(name_or_module, registry)
    names = {id(m): n for n, m in module.named_modules()}
    sizes = _sizes(module)
    rows = {n: ModuleScan(n, type(m).__name__, n.count(".") + 1 if n else 0, *sizes[n]) for n, m in module.named_modules()}
    if inputs or kwargs:
        args, kw = [_as_input(i) for i in inputs], {k: _as_input(v) for k, v in kwargs.items()}
    else:
        spec = input_spec_of(module)
        if not spec:
            message = "this module has no recorded input: give inputs or shapes, e.g. scan(m, (1, 3, 224, 224))"
            if strict:
                raise AnalysisError(message)
            return Scan(list(rows.values()), [], message)
        args, kw = make_inputs(spec, batch=batch)

    def hook(mod, _inputs, output):
        row = rows[names[id(mod)]]
        row.calls += 1
        if row.calls == 1:
            row.outputs = outputs_of(output)

    def pre_hook(mod, _inputs):
        rows[names[id(mod)]].entered += 1

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    handles += [m.register_forward_pre_hook(pre_hook) for m in module.modules()]
    try:
        with _device_context(module), _mode(module, train), torch.set_grad_enabled(train):
            out = module(*args, **kw)
    except Exception as e:
        if strict:
            raise
        return Scan(list(rows.values()), [], reason(e))
    finally:
        for h in handles:
            h.remove()
    return Scan(list(rows.values()), outputs_of(out))


# --------------------------------------------------------------------------------------------
# estimate: memory for a batch, dtype and optimizer


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

    @property
    def upper_bound(self) -> int:
        return self.weights + self.gradients + self.optimizer_states + self.inputs + self.activations

    def as_dict(self) -> dict:
        return {**asdict(self), "upper_bound": self.upper_bound}


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


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise AnalysisError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}") from None


def measure_step(module: nn.Module, args: list, kwargs: dict, training: bool, optimizer: str | None) -> dict:
    """Run one inference forward, or one training step (forward, backward, optimizer step) in steady
    state (optimizer states already there), under LiveBytes; works on meta and on real devices alike.
    Returns weights, gradients, optimizer_states, inputs, activations, total (bytes)."""
    params = [p for p in module.parameters()]
    weights = _nbytes_distinct([*params, *module.buffers()])
    inputs = _nbytes_distinct(list(_tensor_leaves((args, kwargs))))
    if not training:
        known = _known_storages(module, args, kwargs)
        with _device_context(module), _mode(module, False), torch.no_grad():
            with LiveBytes(known) as live:
                out = module(*args, **kwargs)
                del out
        return dict(weights=weights, gradients=0, optimizer_states=0, inputs=inputs,
                    activations=live.peak, total=weights + inputs + live.peak)
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
    known = _known_storages(module, args, kwargs)
    for s in (opt.state.values() if opt is not None else ()):
        for v in s.values():
            if isinstance(v, torch.Tensor):
                key, _ = _storage_key(v)
                known.add(key)
    live = LiveBytes(known)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.add_grad(p.grad.numel() * p.grad.element_size()))
             for p in trainable]
    try:
        with _device_context(module), _mode(module, True), torch.enable_grad(), live:
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
    return dict(weights=weights, gradients=gradients, optimizer_states=states, inputs=inputs,
                activations=live.peak_without_grads, total=weights + states + inputs + live.peak)


class _cast:
    """Cast a meta module's floating parameters and buffers to a dtype, and back afterwards: a module the
    caller handed in comes back as it was (on meta a cast allocates nothing)."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        self.module, self.dtype = module, dtype

    def __enter__(self):
        self.saved = []
        for mod in self.module.modules():
            for kind in ("_parameters", "_buffers"):
                for key, t in getattr(mod, kind).items():
                    if t is not None and t.is_floating_point() and t.dtype != self.dtype:
                        self.saved.append((mod, kind, key, t.dtype))
                        self._set(mod, kind, key, self.dtype)

    def __exit__(self, *exc):
        for mod, kind, key, dtype in reversed(self.saved):
            self._set(mod, kind, key, dtype)
        return False

    @staticmethod
    def _set(mod, kind, key, dtype):
        t = getattr(mod, kind)[key]
        if kind == "_parameters":
            t.data = t.data.to(dtype)  # the same Parameter object: ties and optimizers' references hold
        else:
            mod._buffers[key] = t.to(dtype)


def estimate(name_or_module, batch: int = 1, dtype="bf16", training: bool = False, optimizer: str = "adamw",
             seq_len: int | None = None, registry=None) -> Estimate:
    """Memory to run a model at `batch` in `dtype`: weights, gradients, optimizer states and activations,
    the activations measured by running the model on meta at that batch (not scaled from batch 1).

    Training measures a whole step (forward, backward from the sum of the outputs, optimizer step)
    with the optimizer's states already allocated, as in every step after the first.
    """
    if batch < 1 or (seq_len is not None and seq_len < 1):
        raise AnalysisError("batch and seq_len must be at least 1")
    tdtype = _dtype(dtype)
    if training and optimizer not in OPTIMIZERS:
        raise AnalysisError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    module = _resolve(name_or_module, registry)
    spec = input_spec_of(module)
    if not spec:
        raise AnalysisError("this model has no recorded input spec: estimate needs one to run its forward")
    name = name_or_module if isinstance(name_or_module, str) else type(module).__name__
    if any(not (t.is_meta) for t in [*module.parameters(), *module.buffers()]):
        raise AnalysisError("estimate runs on meta: give a registered name or a module from zoo.get")
    args, kwargs = make_inputs(spec, batch=batch, seq_len=seq_len, dtype=tdtype)
    try:
        with _cast(module, tdtype):
            parts = measure_step(module, args, kwargs, training, optimizer if training else None)
    except AnalysisError:
        raise
    except Exception as e:
        raise AnalysisError(f"the model cannot run on meta, so nothing is estimated: {reason(e)}") from e
    return Estimate(name=name, batch=batch, dtype=dtype_name(tdtype), training=training,
                    optimizer=optimizer if training else None,
                    seq_len=seq_len if seq_len is not None else spec.get("seq_len"), **parts)
