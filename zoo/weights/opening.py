"""Which reader a weights argument needs: a path (a file, a shard index, a safetensors or torch.distributed.checkpoint
directory), an in-memory state dict, or a Source itself. Its own module so that the readers (zoo.weights.sources)
and the DCP reader (zoo.weights.dcp, built on them) import each other in one direction only."""

from zoo.errors import CheckpointError
from zoo.weights.dcp import DcpSource
from zoo.weights.sources import (
    EMA_FRAGMENT,
    PICKLE_SUFFIXES,
    SafetensorsSource,
    Source,
    Spec,
    TensorDictSource,
    _specs,
    is_pickle,
    load_checkpoint,
    regular_file,
    safetensors_files,
    split_ema,
    state_dict_of,
    weights_file,
)


def open_source(weights) -> Source:
    """A Source for a path (file, shard index, directory), an in-memory state dict, or a Source itself. A
    training checkpoint's path followed by #ema reads its EMA copy."""
    if isinstance(weights, Source):
        return weights
    if isinstance(weights, dict):
        return TensorDictSource(*state_dict_of(weights, "state dict"))
    weights, ema = split_ema(weights)
    path = weights_file(weights)
    if ema:
        if path.is_dir() or not is_pickle(path):
            raise CheckpointError(
                f"{path}: {EMA_FRAGMENT} names the EMA copy in a training checkpoint (a torch.save file)"
            )
        regular_file(path)
        return TensorDictSource(*load_checkpoint(path, ema=True))
    if path.is_dir() and (path / ".metadata").exists():  # a torch.distributed.checkpoint directory
        return DcpSource(path)
    if path.is_dir():
        return SafetensorsSource(safetensors_files(path))
    regular_file(path)
    if path.name.endswith((".safetensors", ".safetensors.index.json")):
        return SafetensorsSource(safetensors_files(path))
    if is_pickle(path):
        return TensorDictSource(*load_checkpoint(path))
    raise CheckpointError(
        f"{path}: unknown weights format (want .safetensors, a shard index or directory, "
        f"or {', '.join(sorted(PICKLE_SUFFIXES))}, .pth.tar)"
    )


def specs_of(weights) -> dict[str, Spec]:
    """A checkpoint's tensor names, shapes and dtypes from metadata alone: headers, or a pickle on meta."""
    return specs_and_origin(weights)[0]


def specs_and_origin(weights) -> tuple[dict[str, Spec], str | None]:
    """specs_of, and the key of a training checkpoint the state dict is under (None: the file is one)."""
    if isinstance(weights, dict):
        return TensorDictSource(*state_dict_of(weights, "state dict")).specs, None
    plain, ema = split_ema(weights)
    path = weights_file(plain)
    if is_pickle(path) and not path.is_dir():
        tensors, origin = load_checkpoint(path, on_meta=True, ema=ema)
        return _specs(tensors), origin
    with open_source(weights) as source:
        return source.specs, getattr(source, "origin", None)
