"""Weight sources: safetensors files (single or sharded), torch pickles, in-memory state dicts.

Every source lists its tensors (name -> dtype name and shape) from metadata alone, then copies
one tensor, or a run of its leading rows, into a destination the caller allocated: a shard
loader can read only its rows.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import CheckpointError
from zoo.inspection import dtype_name
from zoo.weights import safetensors_format as st

PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt"}


@dataclass(frozen=True)
class Spec:
    dtype: str  # torch dtype name
    shape: tuple[int, ...]


class Source:
    specs: dict[str, Spec]

    def read_into(self, name: str, dest, rows: tuple[int, int] | None = None) -> None:
        """Copy the tensor (or rows [start, stop) of dim 0) into dest, whose dtype may differ."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SafetensorsSource(Source):
    """One or more safetensors files; bytes go from the file straight into the destination."""

    def __init__(self, files: list[Path]):
        self.entries: dict[str, tuple[int, st.Entry]] = {}
        self.fds: list[int] = []
        try:
            for path in files:
                entries, _ = st.read_header(path)
                self.fds.append(os.open(path, os.O_RDONLY))
                for e in entries:
                    if e.name in self.entries:
                        raise CheckpointError(f"{path}: tensor {e.name!r} is also in another shard")
                    self.entries[e.name] = (len(self.fds) - 1, e)
        except BaseException:
            self.close()
            raise
        self.specs = {n: Spec(e.dtype, e.shape) for n, (_, e) in self.entries.items()}

    def byte_range(self, name: str, rows: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """(fd, start, length) of a tensor or of rows of it in its file."""
        fd_index, e = self.entries[name]
        start, length = e.start, e.end - e.start
        if rows is not None:
            row_bytes = length // e.shape[0] if e.shape and e.shape[0] else 0
            start, length = start + rows[0] * row_bytes, (rows[1] - rows[0]) * row_bytes
        return self.fds[fd_index], start, length

    def read_into(self, name, dest, rows=None) -> None:
        import torch

        fd, start, length = self.byte_range(name, rows)
        file_dtype = getattr(torch, self.specs[name].dtype)
        if dest.device.type == "cpu" and dest.dtype == file_dtype and dest.is_contiguous():
            read_exact(fd, start, length, dest)
            return
        staging = torch.empty(dest.shape, dtype=file_dtype, pin_memory=dest.device.type == "cuda")
        read_exact(fd, start, length, staging)
        dest.copy_(staging)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def read_exact(fd: int, start: int, length: int, dest) -> None:
    """pread `length` bytes at `start` into a contiguous CPU tensor's memory; a short file is an error."""
    if length == 0:
        return
    view = memoryview(dest.view(-1).view(_uint8()).numpy())
    done = 0
    chunk = 256 << 20  # bounded single reads: Linux caps one read near 2 GiB
    while done < length:
        n = os.preadv(fd, [view[done:min(length, done + chunk)]], start + done)
        if n == 0:
            raise CheckpointError(f"weights file ended {length - done} bytes early (truncated?)")
        done += n


def _uint8():
    import torch

    return torch.uint8


class TensorDictSource(Source):
    """A state dict already in memory, or a pickle loaded with weights_only=True and mmap=True."""

    def __init__(self, tensors: dict):
        import torch

        bad = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise CheckpointError(f"state dict entries that are not tensors: {bad[:5]}")
        self.tensors = tensors
        self.specs = {k: Spec(dtype_name(v.dtype), tuple(v.shape)) for k, v in tensors.items()}

    def read_into(self, name, dest, rows=None) -> None:
        src = self.tensors[name]
        if src.is_meta:
            raise CheckpointError(f"{name}: a tensor on meta has no values to load")
        dest.copy_(src if rows is None else src[rows[0]:rows[1]])


def load_pickle(path: Path, on_meta: bool = False) -> dict:
    """A torch checkpoint, memory-mapped (or on meta: no data read), refusing any pickle that would run code."""
    import pickle

    import torch

    try:
        obj = (torch.load(path, map_location="meta", weights_only=True) if on_meta else
               torch.load(path, map_location="cpu", weights_only=True, mmap=True))
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a loadable weights-only torch checkpoint: {str(e).splitlines()[0]}") from None
    return unwrap_state_dict(obj, path)


def unwrap_state_dict(obj, where="checkpoint") -> dict:
    """The tensors of a checkpoint dict: itself, or under "state_dict" / "model" / "module" as trainers save them."""
    import torch

    for _ in range(3):
        if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
        if isinstance(obj, dict):
            inner = next((obj[k] for k in ("state_dict", "model", "module", "model_state_dict") if k in obj), None)
            if isinstance(inner, dict):
                obj = inner
                continue
        break
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors:
            return tensors
    raise CheckpointError(f"{where}: holds no state dict of tensors")


def safetensors_files(path: Path) -> list[Path]:
    """The files of a safetensors checkpoint: one file, an index JSON's shards, or a directory's."""
    if path.is_dir():
        indexes = sorted(path.glob("*.safetensors.index.json"))
        if len(indexes) == 1:
            return safetensors_files(indexes[0])
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{path}: no .safetensors files or index in this directory")
        return files
    if path.name.endswith(".safetensors.index.json"):
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: not a safetensors index ({e})") from None
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if Path(shard).name != shard:  # an index must not point outside its directory
                raise CheckpointError(f"{path}: shard name {shard!r} is not a plain file name")
        return [path.parent / s for s in shards]
    return [path]


def open_source(weights) -> Source:
    """A Source for a path (file, shard index, directory) or an in-memory state dict."""
    if isinstance(weights, dict):
        return TensorDictSource(unwrap_state_dict(weights, "state dict"))
    path = Path(weights)
    if not path.exists():
        raise CheckpointError(f"{path}: no such weights file or directory")
    if path.is_dir() or path.name.endswith((".safetensors", ".safetensors.index.json")):
        return SafetensorsSource(safetensors_files(path))
    if path.suffix in PICKLE_SUFFIXES:
        return TensorDictSource(load_pickle(path))
    raise CheckpointError(f"{path}: unknown weights format (want .safetensors, a shard index or directory, "
                          f"or {', '.join(sorted(PICKLE_SUFFIXES))})")


def specs_of(weights) -> dict[str, Spec]:
    """A checkpoint's tensor names, shapes and dtypes from metadata alone: headers, or a pickle on meta."""
    if isinstance(weights, dict):
        return TensorDictSource(unwrap_state_dict(weights, "state dict")).specs
    path = Path(weights)
    if path.suffix in PICKLE_SUFFIXES and path.is_file():
        return TensorDictSource(load_pickle(path, on_meta=True)).specs
    with open_source(path) as source:
        return source.specs
