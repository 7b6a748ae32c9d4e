"""Checkpoint family: the tensors of a weights file, read from its header or a meta-loaded pickle; no module."""

import math
from pathlib import Path

from zoo.errors import CheckpointError, NotBuildable
from zoo.inspection import TensorInfo
from zoo.weights.sources import PICKLE_SUFFIXES, is_pickle

NAME = "checkpoint"
BUILDS = False  # a checkpoint row records a file's tensors: there is no module to get


def available(patterns=()) -> list[str]:
    return []  # checkpoints are indexed one by one: `zoo index checkpoint FILE`


def check(builder: str, kwargs: dict, trusted: set[str] | None = None) -> None:
    pass  # nothing is imported: the file is only read


def build(builder: str, kwargs: dict):
    raise NotBuildable(f"checkpoint {builder!r} records tensors only; there is no module to build")


def describe(builder: str, module, tag: str | None = None) -> dict:
    return {"task": None, "input_size": None}


def versions() -> dict:
    return {}


def read_tensors(path: str | Path) -> list[TensorInfo]:
    """Names, shapes and dtypes of a checkpoint's tensors, without reading their data."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from zoo.weights.safetensors_format import read_header

        entries, _ = read_header(path)
        return [
            TensorInfo(e.name, "parameter", True, e.shape, e.dtype, math.prod(e.shape), e.end - e.start)
            for e in entries
        ]
    if is_pickle(path):
        return _pickle_tensors(path)
    raise CheckpointError(
        f"{path}: unknown checkpoint format (want .safetensors, {', '.join(sorted(PICKLE_SUFFIXES))}, .pth.tar)"
    )


def _pickle_tensors(path: Path) -> list[TensorInfo]:
    """A torch checkpoint's state dict read on meta (weights_only: a pickle with code is refused),
    under the names materialize would load them by ({"state_dict": ...} wrappers unwrapped)."""
    import torch

    from zoo.weights.opening import specs_of

    rows = []
    for name, spec in specs_of(path).items():
        itemsize = getattr(torch, spec.dtype).itemsize
        rows.append(
            TensorInfo(
                name, "parameter", True, spec.shape, spec.dtype, math.prod(spec.shape), math.prod(spec.shape) * itemsize
            )
        )
    return rows
