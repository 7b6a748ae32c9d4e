"""zoo: find, size, plan and load PyTorch models from a registry built on the meta device.

Importing zoo is cheap: search and info never import torch; get() imports it when first called.
The functions here work on the default registry ($ZOO_REGISTRY, else the shipped registry.db);
zoo.connect(url) gives a Zoo with the same methods on any other.
"""

from __future__ import annotations

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
    HardwareNotFound,
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

TYPE_CHECKING = False  # typing's, without importing typing: 2 ms of every `import zoo`
if TYPE_CHECKING:
    from typing import Any

    from torch import nn

    from zoo.analysis import Estimate, Scan
    from zoo.caching import cache_clear, caches
    from zoo.inspection import TensorInfo
    from zoo.model_info import ModelInfo
    from zoo.planning import Plan
    from zoo.weights.fit import Fit


def get(name: str, registry: str | Zoo | None = None, **options) -> nn.Module:
    """The model as an nn.Module of its own class, every tensor on meta, with .materialize() to load it.

    Args:
        name: the model ("timm/resnet50", or a unique short name).
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.
        **options: those of Zoo.get: weights, device, dtype, dispatch ("now" or "lazy"), constructor overrides.

    Returns:
        The module, materialized when weights or device is given (at once, or at first use with "lazy").

    Raises:
        ModelNotFound: no such model (AmbiguousName: a short name of several).
        BuildFailed: the model does not build (NotBuildable: an indexed checkpoint).
        InvalidArgument: a bad option.
        WeightsMismatch: the weights do not fit (CheckpointError: they cannot be read).
        MaterializeError: the allocation or load failed; the module is left as it was.

    Examples:
        >>> zoo.get("timm/resnet50").fc
        Linear(in_features=2048, out_features=1000, bias=True)
    """
    return _registry(registry).get(name, **options)


def info(name: str, tensors: bool = False, registry: str | Zoo | None = None) -> ModelInfo:
    """A model's recorded metadata, without importing torch.

    Args:
        name: the model.
        tensors: add its tensor table.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.

    Returns:
        The ModelInfo.

    Raises:
        ModelNotFound: no such model (AmbiguousName: a short name of several).
        RegistryNotFound: no registry there.

    Examples:
        >>> zoo.info("timm/resnet50").params
        25557032
    """
    return _registry(registry).info(name, tensors)


def check(name: str, weights, key_map=None, registry: str | Zoo | None = None) -> Fit:
    """How a checkpoint fits a model, from metadata alone (no tensor data read).

    Args:
        name: the model.
        weights: a file, directory, recorded tag or hf:// reference.
        key_map: checkpoint key -> the model's name (a dict or a function; None skips a key).
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.

    Returns:
        A Fit (matched, missing, unexpected, misshaped; .exact, .loads).

    Raises:
        ModelNotFound: no such model.
        BuildFailed: the model has no recorded tensors.
        CheckpointError: the file cannot be read.

    Examples:
        >>> zoo.check("timm/resnet18", "resnet18.safetensors").exact
        True
    """
    return _registry(registry).check(name, weights, key_map)


def search(
    expression=None,
    order_by: str | None = None,
    limit: int | None = None,
    fields=None,
    registry: str | Zoo | None = None,
    fits: str | None = None,
) -> list[ModelInfo] | list[dict]:
    """Every model matching a search, from the registry alone (torch is never imported).

    Args:
        expression: "params<7e9 and family=timm and name~'vit_*'", or F.params < 7e9; None: every model.
        order_by: a field, "-field" for descending.
        limit: the first `limit` matches only.
        fields: field names: a dict of just those per model instead of a ModelInfo; with fits, also max_batch.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.
        fits: only the models whose plan fits this hardware and run ("H100 train batch=8 seq=4096 fsdp=8 devices=8":
            the hardware, train or infer, then the plan's keywords as key=value), from recorded data.

    Returns:
        A list of ModelInfo, or of dicts with `fields`.

    Raises:
        SearchSyntaxError: a malformed search or an unknown field (InvalidComparison: a value of the wrong kind).
        InvalidArgument: a bad limit, order_by or field name; a malformed fits or one zoo index records no plan for.
        HardwareNotFound: fits names hardware that is neither a listed device nor an amount of memory.
        RegistryNotFound: no registry there.

    Examples:
        >>> [m.name for m in zoo.search("top1>85 and params<30M", order_by="-top1", limit=1)]
        ['timm/tiny_vit_21m_512.dist_in22k_ft_in1k']
        >>> zoo.search("name~'*Llama-3.1-8B'", fits="H100 train seq=4096 fsdp=8 devices=8", fields=["max_batch"])
        [{'max_batch': 1}]
    """
    return _registry(registry).search(expression, order_by, limit, fields, fits)


