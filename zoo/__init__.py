"""zoo: find, size, plan and load PyTorch models from a registry built on the meta device.

Importing zoo is cheap: search and info never import torch; get() imports it when first called.
The functions here work on the default registry ($ZOO_REGISTRY, else the shipped registry.db);
zoo.connect(url) gives a Zoo with the same methods on any other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zoo.api import Zoo, connect
from zoo.errors import (
    AmbiguousName,
    AnalysisError,
    AnalysisTimeout,
    BenchFailed,
    BuildFailed,
    CatalogError,
    CheckpointError,
    DownloadBlocked,
    HubUnavailable,
    InvalidArgument,
    InvalidComparison,
    InvalidRecipe,
    MaterializeError,
    ModelExists,
    ModelNotFound,
    NotBuildable,
    RegistryDrift,
    RegistryError,
    RegistryLocked,
    RegistryNotFound,
    SchemaOutdated,
    SearchSyntaxError,
    TokenizerNotCached,
    UnknownFamily,
    UntrustedBuilder,
    WeightsMismatch,
    WorkerFailed,
    ZooError,
)
from zoo.query import FIELDS, F

if TYPE_CHECKING:
    from torch import nn

    from zoo.analysis import Estimate, Scan
    from zoo.caching import cache_clear, caches
    from zoo.inspection import TensorInfo
    from zoo.model_info import ModelInfo
    from zoo.weights.fit import Fit


def get(name: str, **options) -> nn.Module:
    """The model as an nn.Module of its own class, every tensor on meta (see Zoo.get)."""
    return Zoo().get(name, **options)


def info(name: str, tensors: bool = False) -> ModelInfo:
    """The recorded metadata of a model, without importing torch (see Zoo.info)."""
    return Zoo().info(name, tensors)


def check(name: str, weights, key_map=None) -> Fit:
    """How a checkpoint fits a model, from metadata alone (see Zoo.check)."""
    return Zoo().check(name, weights, key_map)


def search(
    expression=None, order_by: str | None = None, limit: int | None = None, fields=None
) -> list[ModelInfo] | list[dict]:
    """Every model matching e.g. "params<7e9 and family=timm" or F.params < 7e9 (see Zoo.search)."""
    return Zoo().search(expression, order_by, limit, fields)


def scan(name_or_module, *inputs_or_shapes, registry: str | Zoo | None = None, **options) -> Scan:
    """Per-module output shapes and dtypes from one forward on meta, no weights (see zoo.analysis.scan)."""
    return _registry(registry).scan(name_or_module, *inputs_or_shapes, **options)


def estimate(
    name_or_module,
    batch: int = 1,
    dtype="bf16",
    training: bool = False,
    optimizer: str = "adamw",
    seq_len: int | None = None,
    registry: str | Zoo | None = None,
    kv_dtype=None,
    weights_dtype=None,
    group_size: int = 128,
    checkpointing: bool = False,
) -> Estimate:
    """Bytes for weights, gradients, optimizer states, KV cache and activations, measured on meta (see
    zoo.analysis.estimate): kv_dtype="fp8" for the cache, weights_dtype="int8"|"int4"|"fp8" for weight-only
    quantization (int8/int4 with group_size), checkpointing=True for training with activation checkpointing."""
    return _registry(registry).estimate(
        name_or_module,
        batch=batch,
        dtype=dtype,
        training=training,
        optimizer=optimizer,
        seq_len=seq_len,
        kv_dtype=kv_dtype,
        weights_dtype=weights_dtype,
        group_size=group_size,
        checkpointing=checkpointing,
    )


def transform(name: str, train: bool = False, test_size: bool = False):
    """The torchvision transform a model's weights expect, built without the model (see Zoo.transform)."""
    return Zoo().transform(name, train=train, test_size=test_size)


def bench(name: str, registry: str | Zoo | None = None, **options) -> dict:
    """Measure a model's throughput on this machine (device, batch, dtype, train, steps, warmup, compile,
    channels_last) and record the run in the registry, which must be writable (see zoo.throughput.benchmark.run)."""
    from zoo.throughput.benchmark import run

    return run(_registry(registry), name, **options)


def _registry(registry) -> Zoo:
    return registry if isinstance(registry, Zoo) else Zoo(registry)


__all__ = [
    "Zoo",
    "connect",
    "get",
    "info",
    "search",
    "check",
    "scan",
    "estimate",
    "transform",
    "bench",
    "F",
    "FIELDS",
    "ModelInfo",
    "TensorInfo",
    "cache_clear",
    "caches",
    "ZooError",
    "ModelNotFound",
    "AmbiguousName",
    "SearchSyntaxError",
    "InvalidComparison",
    "BuildFailed",
    "NotBuildable",
    "InvalidRecipe",
    "InvalidArgument",
    "UntrustedBuilder",
    "UnknownFamily",
    "SchemaOutdated",
    "RegistryDrift",
    "RegistryError",
    "RegistryLocked",
    "RegistryNotFound",
    "ModelExists",
    "CatalogError",
    "CheckpointError",
    "WeightsMismatch",
    "HubUnavailable",
    "DownloadBlocked",
    "MaterializeError",
    "AnalysisError",
    "AnalysisTimeout",
    "TokenizerNotCached",
    "WorkerFailed",
    "BenchFailed",
]


# Imported when first asked for: a search (`zoo search` as a process) needs none of them, and their modules cost
# a few ms of every start. zoo.__version__ reads the installed package's metadata.
_LAZY = {
    "ModelInfo": "zoo.model_info",
    "TensorInfo": "zoo.inspection",
    "cache_clear": "zoo.caching",
    "caches": "zoo.caching",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "__version__":
        from importlib.metadata import version

        return version("zoo")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
