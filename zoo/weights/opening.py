"""Which reader a weights argument needs: a path (a file, a shard index, a safetensors or torch.distributed.checkpoint
directory), an in-memory state dict, or a Source itself. Its own module so that the readers (zoo.weights.sources)
and the DCP reader (zoo.weights.dcp, built on them) import each other in one direction only."""

from zoo.errors import CheckpointError
from zoo.weights.dcp import DcpSource
from zoo.weights.sources import (
    PICKLE_SUFFIXES,
    SafetensorsSource,
    Source,
    Spec,
    TensorDictSource,
    _specs,
    load_pickle,
    regular_file,
    safetensors_files,
    unwrap_state_dict,
    weights_file,
)


def open_source(weights) -> Source:
    """A Source for a path (file, shard index, directory), an in-memory state dict, or a Source itself."""
    if isinstance(weights, Source):
        return weights
    if isinstance(weights, dict):
        return TensorDictSource(unwrap_state_dict(weights, "state dict"))
    path = weights_file(weights)
    if path.is_dir() and (path / ".metadata").exists():  # a torch.distributed.checkpoint directory
        return DcpSource(path)
    if path.is_dir():
        return SafetensorsSource(safetensors_files(path))
    regular_file(path)
    if path.name.endswith((".safetensors", ".safetensors.index.json")):
        return SafetensorsSource(safetensors_files(path))
    if path.suffix in PICKLE_SUFFIXES:
        return TensorDictSource(load_pickle(path))
    raise CheckpointError(
        f"{path}: unknown weights format (want .safetensors, a shard index or directory, "
        f"or {', '.join(sorted(PICKLE_SUFFIXES))})"
    )


def specs_of(weights) -> dict[str, Spec]:
    """A checkpoint's tensor names, shapes and dtypes from metadata alone: headers, or a pickle on meta."""
    if isinstance(weights, dict):
        return TensorDictSource(unwrap_state_dict(weights, "state dict")).specs
    path = weights_file(weights)
    if path.suffix in PICKLE_SUFFIXES and not path.is_dir():
        return _specs(load_pickle(path, on_meta=True))
    with open_source(path) as source:
        return source.specs
