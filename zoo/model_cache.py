"""An in-process cache of built meta modules; get() hands out fresh structural clones of them.

A clone is a new instance of every module class with new meta Parameters and buffers, built
without running any constructor: it takes a tenth of a meta build. Nothing here is stored on
disk, so nothing read from the registry is ever unpickled or executed.
"""

import copy
import gc
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from zoo.caching import register
from zoo.weights.slots import slots_of

_MAX_TEMPLATES = 32
_templates: "OrderedDict[tuple, tuple[nn.Module, tuple]]" = OrderedDict()  # key -> (template, its ties)
register("templates", _templates, _MAX_TEMPLATES)  # the least recently used goes first
_PRIMITIVES = (int, float, str, bool, type(None), torch.dtype, torch.device, torch.Size)


def cached(key: tuple, build) -> tuple[nn.Module, tuple[tuple[str, ...], ...]]:
    """A fresh clone of the template under `key`, building the template with `build()` on a miss, and its
    ties: the names of each tensor it holds under several (a clone shares tensors as the template does).
    Found once per template: a walk over an 80-layer model's tensors is 5 ms, a tenth of its clone."""
    entry = _templates.get(key)
    if entry is None:
        template = build()
        entry = _templates[key] = template, tuple(tuple(s.names) for s in slots_of(template) if len(s.names) > 1)
        while len(_templates) > _MAX_TEMPLATES:
            _templates.popitem(last=False)
    else:
        _templates.move_to_end(key)
    return clone(entry[0]), entry[1]


def clear() -> None:
    _templates.clear()


def clone(module: nn.Module) -> nn.Module:
    """A copy of a meta module that shares no tensor, module or mutable attribute with it.

    Ties survive (one memo per clone); tensors get fresh meta storage with the same shape,
    dtype, strides and requires_grad. Attributes that are not modules or tensors are deep-copied,
    except immutable primitives, which are shared.
    """
    gc_was_on = gc.isenabled()
    gc.disable()  # a clone makes thousands of objects; a full collection midway costs ten clones
    try:
        return _clone_module(module, {})
    finally:
        if gc_was_on:
            gc.enable()


def _clone_tensor(t: torch.Tensor, memo: dict) -> torch.Tensor:
    new = memo.get(id(t))
    if new is not None:
        return new
    if type(t) not in (torch.Tensor, nn.Parameter, nn.Buffer) or not t.is_meta:
        new = copy.deepcopy(t, memo)
    else:
        data = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        new = nn.Parameter(data, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else data
        new.__dict__.update(t.__dict__)  # the constructed value a build recorded, and any tag attributes
    memo[id(t)] = new
    return new


def _clone_module(module: nn.Module, memo: dict) -> nn.Module:
    done = memo.get(id(module))
    if done is not None:
        return done
    cls: Any = type(module)  # a torch class: mypy reads type[Any].__new__ as type's own
    new = cls.__new__(cls)
    memo[id(module)] = new
    state: dict[str, Any] = {}
    for key, value in module.__dict__.items():
        if key == "_parameters" or key == "_buffers":
            state[key] = {k: (None if v is None else _clone_tensor(v, memo)) for k, v in value.items()}
        elif key == "_modules":
            state[key] = {k: (None if v is None else _clone_module(v, memo)) for k, v in value.items()}
        elif isinstance(value, _PRIMITIVES) or (
            type(value) is tuple and all(isinstance(v, _PRIMITIVES) for v in value)
        ):
            state[key] = value  # immutable: sharing is safe (conv kernel_size, stride, ...)
        elif isinstance(value, (dict, set, list)) and not value:
            state[key] = type(value)()  # the many empty hook dicts: cheap to make anew
        elif isinstance(value, nn.Module):
            state[key] = _clone_module(value, memo)
        elif isinstance(value, torch.Tensor):
            state[key] = _clone_tensor(value, memo)
        else:
            state[key] = copy.deepcopy(value, memo)
    object.__setattr__(new, "__dict__", state)
    return new
