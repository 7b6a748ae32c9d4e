"""scan: every module's output shapes and dtypes, parameters and bytes, from one forward on meta."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from zoo.analysis.forward import device_context, outputs_of, train_mode
from zoo.analysis.inputs import as_input, check_scan_input, input_spec_of, make_inputs
from zoo.errors import AnalysisError, InvalidArgument, reason


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


def _sizes(module: nn.Module) -> dict[str, tuple[int, int, int]]:
    """name -> (params, param_bytes, buffer_bytes) over distinct tensors of each module's subtree."""
    out = {}
    for name, mod in module.named_modules():
        params = {id(p): p for p in mod.parameters()}.values()
        buffers = {id(b): b for b in mod.buffers()}.values()
        out[name] = (
            sum(p.numel() for p in params),
            sum(p.numel() * p.element_size() for p in params),
            sum(b.numel() * b.element_size() for b in buffers),
        )
    return out


def _given(module: nn.Module, inputs: tuple, kwargs: dict) -> tuple[list, dict]:
    """Inputs given to scan, on meta. A shape takes the dtype of the recorded input it stands for, so
    (1, 16) is 16 token ids for a language model; where the recorded inputs are all named (transformers
    models), shapes given in order are passed under those names."""
    spec = input_spec_of(module) if any(_is_shape(i) for i in inputs) else None
    if not spec:
        return [as_input(i) for i in inputs], {k: as_input(v) for k, v in kwargs.items()}
    slots = [(None, a) for a in spec.get("args", [])] or list(spec.get("kwargs", {}).items())
    args, kw = [], {k: as_input(v) for k, v in kwargs.items()}
    for i, value in enumerate(inputs):
        name, arg = slots[i] if i < len(slots) else (None, None)
        dtype = arg.get("dtype") if isinstance(arg, dict) else None
        if _is_shape(value) and dtype:
            value = torch.empty(tuple(value), device="meta", dtype=getattr(torch, dtype))
        if name is None:
            args.append(as_input(value))
        else:
            kw[name] = as_input(value)
    return args, kw


def _is_shape(value) -> bool:
    return isinstance(value, (tuple, torch.Size)) and all(isinstance(d, int) for d in value)


def scan(module: nn.Module, *inputs, batch: int = 1, train: bool = False, strict: bool = True, **kwargs) -> Scan:
    """Every module's output shapes and dtypes from one forward on meta: no weights, no values.

    `module`: any module on meta (one from zoo.get, or your own; zoo.scan also takes a registered
    name). `inputs`: tensors (moved to meta) or shapes (tuples of ints, made meta float32 tensors), or
    lists, tuples or dicts of them (anything else: InvalidArgument); none means the model's recorded input
    spec at `batch`. Keyword arguments go to the forward. Raises what the forward raises (a data-dependent
    op, a wrong shape), unless strict=False: then the modules that ran keep their outputs and Scan.error
    says why it stopped.
    """
    if not isinstance(module, nn.Module):
        raise AnalysisError(f"scan takes a module, not {type(module).__name__}: use zoo.scan for a registered name")
    for position, value in enumerate(inputs):
        check_scan_input(value, position)
    if type(batch) is not int or not 1 <= batch < 2**31:
        raise InvalidArgument(f"batch must be a whole number from 1 to 2**31 - 1, not {batch!r:.40}")
    names = {id(m): n for n, m in module.named_modules()}
    sizes = _sizes(module)
    rows = {
        n: ModuleScan(n, type(m).__name__, n.count(".") + 1 if n else 0, *sizes[n]) for n, m in module.named_modules()
    }
    if inputs or kwargs:
        args, kw = _given(module, inputs, kwargs)
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
        with device_context(module), train_mode(module, train), torch.set_grad_enabled(train):
            out = module(*args, **kw)
    except Exception as e:
        if strict:
            raise
        return Scan(list(rows.values()), [], reason(e))
    finally:
        for h in handles:
            h.remove()
    return Scan(list(rows.values()), outputs_of(out))
