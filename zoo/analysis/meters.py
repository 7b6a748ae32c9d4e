"""Meters for forwards on meta: live and saved activation bytes, FLOPs, and attention as a real device runs it.

On meta every op computes shapes and dtypes and no value, yet allocates as it would on a device:
the meters below watch those allocations (``LiveBytes``: storages as they live and die;
``SavedBytes``: what autograd keeps for backward) and count FLOPs (``flop_counter``: 2 per
multiply-accumulate in matmuls, convolutions and attention, nothing for elementwise ops).
"""

from __future__ import annotations

import time
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import zoo.analysis.kernel_cache as kernel_cache
from zoo.analysis.inputs import tensor_leaves
from zoo.errors import AnalysisTimeout


def storage_key(t: torch.Tensor):
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, some subclasses
        return None, None
    return st._cdata, st


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
    that runs too long. `flops`: count FLOPs too, as flop_counter() does (`self.flops.total`), in this one
    layer: under a FlopCounterMode of its own, an inference forward took 23% more CPU (150 timm models).
    """

    def __init__(self, known=(), deadline: float | None = None, log: list | None = None, flops: bool = False):
        super().__init__()
        self.flops = _FlopCount() if flops else None
        self.known = known if isinstance(known, KnownStorages) else set(known)  # held, not copied
        # where given: every change as (allocation number, +/- bytes), to replay it (replay_peak); a number,
        # not the storage key, since a freed storage's address is reused
        self.log = log
        self.serial: dict[int, int] = {}  # live storage key -> its allocation number
        self.allocations = 0
        self.live: dict[int, int] = {}
        self.current = self.peak = 0
        self.grads = 0
        self.peak_without_grads = 0
        self.deadline = deadline

    def _free(self, key):
        nbytes = self.live.pop(key, 0)
        self.current -= nbytes
        serial = self.serial.pop(key, None)
        if self.log is not None and nbytes:
            self.log.append((serial, -nbytes))

    def add_grad(self, nbytes: int):
        self.grads += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs) if self.flops is None else self.flops.run(func, args, kwargs)
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise AnalysisTimeout("the meta forward ran past its time budget")
        for t in tensor_leaves(out):
            key, st = storage_key(t)
            if key is None or key in self.known:
                continue
            nbytes = st.nbytes()
            old = self.live.get(key)
            if old is None:
                self.live[key] = nbytes
                self.serial[key] = self.allocations = self.allocations + 1
                self.current += nbytes
                weakref.finalize(st, self._free, key)
            elif old != nbytes:  # resized in place (out= kernels)
                self.live[key] = nbytes
                self.current += nbytes - old
            else:
                continue
            if self.log is not None:
                self.log.append((self.serial[key], nbytes - (old or 0)))
        if self.current > self.peak:
            self.peak = self.current
        if self.current - self.grads > self.peak_without_grads:
            self.peak_without_grads = self.current - self.grads
        return out


class _FlopCount:
    """What FlopCounterMode (flop_counter()) counts, op by op, for a mode that runs the ops itself: an op with a
    composite decomposition is decomposed, its parts counted under a mode of their own (_Decomposed, as
    FlopCounterMode re-enters itself), and an op with a formula adds it."""

    def __init__(self):
        self.registry = flop_counter().flop_registry  # its formulas by op, the custom ones wrapped as it wraps them
        self.total = 0
        self._composite: dict = {}

    def run(self, func, args, kwargs):
        decomposes = func is not torch.ops.prim.device.default and self._decomposes(func)
        formula = None if decomposes else self.registry.get(func._overloadpacket)
        # a repeat is answered from the kernel cache's table: the same FLOPs, the same outputs' metadata
        key = kernel_cache.key_of(func, args, kwargs) if (decomposes or formula) and kernel_cache.enabled() else None
        remembered = kernel_cache.counted(key) if key is not None else None
        if decomposes:
            if remembered is not None and remembered[0] is not None:
                self.total += remembered[1]
                return kernel_cache.rebuilt(remembered[0])
            before = self.total
            with _Decomposed(self):
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                if key is not None:
                    kernel_cache.remember_count(key, self.total - before, out, args, kwargs)
                return out
            formula = self.registry.get(func._overloadpacket)
        out = func(*args, **kwargs)
        if formula is not None:
            flops = remembered[1] if remembered is not None else formula(*args, **kwargs, out_val=out)
            if key is not None and remembered is None:
                kernel_cache.remember_count(key, flops)
            self.total += flops
        return out

    def _decomposes(self, func) -> bool:
        found = self._composite.get(func)
        if found is None:
            key = torch._C.DispatchKey.CompositeImplicitAutograd
            found = self._composite[func] = key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), key
            )
        return found


class _Decomposed(TorchDispatchMode):
    """Counts the parts of a decomposed op, and nothing else: the layer above sees the op whole."""

    def __init__(self, count: _FlopCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.count.run(func, args, kwargs or {})


def replay_peak(log: list, scale: dict) -> int:
    """The peak of a LiveBytes log with some storages' bytes scaled (0: left out; 0.5: held at half the
    width, as a KV cache in fp8 for a bf16 model)."""
    current = peak = 0
    for key, delta in log:
        current += delta * scale.get(key, 1)
        peak = max(peak, current)
    return int(peak)


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


def _flash_for_cpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    tensors = [query, key, value] + ([attn_mask] if attn_mask is not None else [])
    if not all(isinstance(t, torch.Tensor) and t.is_meta for t in tensors) or query.dim() != 4:
        return None
    # Grouped heads: CPU's flash kernel takes fewer key/value heads as they are (enable_gqa), without
    # repeating them; without enable_gqa SDPA refuses them itself. Boolean masks: left to the math path.
    grouped = key.size(1) != query.size(1)
    if grouped and not (enable_gqa and query.size(1) % key.size(1) == 0):
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        return None

    def stand_in(t):  # CPU, one row of storage: the choice reads shapes, dtypes, the last stride, requires_grad
        row = torch.zeros(
            (1,) * (t.dim() - 1) + (t.shape[-1],),
            dtype=t.dtype,
            device="cpu",
            requires_grad=t.requires_grad and torch.is_grad_enabled(),
        )
        return row.expand(t.shape)

    from torch.nn.attention import SDPBackend

    try:
        choice = torch._fused_sdp_choice(
            stand_in(query),
            stand_in(key),
            stand_in(value),
            attn_mask=stand_in(attn_mask) if attn_mask is not None else None,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            **({"enable_gqa": True} if grouped else {}),
        )
    except (RuntimeError, ValueError, TypeError):  # shapes SDPA itself will refuse: let it say so
        return None
    if choice != int(SDPBackend.FLASH_ATTENTION):
        return None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )[0]


def _flash_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode has no formula for the CPU flash op: the one it has for the other fused kernels."""
    from torch.utils.flop_counter import sdpa_flop_count

    # grouped heads: each query head attends to its group's keys, the work of repeated key/value heads
    heads = query_shape[1]
    return sdpa_flop_count(
        query_shape, (*key_shape[:1], heads, *key_shape[2:]), (*value_shape[:1], heads, *value_shape[2:])
    )


