"""zoo: find, size, plan and load PyTorch models from a registry built on the meta device.

Importing zoo is cheap: search and info never import torch; get() imports it when first called.
"""

from zoo.api import Zoo, connect
from zoo.errors import (
    AmbiguousName, BuildFailed, CheckpointError, InvalidRecipe, ModelNotFound, NotBuildable, RegistryDrift,
    RegistryNotFound, SchemaOutdated, SearchSyntaxError, UntrustedBuilder, WeightsMismatch, ZooError,
)
from zoo.info import ModelInfo
from zoo.inspection import TensorInfo
from zoo.search import FIELDS, F


def get(name: str, **overrides):
    """The model as an nn.Module of its own class, every tensor on meta (see Zoo.get)."""
    return Zoo().get(name, **overrides)


def info(name: str, tensors: bool = False) -> ModelInfo:
    """The recorded metadata of a model, without importing torch (see Zoo.info)."""
    return Zoo().info(name, tensors)


def check(name: str, weights, key_map=None):
    """How a checkpoint fits a model, from metadata alone (see Zoo.check)."""
    return Zoo().check(name, weights, key_map)


def search(expression=None, order_by: str | None = None, limit: int | None = 100) -> list[ModelInfo]:
    """Models matching e.g. "params<7e9 and family=timm" or F.params < 7e9 (see Zoo.search)."""
    return Zoo().search(expression, order_by, limit)


def scan(name_or_module, *inputs_or_shapes, **options):
    """Per-module output shapes and dtypes from one forward on meta, no weights (see zoo.analysis.scan)."""
    from zoo.analysis import scan as _scan  # torch only now, not when zoo is imported

    return _scan(name_or_module, *inputs_or_shapes, **options)


def estimate(name, batch: int = 1, dtype="bf16", training: bool = False, optimizer: str = "adamw",
             seq_len: int | None = None, registry=None):
    """Bytes for weights, gradients, optimizer states and activations, measured on meta (see zoo.analysis.estimate)."""
    from zoo.analysis import estimate as _estimate

    return _estimate(name, batch=batch, dtype=dtype, training=training, optimizer=optimizer, seq_len=seq_len,
                     registry=registry)


fields = FIELDS

__all__ = [
    "Zoo", "connect", "get", "info", "search", "check", "scan", "estimate", "F", "FIELDS", "fields", "ModelInfo",
    "TensorInfo",
    "ZooError", "ModelNotFound", "AmbiguousName", "SearchSyntaxError", "BuildFailed", "NotBuildable",
    "InvalidRecipe", "UntrustedBuilder", "SchemaOutdated", "RegistryDrift", "RegistryNotFound", "CheckpointError", "WeightsMismatch",
]
