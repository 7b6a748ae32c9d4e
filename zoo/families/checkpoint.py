"""Checkpoint family: the tensors of a weights file, read from its header or a meta-loaded pickle; no module."""

import math
from pathlib import Path

from zoo.errors import CheckpointError, NotBuildable
from zoo.inspection import TensorInfo

NAME = "checkpoint"
PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt"}


def available(patterns=()) -> list[str]:
    return []  # checkpoints are indexed one by one: `zoo index checkpoint FILE`


def check(builder: str, kwargs: dict) -> None:
    pass  # nothing is imported: the file is only read


def build(builder: str, kwargs: dict):
    raise NotBuildable(f"checkpoint {builder!r} records tensors only; there is no module to build")


def describe(builder: str, module) -> dict:
    return {"task": None, "input_size": None}


def versions() -> dict:
    return {}


def read_tensors(path: str) -> list[TensorInfo]:
    """Names, shapes and dtypes of a checkpoint's tensors, without reading their data."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from zoo.weights.safetensors import read_header

        entries, _ = read_header(path)
        return [TensorInfo(e.name, "parameter", True, e.shape, e.dtype, math.prod(e.shape), e.end - e.start)
                for e in entries]
    if path.suffix in PICKLE_SUFFIXES:
        return _pickle_tensors(path)
    raise CheckpointError(f"{path}: unknown checkpoint format (want .safetensors, {', '.join(sorted(PICKLE_SUFFIXES))})")


def _pickle_tensors(path: Path) -> list[TensorInfo]:
    import pickle

    import torch

    from zoo.inspection import dtype_name

    try:  # weights_only refuses any pickle that would run code; meta reads no data
        state = torch.load(path, map_location="meta", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path}: not a loadable weights-only torch checkpoint: {str(e).splitlines()[0]}") from None
    rows = []
    for name, t in _flatten(state):
        rows.append(TensorInfo(name, "parameter", True, tuple(t.shape), dtype_name(t.dtype), t.numel(),
                               t.numel() * t.element_size()))
    if not rows:
        raise CheckpointError(f"{path}: holds no tensors")
    return rows


def _flatten(obj, prefix=""):
    """Tensors of nested dicts ({"state_dict": {...}}, {"model": {...}}) under dotted names."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
