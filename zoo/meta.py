"""Forced-meta mode: every tensor created or moved lands on meta, and init that only writes meta is skipped."""

import contextlib
import math

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from zoo.errors import InvalidRecipe

META = torch.device("meta")

# In-place methods whose names end in "_" but change a tensor's metadata, not its values:
# these must still run on meta, or shapes and requires_grad would be wrong.
_METADATA_INPLACE = frozenset(
    {
        "requires_grad_",
        "resize_",
        "resize_as_",
        "squeeze_",
        "unsqueeze_",
        "t_",
        "transpose_",
        "swapdims_",
        "swapaxes_",
        "as_strided_",
        "set_",
        "share_memory_",
        "detach_",
        "rename_",
        "_coalesced_",
        "retain_grad",
        "module_load",
    }
)
_MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu}
# Ops whose values are random: their results get no shadow, and running them on CPU beside
# the meta build would move the global RNG state.
_RANDOM = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "normal",
        "bernoulli",
        "multinomial",
        "poisson",
        "uniform_",
        "normal_",
        "random_",
        "bernoulli_",
        "exponential_",
        "geometric_",
        "log_normal_",
        "cauchy_",
        "trunc_normal_",
        "dropout",
        "dropout_",
        "xavier_uniform_",
        "xavier_normal_",
        "kaiming_uniform_",
        "kaiming_normal_",
        "orthogonal_",
        "sparse_",
    }
)
_NO_VALUE = _RANDOM | {"empty", "empty_strided", "empty_permuted", "empty_quantized"}
SHADOW_LIMIT = 1 << 20  # elements; larger constructed tensors stay value-less meta
# Tensors one build may construct: the largest real models make tens of thousands (switch-c-2048's experts about
# 100,000); each costs some 4 KB with its module, and 10**5 layers of an untrusted config grew past 3 GiB.
MAX_TENSORS = 150_000
# In-place ops that set every element from their arguments alone.
_OVERWRITES = frozenset({"zero_", "fill_", "copy_", "ones_", "zeros_", "constant_", "fill_diagonal_"})
_DATA_GET = torch.Tensor.data.__get__
# Calls that read metadata or set grad mode: no tensor in, none out that a shadow or the device could change
_QUERIES = frozenset(
    {
        torch._C._set_grad_enabled,
        torch.Tensor.dim,
        torch.Tensor.size,
        torch.Tensor.is_contiguous,
        torch.Tensor.shape.__get__,
        torch.Tensor.dtype.__get__,
        torch.Tensor.device.__get__,
        torch.Tensor.requires_grad.__get__,
        torch.Tensor.is_meta.__get__,
        torch.Tensor.ndim.__get__,
    }
)
_ALIAS_OF = "_zoo_alias_of"
# A shadow rides on its meta tensor as an attribute: it dies with the tensor, and a weak
# dictionary's callbacks were a tenth of a build's time.
_SHADOW = "_zoo_value"


def _to_meta(func, args, kwargs):
    """Tensor.to / .cuda / .cpu with the device replaced by meta; a dtype change still applies."""
    tensor = args[0]
    dtype = kwargs.get("dtype")
    if func is torch.Tensor.to:
        for arg in args[1:]:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, torch.Tensor):  # .to(other) takes other's dtype
                dtype = arg.dtype
    return tensor.to(device=META, dtype=dtype or tensor.dtype, copy=bool(kwargs.get("copy", False)))


