"""What every meta forward shares: the device context, train/eval mode, the output's shapes, a loss."""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

import zoo.analysis.kernel_cache as kernel_cache
from zoo.analysis.inputs import tensor_leaves
from zoo.analysis.meters import FusedAttention
from zoo.inspection import dtype_name


@contextlib.contextmanager
def train_mode(module: nn.Module, training: bool):
    """Run a module in train or eval mode, restoring each submodule's own flag afterwards."""
    saved = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield module
    finally:
        for m, flag in saved:
            m.training = flag


def device_context(module: nn.Module):
    """For a forward of a meta module: factory calls without a device land on meta too, attention
    allocates as the fused kernel would (FusedAttention), and repeated ops are answered from the kernel
    cache (zoo.analysis.kernel_cache; ZOO_KERNEL_CACHE=0 turns it off). Enter it before the meters: the
    cache must sit below them. A real module runs as it is."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    if first is not None and not first.is_meta:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.device("meta"))
    stack.enter_context(FusedAttention())
    if kernel_cache.enabled():
        stack.enter_context(kernel_cache.KernelCache())
    return stack


def outputs_of(value, path: str = "") -> list:
    """[path, shape, dtype] for every tensor in a (nested) output; path "" for a lone tensor."""
    if isinstance(value, torch.Tensor):
        return [[path, list(value.shape), dtype_name(value.dtype)]]
    out: list = []
    items: Iterable[tuple[Any, Any]]
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


def loss_of(output) -> torch.Tensor | None:
    """A scalar to run backward from: the sum of every floating output that requires grad."""
    terms = [t.float().sum() for t in tensor_leaves(output) if t.is_floating_point() and t.requires_grad]
    return torch.stack(terms).sum() if terms else None


def accepts(module: nn.Module, name: str) -> bool:
    """Whether the module's forward takes a keyword `name` (use_cache, logits_to_keep)."""
    try:
        return name in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
