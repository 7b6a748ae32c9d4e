"""estimate: the memory to run a model at a batch, dtype and optimizer, measured by running it on meta."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch
from torch import nn

from zoo.analysis.forward import device_context, loss_of, train_mode
from zoo.analysis.inputs import input_spec_of, make_inputs, tensor_leaves
from zoo.analysis.meters import LiveBytes, known_storages, storage_key
from zoo.errors import AnalysisError, reason
from zoo.inspection import dtype_name, named_tensors

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp64": torch.float64, "float64": torch.float64,
}


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
    inputs = _nbytes_distinct(list(tensor_leaves((args, kwargs))))
    if not training:
        known = known_storages(module, args, kwargs)
        with device_context(module), train_mode(module, False), torch.no_grad():
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
    known = known_storages(module, args, kwargs)
    for s in (opt.state.values() if opt is not None else ()):
        for v in s.values():
            if isinstance(v, torch.Tensor):
                key, _ = storage_key(v)
                known.add(key)
    live = LiveBytes(known)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.add_grad(p.grad.numel() * p.grad.element_size()))
             for p in trainable]
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
    return dict(weights=weights, gradients=gradients, optimizer_states=states, inputs=inputs,
                activations=live.peak_without_grads, total=weights + states + inputs + live.peak)


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


def check_options(batch: int, dtype, training: bool, optimizer: str, seq_len: int | None) -> torch.dtype:
    """The options of an estimate, checked before any model is built; returns the torch dtype."""
    if batch < 1 or (seq_len is not None and seq_len < 1):
        raise AnalysisError("batch and seq_len must be at least 1")
    if training and optimizer not in OPTIMIZERS:
        raise AnalysisError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    return _dtype(dtype)


def estimate(module: nn.Module, batch: int = 1, dtype="bf16", training: bool = False, optimizer: str = "adamw",
             seq_len: int | None = None, name: str | None = None) -> Estimate:
    """Memory to run a model at `batch` in `dtype`: weights, gradients, optimizer states and activations,
    the activations measured by running the model on meta at that batch (not scaled from batch 1).

    Training measures a whole step (forward, backward from the sum of the outputs, optimizer step)
    with the optimizer's states already allocated, as in every step after the first.
    """
    tdtype = check_options(batch, dtype, training, optimizer, seq_len)
    if not isinstance(module, nn.Module):
        raise AnalysisError(f"estimate takes a module, not {type(module).__name__}: use zoo.estimate for a name")
    spec = input_spec_of(module)
    if not spec:
        raise AnalysisError("this model has no recorded input spec: estimate needs one to run its forward")
    if any(not (t.is_meta) for t in [*module.parameters(), *module.buffers()]):
        raise AnalysisError("estimate runs on meta: give a registered name or a module from zoo.get")
    args, kwargs = make_inputs(spec, batch=batch, seq_len=seq_len, dtype=tdtype)
    try:
        with cast_to(module, tdtype):
            parts = measure_step(module, args, kwargs, training, optimizer if training else None)
    except AnalysisError:
        raise
    except Exception as e:
        raise AnalysisError(f"the model cannot run on meta, so nothing is estimated: {reason(e)}") from e
    return Estimate(name=name or type(module).__name__, batch=batch, dtype=dtype_name(tdtype), training=training,
                    optimizer=optimizer if training else None,
                    seq_len=seq_len if seq_len is not None else spec.get("seq_len"), **parts)
