"""Meta kernels answered from a cache: the analysis forwards' main cost, without changing what they measure.

On meta an op computes only its outputs' shapes, strides and dtypes, yet most of PyTorch's meta
kernels are Python (decompositions and prims): a meta batch_norm costs about 0.5 ms and an add about
0.09 ms, where allocating the result costs 0.005 ms. The same ops recur on the same shapes (a network's
repeated blocks, the inference and training forwards of one model, one family's members in one worker),
so ``KernelCache`` remembers, per op and per description of its arguments, the outputs' metadata, and
answers a repeat with freshly allocated meta tensors of exactly that metadata.

Only what cannot differ is answered: PyTorch's own functional ops (no argument mutated, no output
aliasing an input) and in-place ops that change no metadata; every tensor argument a dense meta tensor
(on meta nothing can depend on values); every output a fresh, dense meta tensor of its own storage and
of exactly its extent. Anything else runs as it is.
A fresh allocation is what the real kernel makes too, so the meters above the cache (FLOPs, live and
saved bytes) see the same shapes and the same storages: the figures are equal, which the tests check
against analyses run without it.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from zoo.caching import register, trim
from zoo.constants import kernel_cache_enabled

_MAX_ENTRIES = 100_000  # about 2 KB each (measured over 100 timm models, 66 entries a model): 200 MB at the most
_TABLE: dict = {}  # shared by every forward in this process: families repeat the same layers
# the FLOP count's (zoo.analysis.meters): key -> (record of a decomposed op's outputs or None, FLOPs)
_COUNTED: dict = {}
_KIND: dict = {}  # op overload -> FUNCTIONAL, IN_PLACE or None (not answered)
register("meta kernels", _TABLE, _MAX_ENTRIES)
register("counted FLOPs", _COUNTED, _MAX_ENTRIES)
register("op kinds", _KIND, 100_000)  # one per op overload torch has
FUNCTIONAL, IN_PLACE = "functional", "in-place"
_SELF = "self"  # the record of an in-place op: it returns its first argument, its metadata unchanged
# PyTorch's own ops, whose meta kernels read their arguments alone; a library's or a user's op may register a
# fake kernel that reads a setting of its own, so those always run
_NAMESPACES = ("aten", "prims")


def _kind(func):
    kind = _KIND.get(func, False)
    if kind is False:
        schema = func._schema
        args, returns = schema.arguments, schema.returns
        if getattr(func, "namespace", None) not in _NAMESPACES:
            kind = None
        elif (
            not schema.is_mutable
            and all(a.alias_info is None for a in args)
            and returns
            and all(r.alias_info is None and str(r.type) in ("Tensor", "Tensor?", "Tensor[]") for r in returns)
        ):
            kind = FUNCTIONAL
        elif (
            args
            and args[0].alias_info is not None
            and args[0].alias_info.is_write
            and all(a.alias_info is None for a in args[1:])
            and len(returns) == 1
            and returns[0].alias_info is not None
            and returns[0].alias_info.is_write
        ):
            kind = IN_PLACE  # add_, relu_, mul_: self changed in value only (checked when recorded)
        else:
            kind = None
        trim(_KIND, 100_000)
        _KIND[func] = kind
    return kind


def enabled() -> bool:
    """Whether the meta forwards answer repeated ops from remembered ones (ZOO_KERNEL_CACHE=0: never)."""
    return kernel_cache_enabled()


def key_of(func, args, kwargs):
    """What an answer to this call is remembered under, or None for a call that is never answered (module doc)."""
    if _kind(func) is None:
        return None
    try:
        return func, _describe(args), _describe(kwargs), torch.get_default_dtype()
    except ValueError:  # an argument _describe cannot describe: the op runs as it is
        return None


def _describe(value):
    """A hashable description of an argument: what a meta kernel can read of it."""
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or not value.is_meta or value.layout != torch.strided:
            raise ValueError("uncacheable")
        return (
            "T",
            value.dtype,
            tuple(value.shape),
            value.stride(),
            value.storage_offset(),
            value.is_conj(),
            value.is_neg(),
        )
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(_describe, value))
    if isinstance(value, dict):
        return ("D", *((k, _describe(v)) for k, v in sorted(value.items())))
    if isinstance(value, (bool, int, float, complex)):  # with its type: 1 == 1.0 == True, yet full([2], 1)
        return type(value), value  # is int64, full([2], 1.0) float32, full([2], True) bool
    if value is None or isinstance(value, (str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return value
    raise ValueError("uncacheable")  # SymInts, generators, opaque objects: the op runs as it is


def _extent(shape, stride, itemsize) -> int:
    if 0 in shape:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * itemsize


def _storages(value, found: set) -> set:
    if isinstance(value, torch.Tensor):
        found.add(value.untyped_storage()._cdata)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _storages(v, found)
    elif isinstance(value, dict):
        _storages(list(value.values()), found)
    return found


def recorded(out, args, kwargs):
    """The outputs' metadata, or None when they are not all fresh tensors of their own exact storage
    (some ops return a view of an input without saying so in their schema: aten._unsafe_view)."""
    inputs = _storages((args, kwargs), set())
    single = isinstance(out, torch.Tensor)
    tensors = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
    if tensors is None:
        return None
    seen, rows = set(inputs), []
    for t in tensors:
        if t is None:
            rows.append(None)
            continue
        if type(t) is not torch.Tensor or not t.is_meta or t.layout != torch.strided or t.storage_offset():
            return None
        storage = t.untyped_storage()
        shape, stride = tuple(t.shape), t.stride()
        if storage._cdata in seen or storage.nbytes() != _extent(shape, stride, t.element_size()):
            return None
        seen.add(storage._cdata)
        rows.append((shape, stride, t.dtype))
    return single, type(out) if not single else None, rows


def rebuilt(record):
    """Fresh meta tensors with the metadata `recorded` took, in its container."""
    single, container, rows = record
    tensors = [
        None if row is None else torch.empty_strided(row[0], row[1], dtype=row[2], device="meta") for row in rows
    ]
    return tensors[0] if single else container(tensors)


class KernelCache(TorchDispatchMode):
    """Answers repeated functional and in-place meta ops from what their first run produced (module doc).
    Enter it before (below) the meters, so that they see every op and every allocation it answers."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = key_of(func, args, kwargs)
        if key is not None:
            record = _TABLE.get(key)
            if record is _SELF:
                return args[0]
            if record is not None:
                return rebuilt(record)
            if _kind(func) is IN_PLACE:
                before = (key[1][1], args[0].untyped_storage().nbytes())
                out = func(*args, **kwargs)
                if out is args[0] and (_describe(out), out.untyped_storage().nbytes()) == before:
                    _remember(_TABLE, key, _SELF)
                return out
        out = func(*args, **kwargs)
        if key is not None:
            _remember(_TABLE, key, recorded(out, args, kwargs))
        return out


def _remember(table: dict, key, record) -> None:
    if record is not None:
        if len(table) >= _MAX_ENTRIES:  # full: start again (the entries of the models to come matter most)
            table.clear()
        table[key] = record


def counted(key):
    """What remember_count remembered for the call `key`: (record or None, FLOPs), or None."""
    return _COUNTED.get(key)


def remember_count(key, flops: int, decomposed=None, args=(), kwargs=None) -> None:
    """The FLOPs a formula gave for the call `key` (FLOPs read shapes alone); for an op the count decomposed, the
    FLOPs of its parts and its outputs' metadata too, or nothing where they cannot be answered again."""
    record = None if decomposed is None else recorded(decomposed, args, kwargs or {})
    if decomposed is None or record is not None:
        _remember(_COUNTED, key, (record, flops))


def clear() -> None:
    """Forget every remembered op (tests compare analyses with and without it)."""
    _TABLE.clear()
    _COUNTED.clear()