def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """Mixture-of-experts layers multiply each routed token by its expert's matrix in one grouped matmul
    (transformers' grouped_mm); FlopCounterMode has no formula for it: 2 x every output element x the
    inner dimension, as for mm."""
    import math

    return 2 * math.prod(out_shape) * a_shape[-1]


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

    counter = FlopCounterMode(
        display=False,
        custom_mapping={
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu_flops,
            **({torch.ops.aten._grouped_mm: _grouped_mm_flops} if hasattr(torch.ops.aten, "_grouped_mm") else {}),
        },
    )
    counter.mod_tracker = _GlobalOnly()
    return counter


class KnownStorages(set):
    """The keys of the storages that exist before a forward (weights, buffers, inputs), which the meters leave out,
    holding those storages too: a key is an address, and a storage freed during the forward (a buffer the module
    replaces, as timm's ConViT does its position indices) would hand it to a new allocation, left out in turn.
    The meters keep this object itself, so the storages stay held for as long as a meter runs."""

    def __init__(self, storages):
        storages = list(storages)
        super().__init__(st._cdata for st in storages)
        self.storages = storages


def known_storages(module: nn.Module, *values) -> KnownStorages:
    storages = (storage_key(t)[1] for t in [*module.parameters(), *module.buffers(), *tensor_leaves(values)])
    return KnownStorages(st for st in storages if st is not None)


class SavedBytes:
    """Bytes autograd holds for backward, once per storage, weights and inputs excluded: `bytes` is what
    is still held now (a saved tensor of a graph branch that was dropped is freed with it)."""

    def __init__(self, known=(), deadline: float | None = None):
        self.known = known if isinstance(known, KnownStorages) else set(known)  # held, not copied
        self.held: dict[int, int] = {}
        self.bytes = 0
        self.deadline = deadline
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise AnalysisTimeout("the meta forward ran past its time budget")
        key, st = storage_key(t)
        if key is not None and key not in self.known and key not in self.held:
            self.held[key] = st.nbytes()
            self.bytes += self.held[key]
            weakref.finalize(st, self._release, key)
        # a detached alias, not t itself: autograd keeps a saved output without a reference to its own grad_fn,
        # and a pack hook that returned t would close that loop in C++, where no garbage collector sees it
        # (every module analysed stayed alive, its graph and weights with it)
        return t.detach()

    def _release(self, key):
        self.bytes -= self.held.pop(key, 0)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)
