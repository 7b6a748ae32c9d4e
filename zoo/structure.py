"""A digest of what a meta module computes, so that index-time analysis can be reused between builds.

Two modules with the same digest have the same module tree (paths and classes), the same non-tensor
attributes on every submodule (hyperparameters, flags such as torchvision's `transform_input`, hooks),
the same tensors (shape, stride, dtype, requires_grad) and are analysed at the same input: their
forwards run the same code on the same shapes, so their FLOPs, activations and outputs are equal. This
is what makes a pretrained variant that builds its architecture unchanged (`timm/resnet50.a2_in1k`
beside `timm/resnet50`) cost a build instead of a build and an analysis.

Anything the digest cannot describe without an address in it (an arbitrary object, a lambda's closure)
makes the module undigestible (None): it is analysed for itself. A false "same" would record wrong
figures; a false "different" only costs time, so every doubt resolves to None.
"""

import collections
import dataclasses
import enum
import functools
import hashlib
import types

import torch

from zoo.caching import register

_TENSOR_SLOTS = ("_parameters", "_buffers")
_PRIMITIVES = (int, float, complex, str, bytes, bool, type(None))
# timm's record of where a model's weights come from (hub id, URL, tag): read by its builders and data-config
# helpers, never by a forward, and the one thing that differs between most variants and their architecture
_WEIGHTS_METADATA = ("pretrained_cfg", "default_cfg")


def structure_digest(module: torch.nn.Module, spec) -> str | None:
    """sha256 of the module's structure and the analysis input `spec` (any value with a stable repr),
    or None when some attribute has no stable description."""
    parts = [repr(spec)]  # hashed once at the end: the same digest as hashing each part in turn, faster
    try:
        for path, sub in module.named_modules(remove_duplicate=False):
            parts.append(f"\0{path}:{_qualname(type(sub))}")
            attributes = sub.__dict__
            for key in sorted(attributes):
                value = attributes[key]
                kind = type(value)
                known: tuple
                # most attributes are empty hook dicts and flags: their part, once made, is looked up
                if kind in _EMPTY_CONTAINERS and not value:
                    known = (key, kind)
                elif kind in _SCALARS:
                    known = (key, kind, value)
                else:
                    parts.append(_part(key, value))
                    continue
                part = _PARTS.get(known)
                if part is None:
                    part = _part(key, value)
                    if len(_PARTS) < _MAX_PARTS:  # a bound: widths and names are many, empty dicts and flags few
                        _PARTS[known] = part
                parts.append(part)
    except ValueError:  # something without a stable description: analysed for itself
        return None
    return hashlib.sha256("".join(parts).encode()).hexdigest()


_SCALARS = frozenset({bool, int, str, type(None)})  # not float: 0.0 == -0.0, one key, two descriptions
_PARTS: dict = {}  # (key, type[, value]) -> the part _part gives it
_MAX_PARTS = 100_000
register("structure parts", _PARTS, _MAX_PARTS)


def _part(key: str, value) -> str:
    """What one attribute of a module adds to its digest ("" for those left out)."""
    if key == "_modules" or key in _WEIGHTS_METADATA:  # modules: visited, their names in the paths
        return ""
    if key in _TENSOR_SLOTS:
        value = {k: _tensor(t) for k, t in value.items()}
    elif "hooks" in key and isinstance(value, dict):  # keyed by a global handle counter
        value = list(value.values())
    return f"\1{key}={stable_description(value)}"


def _qualname(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def _tensor(t) -> str:
    if t is None:
        return "None"
    if not t.is_meta:  # a real tensor's values matter to the forward and are not hashed here
        raise ValueError("undigestible")
    return f"T{type(t).__name__}{tuple(t.shape)}{t.stride()}{t.dtype}{t.requires_grad}"


# what stable_description gives an empty container of these types, below
_EMPTY_CONTAINERS = {
    **{t: f"{t.__name__}[]" for t in (list, tuple, set, frozenset)},
    **{t: f"{t.__module__}.{t.__qualname__}{{}}" for t in (dict, collections.OrderedDict)},
}


def stable_description(value, depth: int = 0) -> str:
    """A description of `value` that two equal values share and no process address enters."""
    if depth > 8:
        raise ValueError("undigestible")
    kind = type(value)
    if kind in _EMPTY_CONTAINERS and not value:  # most of a module's __dict__: its empty hook dicts
        return _EMPTY_CONTAINERS[kind]
    if (
        kind in _PRIMITIVES
        or isinstance(value, _PRIMITIVES)
        or isinstance(value, (torch.dtype, torch.device, torch.Size, enum.Enum))
    ):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [stable_description(v, depth + 1) for v in value]
        return f"{type(value).__name__}[{','.join(sorted(items) if isinstance(value, (set, frozenset)) else items)}]"
    if isinstance(value, dict):  # hook dicts too: their values are functions or bound methods
        entries = (f"{stable_description(k, depth + 1)}:{stable_description(v, depth + 1)}" for k, v in value.items())
        return f"{_qualname(type(value))}{{{','.join(entries)}}}"
    if isinstance(value, type) or isinstance(value, (types.BuiltinFunctionType, torch._ops.OpOverload)):
        return f"C:{_qualname(value)}"
    if isinstance(value, types.FunctionType):
        if value.__closure__ or "<lambda>" in value.__qualname__ or "<locals>" in value.__qualname__:
            raise ValueError("undigestible")  # what it computes depends on what it closed over
        return f"F:{_qualname(value)}"
    if isinstance(value, types.MethodType):  # bound to its module: that module is digested on its own
        if not isinstance(value.__self__, torch.nn.Module):
            raise ValueError("undigestible")
        return f"M:{_qualname(value.__func__)}"
    if isinstance(value, functools.partial):
        return (
            f"P:{stable_description(value.func, depth + 1)}{stable_description(value.args, depth + 1)}"
            f"{stable_description(value.keywords, depth + 1)}"
        )
    if dataclasses.is_dataclass(value):  # a model's config (timm's ByoModelCfg, MaxxVitCfg): its class and fields
        fields = ",".join(
            f"{f.name}={stable_description(getattr(value, f.name), depth + 1)}" for f in dataclasses.fields(value)
        )
        return f"D:{_qualname(kind)}({fields})"
    raise ValueError("undigestible")