def scan(name_or_module, *inputs_or_shapes, registry: str | Zoo | None = None, **options) -> Scan:
    """Every submodule's output shapes and dtypes from one forward on meta, no weights.

    Args:
        name_or_module: a model's name, or a module from zoo.get.
        *inputs_or_shapes: tensors or shapes, or a text for a registered hf model; none: the recorded input.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.
        **options: those of zoo.analysis.scan.

    Returns:
        A Scan: a row per submodule.

    Raises:
        ModelNotFound: no such model.
        AnalysisError: no input to run with, or a model that cannot run on meta.
        TokenizerNotCached: a text for a model whose tokenizer is not in the hub cache.

    Examples:
        >>> zoo.scan("timm/resnet18")["fc"].outputs
        [['', [1, 1000], 'float32']]
    """
    return _registry(registry).scan(name_or_module, *inputs_or_shapes, **options)


def estimate(name_or_module, registry: str | Zoo | None = None, **options) -> Estimate:
    """Bytes for weights, gradients, optimizer states, KV cache and activations, measured on meta.

    Args:
        name_or_module: a model's name, or a module from zoo.get.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.
        **options: zoo.analysis.memory.EstimateOptions: batch, dtype, training, optimizer, seq_len, kv_dtype,
            weights_dtype, group_size, checkpointing.

    Returns:
        An Estimate: each term in bytes, their total and the peak.

    Raises:
        InvalidArgument: an unknown option.
        AnalysisError: an option out of range, or a model that cannot run on meta.
        ModelNotFound: no such model.

    Examples:
        >>> zoo.estimate("timm/resnet50", batch=32, dtype="fp32", training=True, optimizer="sgd").total > 0
        True
    """
    return _registry(registry).estimate(name_or_module, **options)


def plan(name_or_module, registry: str | Zoo | None = None, **options) -> Plan:
    """What a run needs on each device under DDP, FSDP2 and tensor parallelism, whether it fits the hardware, the
    largest batch that does, and a predicted step time (zoo.planning says what each term counts).

    Args:
        name_or_module: a model's name, or a module from zoo.get.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.
        **options: zoo.planning.PlanOptions: hardware (a device of catalog/hardware.csv by name or short name:
            "H100", "A100-80GB", "RTX 4090"; "cpu" for this machine's RAM; or bytes: "24GiB"), devices, training,
            batch (per device), seq_len, input_size (a vision model's (C, H, W)), dtype (fp32, bf16, fp16, amp-bf16,
            amp-fp16: autocast, emulated on meta), optimizer (adamw, adam, sgd, none), fsdp, tp, checkpointing,
            kv_dtype.

    Returns:
        A Plan: per_device bytes (weights, gradients, optimizer, activations, kv_cache, other, total), capacity,
        fits, max_batch, max_context and max_tokens (serving), step_seconds.

    Raises:
        InvalidArgument: an unknown or invalid option (a batch below 1, devices not a multiple of fsdp x tp, a tp
            that does not divide the heads).
        HardwareNotFound: an unknown hardware name; the message lists the close ones.
        ModelNotFound: no such model.
        AnalysisError: a model that cannot run on meta.

    Examples:
        >>> p = zoo.plan("hf/meta-llama/Llama-3.1-8B", hardware="H100", training=True, fsdp=8, devices=8, seq_len=4096)
        >>> p.fits, p.max_batch
    """
    return _registry(registry).plan(name_or_module, **options)


def transform(name: str, train: bool = False, test_size: bool = False, registry: str | Zoo | None = None):
    """The torchvision transform a model's weights expect, built without the model.

    Args:
        name: the model.
        train: the training transform instead of evaluation's.
        test_size: at the published test size instead of the input size.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.

    Returns:
        A torchvision transform (PIL image -> normalized tensor).

    Raises:
        ModelNotFound: no such model.
        InvalidArgument: no recorded preprocessing.

    Examples:
        >>> type(zoo.transform("timm/resnet50.a1_in1k")).__name__
        'Compose'
    """
    return _registry(registry).transform(name, train=train, test_size=test_size)


def bench(name: str, registry: str | Zoo | None = None, **options) -> dict:
    """Measure a model's throughput on this machine and record the run in the registry (which must be writable).

    Args:
        name: the model.
        registry: a URL, path or Zoo; default $ZOO_REGISTRY, else the shipped registry.db.
        **options: zoo.throughput.benchmark.BenchOptions: device, batch, dtype, train, steps, warmup, compile,
            channels_last.

    Returns:
        The recorded run: samples per second, the configuration, the machine.

    Raises:
        InvalidArgument: a bad option.
        BenchFailed: the model cannot run there (out of memory, say).
        ModelNotFound: no such model.
        RegistryError: the registry cannot be written.

    Examples:
        >>> zoo.bench("timm/resnet18", registry="my.db", batch=8, steps=5)["samples_per_s"] > 0
        True
    """
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
    "plan",
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
    "HardwareNotFound",
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