class ForceMeta(TorchFunctionMode):
    """Route every tensor to meta, whatever device the model's code names, and skip value writes.

    Unlike ``with torch.device("meta")``, an explicit ``device="cpu"`` or ``.cuda()`` inside a
    builder also lands on meta. In-place writes into meta tensors (``uniform_``, ``trunc_normal_``,
    ``zero_``, ``copy_``, ...) return at once: on meta they compute nothing, yet their Python meta
    kernels are most of a build's time.

    Small tensors computed deterministically from Python numbers (``torch.linspace(...)``,
    ``arange``-built position indices, RoPE frequencies) also get a *shadow*: the same ops run
    on CPU beside the meta ones. Code that reads values (``.item()``, ``.tolist()``, ``if t:``)
    gets them from the shadow, and ``zoo.meta.value_of(buffer)`` gives a buffer's constructed value.
    """

    def __init__(self, shadow_limit: int = SHADOW_LIMIT):
        super().__init__()
        self.constructors = _device_constructors()
        self.shadow_limit = shadow_limit
        self.constructed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _QUERIES:  # a third of a build's calls: nothing to route, write or shadow
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        if func in _MOVES and args and isinstance(args[0], torch.Tensor):
            out = _to_meta(func, args, kwargs)
            self._shadow_of_move(args[0], out)
            return out
        name = getattr(func, "__name__", "")
        if func in self.constructors:
            return self._construct(func, name, args, kwargs)
        if any(issubclass(t, torch.fx.Proxy) for t in types):
            # torch.fx tracing (timm's features_only fx): a shadow passed on would become a graph constant
            return func(*args, **kwargs)
        metas = [t for t in _tensors(args, kwargs) if t.is_meta]
        if metas and name not in _RANDOM and all(value_of(t) is not None for t in metas):
            return self._with_shadows(func, args, kwargs)
        target = args[0] if args else next(iter(kwargs.values()), None)  # nn.init passes tensor=
        if metas and metas[0] is target and _writes_values(name):
            self._overwrite(func, name, target, args, kwargs)
            return target
        out = func(*args, **kwargs)
        if func is _DATA_GET and out is not args[0]:
            self._alias(args[0], out)
        if isinstance(out, torch.Tensor) and not out.is_meta and not isinstance(out, torch.nn.Parameter):
            out = self._forced(out)  # from_numpy, frombuffer and friends: forced, like the rest
        return out

    def _overwrite(self, func, name, target, args, kwargs):
        """A value write into a meta tensor with no known value: skipped, except that a write which
        sets every element from known values (``zero_``, ``fill_``, ``copy_``) gives it one."""
        others = [t for t in _tensors(args[1:], kwargs) if t.is_meta]
        if (
            name not in _OVERWRITES
            or target._base is not None
            or target.numel() > self.shadow_limit
            or any(value_of(t) is None for t in others)
        ):
            _set_shadow(target, None)
            return
        value = torch.empty(target.shape, dtype=target.dtype)
        func(value, *[_swap(a, self._real) for a in args[1:]], **{k: _swap(v, self._real) for k, v in kwargs.items()})
        for alias in (target, target.__dict__.get(_ALIAS_OF)):
            if alias is not None and alias.shape == target.shape and alias.dtype == target.dtype:
                _set_shadow(alias, value)

    def _alias(self, source, alias):
        """``t.data`` is a new tensor object on t's storage: it shares t's shadow, and writes through it reach t."""
        if source.is_meta:
            shadow = value_of(source)
            if shadow is not None:
                _set_shadow(alias, shadow)
            alias.__dict__[_ALIAS_OF] = source

    def _forced(self, real_tensor):
        meta = real_tensor.to(META)
        if real_tensor.numel() <= self.shadow_limit:
            _set_shadow(meta, real_tensor)
        return meta

    def _construct(self, func, name, args, kwargs):
        self.constructed += 1
        if self.constructed > MAX_TENSORS:
            raise InvalidRecipe(
                f"the build constructed more than {MAX_TENSORS:,} tensors, more than any real model: "
                f"a layer or expert count out of bounds?"
            )
        out = func(*args, **{**kwargs, "device": META})
        if name not in _NO_VALUE and isinstance(out, torch.Tensor) and out.numel() <= self.shadow_limit:
            _set_shadow(out, func(*args, **{**kwargs, "device": "cpu"}))
        return out

    def _shadow_of_move(self, source, out):
        shadow = value_of(source) if source.is_meta else source
        if shadow is not None and out is not source and shadow.numel() <= self.shadow_limit:
            _set_shadow(out, shadow.to(dtype=out.dtype))

    def _with_shadows(self, func, args, kwargs):
        """Run func on the shadows too; a plain Python result (item, tolist, bool) comes from them.

        The meta op runs first: its result's size decides whether the real op runs at all (two small shadows
        can make a huge product, 2**20 x 1024 is 4 GiB). Only where meta has no answer (no kernel, a
        data-dependent shape, a Python value) does the real op run unchecked, on inputs within the limit."""
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            out = None  # no meta kernel, or a data-dependent shape (torch.unique): the shadow knows the answer
            sized = _sized_by_values(getattr(func, "__name__", ""), args, kwargs)
            if sized is not None and math.prod(sized[0]) > self.shadow_limit:
                return torch.empty(sized[0], dtype=sized[1], device=META)  # never allocated for real
        metas = list(_tensors((out,), {}))
        if metas and any(t.numel() > self.shadow_limit for t in metas):
            for meta in metas:
                if meta.is_meta:
                    _set_shadow(meta, None)
            return out
        real_out = func(*[_swap(a, self._real) for a in args], **{k: _swap(v, self._real) for k, v in kwargs.items()})
        real_leaves = list(_tensors((real_out,), {}))
        if not real_leaves or not metas:
            from torch.utils._pytree import tree_map_only

            return tree_map_only(torch.Tensor, self._forced, real_out)
        for meta, value in zip(metas, real_leaves):
            if meta.is_meta:
                _set_shadow(meta, value if value.numel() <= self.shadow_limit else None)
        return out

    def _real(self, value):
        if isinstance(value, torch.Tensor):
            return value_of(value) if value.is_meta else value
        if isinstance(value, torch.device) and value.type == "meta" or (isinstance(value, str) and value == "meta"):
            return torch.device("cpu")
        return value


def _sized_by_values(name: str, args, kwargs) -> tuple[tuple[int, ...], torch.dtype] | None:
    """The output shape and dtype of an op whose size its inputs' values decide, from their shadows, for the
    ops whose size no input bounds (a repeat count of 2**31 made a 17 GB real tensor beside a meta build)."""

    def value(t):
        return value_of(t) if isinstance(t, torch.Tensor) and t.is_meta else t

    def arg(i, key, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "repeat_interleave":
        if len(args) == 1 and "repeats" not in kwargs:  # torch.repeat_interleave(repeats)
            repeats = value(args[0])
            return ((int(repeats.sum()),), repeats.dtype) if isinstance(repeats, torch.Tensor) else None
        source, repeats, dim = args[0], value(arg(1, "repeats")), arg(2, "dim")
        if not isinstance(repeats, torch.Tensor):
            return None
        shape = [source.numel()] if dim is None else list(source.shape)
        along = 0 if dim is None else dim % source.dim()
        shape[along] = int(repeats.sum()) if repeats.numel() != 1 else shape[along] * int(repeats)
        return tuple(shape), source.dtype
    if name in ("one_hot", "bincount"):
        values = value(args[0])
        if not isinstance(values, torch.Tensor):
            return None
        top = int(values.max()) + 1 if values.numel() else 0
        if name == "one_hot":
            classes = arg(1, "num_classes", -1)
            return (*values.shape, top if classes == -1 else classes), torch.int64
        weights = arg(1, "weights")
        dtype = (
            torch.int64 if weights is None else (weights.dtype if weights.dtype.is_floating_point else torch.float64)
        )
        return (max(top, arg(2, "minlength", 0)),), dtype
    return None


def value_of(tensor: torch.Tensor) -> torch.Tensor | None:
    """The real value a forced-meta build computed for this meta tensor, if it was small and deterministic."""
    return tensor.__dict__.get(_SHADOW)


def _set_shadow(tensor, value):
    if value is None:
        tensor.__dict__.pop(_SHADOW, None)
    else:
        tensor.__dict__[_SHADOW] = value


def _tensors(args, kwargs):
    """The tensors among args and kwargs, one level into lists and tuples (torch.cat, stack, meshgrid)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


def _swap(value, fn):
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(fn(v) for v in value)
    return fn(value)


def _writes_values(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__") and name not in _METADATA_INPLACE


@contextlib.contextmanager
def force_meta(shadow_limit: int = SHADOW_LIMIT):
    """Build under forced meta; real() inside suspends it.

    torch's thread count is left alone (it is process-wide, and setting it here changed it for every
    thread): builds ran single-threaded once, but measured on 2 cores, warm meta builds took the same
    with one thread as with the default (median ms, one / default: timm vit_base_patch16_224 11 / 11,
    torchvision resnet50 16 / 16, fasterrcnn_resnet50_fpn with all values kept 24 / 25, a Llama-8B
    config 17 / 16), and no better with two processes at once (zoo index -j 2) or 16 threads. (Forked
    index workers are single-threaded, for fork safety: zoo.indexing.indexer._worker_start.)"""
    with ForceMeta(shadow_limit) as mode:
        yield mode


@contextlib.contextmanager
def real():
    """Suspend forced meta for code that needs real tensors (values it reads with .item(), tables, ...)."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode_temporarily

    stack = _get_current_function_mode_stack()
    if not any(isinstance(m, ForceMeta) for m in stack):
        yield
        return
    popped = []
    try:
        # Pop modes down to and including the innermost ForceMeta, then restore them in order.
        while True:
            ctx = _pop_mode_temporarily()
            mode = ctx.__enter__()
            popped.append(ctx)
            if isinstance(mode, ForceMeta):
                break
        yield
    finally:
        for ctx in reversed(popped):
            ctx.__exit__(None, None, None)
