"""Weight sources: safetensors files (single or sharded), torch pickles, in-memory state dicts.

Every source lists its tensors (name -> dtype name and shape) from metadata alone, then copies
one tensor, or a box of it, into a destination the caller allocated: a rank of a sharded model
reads only its part. Paths are untrusted: only regular files are opened (zoo.weights.paths).
"""

import io
import itertools
import math
import mmap
import os
import re
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import CheckpointError, InvalidArgument
from zoo.inspection import dtype_name
from zoo.weights import safetensors_format as st
from zoo.weights.paths import open_regular, regular_file
from zoo.weights.placement import Box, box_slices, leading_rows

PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt"}
# Where training scripts keep the model's state in the checkpoints they write: timm's train.py (last.pth.tar,
# model_best.pth.tar: state_dict, state_dict_ema), torchvision's references (checkpoint.pth: model, model_ema),
# Lightning and others. The first key present is read; `#ema` after the path asks for the EMA copy.
STATE_KEYS = ("state_dict", "model", "module", "model_state_dict")
EMA_KEYS = ("state_dict_ema", "model_ema")
EMA_FRAGMENT = "#ema"
_CAST_CHUNK = 16 << 20  # bytes of the file converted at a time: a cast load's transient memory per thread


@dataclass(frozen=True)
class Spec:
    dtype: str  # torch dtype name
    shape: tuple[int, ...]


class Source:
    specs: dict[str, Spec]

    def read_into(self, name: str, dest, box: Box | None = None) -> None:
        """Copy the tensor, or the box of it ((start, stop) per dim), into dest: a contiguous CPU tensor
        of the box's shape whose dtype may differ (then cast)."""
        raise NotImplementedError

    def check_unchanged(self) -> None:
        """CheckpointError if a file this source reads was written since it was opened (its values would
        mix two versions): called once the reads are done and before the file is mapped."""

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
        self.paths: list[Path] = []
        self.states: list[tuple] = []  # each file as opened: any write changes its mtime and ctime
        self._maps: dict[int, mmap.mmap | None] = {}  # fd -> its mapping, for casts (None: cannot map)
        self._lock = threading.Lock()
        try:
            for path in files:
                self.fds.append(open_regular(path))
                self.paths.append(path)
                self.states.append(file_state(self.fds[-1]))
                entries, _ = st.read_header(path, self.fds[-1])  # header and data from one open file
                for e in entries:
                    if e.name in self.entries:
                        raise CheckpointError(f"{path}: tensor {e.name!r} is also in another shard")
                    self.entries[e.name] = (len(self.fds) - 1, e)
        except BaseException:
            self.close()
            raise
        self.specs = {n: Spec(e.dtype, e.shape) for n, (_, e) in self.entries.items()}

    def check_unchanged(self) -> None:
        for path, fd, state in zip(self.paths, self.fds, self.states):
            if file_state(fd) != state:
                raise CheckpointError(
                    f"{path}: the weights file was written while it was being loaded; load it again once it is complete"
                )

    def byte_range(self, name: str, rows: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """(fd, start, length) of a tensor or of rows of it in its file."""
        fd_index, e = self.entries[name]
        start, length = e.start, e.end - e.start
        if rows is not None:
            row_bytes = length // e.shape[0] if e.shape and e.shape[0] else 0
            start, length = start + rows[0] * row_bytes, (rows[1] - rows[0]) * row_bytes
        return self.fds[fd_index], start, length

    def read_into(self, name, dest, box=None) -> None:
        import torch

        file_dtype = getattr(torch, self.specs[name].dtype)
        rows = leading_rows(box, self.specs[name].shape)
        on_cpu = dest.device.type == "cpu" and dest.is_contiguous()
        if on_cpu and rows is not False:
            fd, start, length = self.byte_range(name, rows)
            if dest.dtype == file_dtype:
                read_exact(fd, start, length, dest)
                return
            if start % file_dtype.itemsize == 0:
                self._cast_mapped(fd, start, length, file_dtype, dest)
                return
        staging = torch.empty(dest.shape, dtype=file_dtype, pin_memory=dest.device.type == "cuda")
        if rows is False:  # a box strided in the file (a Shard(d > 0)): one read per contiguous run
            self._read_strided(name, box, staging)
        else:
            read_exact(*self.byte_range(name, rows), staging)
        dest.copy_(staging)

    def _cast_mapped(self, fd: int, start: int, length: int, file_dtype, dest) -> None:
        """A cast in one pass: the file's pages, mapped, converted straight into dest a chunk at a time;
        each chunk's pages leave this process's resident set once converted (the page cache keeps
        them), so a cast load holds the destination and a few chunks, never a staging copy."""
        import torch

        with self._lock:
            if fd not in self._maps:  # private and never written: no copy of a page is ever made
                try:
                    self._maps[fd] = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
                except OSError:  # no address space for the whole file (ulimit -v), a file system without mmap
                    self._maps[fd] = None
        mapped = self._maps[fd]
        if mapped is not None and start + length > len(mapped):
            raise CheckpointError(f"weights file ended {start + length - len(mapped)} bytes early (truncated?)")
        itemsize, flat = file_dtype.itemsize, dest.view(-1)
        step = _CAST_CHUNK // itemsize
        # unmapped: the same chunks read into one bounded buffer, so the load still holds no staging copy
        staging = torch.empty(min(step, flat.numel()), dtype=file_dtype) if mapped is None else None
        for i in range(0, flat.numel(), step):
            n = min(step, flat.numel() - i)
            offset = start + i * itemsize
            if mapped is None:
                assert staging is not None  # made above for an unmapped file
                read_exact(fd, offset, n * itemsize, staging[:n])
                flat[i : i + n].copy_(staging[:n])
                continue
            flat[i : i + n].copy_(torch.frombuffer(mapped, dtype=file_dtype, count=n, offset=offset))
            first_page = offset // mmap.PAGESIZE * mmap.PAGESIZE
            mapped.madvise(mmap.MADV_DONTNEED, first_page, offset + n * itemsize - first_page)

    def _read_strided(self, name, box, dest) -> None:
        """The box's bytes, run by run: the innermost dims the box holds whole are one contiguous run
        per index of the dims before them."""
        fd_index, e = self.entries[name]
        shape, itemsize = e.shape, dest.element_size()  # dest is in the file's dtype
        inner = len(shape)
        while inner > 0 and box[inner - 1] == (0, shape[inner - 1]):
            inner -= 1
        # the run: dim inner-1's span of the box, times every dim after it
        run_dims = inner - 1
        run_elems = (box[run_dims][1] - box[run_dims][0]) * math.prod(shape[run_dims + 1 :])
        strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
        flat = dest.view(-1)
        for n, outer in enumerate(itertools.product(*(range(s, t) for s, t in box[:run_dims]))):
            first = sum(i * strides[d] for d, i in enumerate(outer)) + box[run_dims][0] * strides[run_dims]
            read_exact(
                self.fds[fd_index],
                e.start + first * itemsize,
                run_elems * itemsize,
                flat[n * run_elems : (n + 1) * run_elems],
            )

    def close(self) -> None:
        for mapped in self._maps.values():
            if mapped is not None:
                mapped.close()
        self._maps = {}
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def file_state(file) -> tuple:
    """What identifies a file's version, of an open descriptor or a path: any write changes its mtime and ctime."""
    st = os.stat(file)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def read_exact(fd: int, start: int, length: int, dest) -> None:
    """pread `length` bytes at `start` into a contiguous CPU tensor's memory; a short file is an error."""
    if length == 0:
        return
    view = memoryview(dest.view(-1).view(_uint8()).numpy())
    done = 0
    chunk = 256 << 20  # bounded single reads: Linux caps one read near 2 GiB
    while done < length:
        try:
            n = os.preadv(fd, [view[done : min(length, done + chunk)]], start + done)
        except OSError as e:  # EIO from a failing disk or network file system
            raise CheckpointError(f"reading the weights file failed: {e.strerror}") from None
        if n == 0:
            raise CheckpointError(f"weights file ended {length - done} bytes early (truncated?)")
        done += n


def _uint8():
    import torch

    return torch.uint8


class TensorDictSource(Source):
    """A state dict already in memory, or a pickle loaded with weights_only=True (memory-mapped when it can be).
    origin: the key of a training checkpoint the state dict was found under (None: the file is one)."""

    def __init__(self, tensors: dict, origin: str | None = None):
        import torch

        bad = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise CheckpointError(f"state dict entries that are not tensors: {bad[:5]}")
        # refused here, before anything is allocated, not halfway through the copies
        empty = [k for k, v in tensors.items() if v.is_meta or v.layout != torch.strided or v.is_quantized]
        if empty:
            raise CheckpointError(
                f"state dict entries with no plain values to load (on meta, sparse or quantized): {empty[:5]}"
            )
        self.tensors, self.origin = tensors, origin
        self.specs = _specs(tensors)

    def read_into(self, name, dest, box=None) -> None:
        src = self.tensors[name]
        dest.copy_(src if box is None else src[box_slices(box)])


def _specs(tensors: dict) -> dict[str, Spec]:
    return {k: Spec(dtype_name(v.dtype), tuple(v.shape)) for k, v in tensors.items()}


def is_pickle(path: Path) -> bool:
    """A torch.save file by its name: .pt, .pth, .bin, .ckpt, or timm's .pth.tar (a torch zip, not a tar)."""
    return path.suffix in PICKLE_SUFFIXES or path.name.endswith(".pth.tar")


def split_ema(weights):
    """(path, ema): a path ending in #ema that names no file as it is asks for a training checkpoint's EMA copy."""
    if isinstance(weights, (str, os.PathLike)) and str(weights).endswith(EMA_FRAGMENT) and not os.path.lexists(weights):
        return type(weights)(str(weights)[: -len(EMA_FRAGMENT)]), True
    return weights, False


def load_pickle(path: Path, on_meta: bool = False) -> dict:
    """A torch checkpoint's state dict (see load_checkpoint)."""
    return load_checkpoint(path, on_meta)[0]


def load_checkpoint(path: Path, on_meta: bool = False, ema: bool = False) -> tuple[dict, str | None]:
    """A torch checkpoint's state dict and the key it was found under, weights-only: a pickle that would run
    code is refused. Training scripts' checkpoints also hold their arguments as an argparse.Namespace: it is
    allowed as data (an object with a __dict__ of what the unpickler builds anyway), never a constructor call.

    A zip checkpoint (torch.save's default) is memory-mapped, or loaded on meta (no data read); its
    records are first checked to hold the bytes the pickle asks for, which torch skips under mmap.
    A legacy (non-zip) one cannot be mapped: it is read into memory (on meta: read and dropped)."""
    import argparse

    import torch

    with os.fdopen(open_regular(path), "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"  # torch's own test (torch.serialization._is_zipfile)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            if is_zip:
                _check_zip_records(path)
            obj = torch.load(
                path, map_location="meta" if on_meta else "cpu", weights_only=True, mmap=is_zip and not on_meta
            )
    except CheckpointError:
        raise
    except Exception as e:  # whatever a corrupt file makes torch or its unpickler raise
        raise CheckpointError(_pickle_failure(path, e)) from None
    return state_dict_of(obj, path, ema)


def _pickle_failure(path, e: Exception) -> str:
    message = " ".join(str(e).split())
    code = re.search(r"GLOBAL ([\w.]+)", message)  # torch's weights-only unpickler names what it refused
    if code:
        return (
            f"{path}: its pickle would run code ({code.group(1)}); zoo loads pickles weights-only and never "
            f"runs their code: save the state dict of tensors alone (torch.save(model.state_dict())) or as "
            f".safetensors"
        )
    detail = message[:300] or ("the file ends early" if isinstance(e, EOFError) else "no detail")
    return f"{path}: not a loadable weights-only torch checkpoint (corrupt or truncated?): {type(e).__name__}: {detail}"


def _check_zip_records(path: Path) -> None:
    """Every storage the pickle asks for must be a stored (uncompressed) record of exactly its size:
    under mmap=True torch maps the record's offset without this check, so a short record would be
    read on into the bytes after it. Reads the zip directory and data.pkl only, with torch's own
    weights-only unpickler (it builds tensors and containers, and runs no code)."""
    import torch
    from torch._weights_only_unpickler import Unpickler

    with zipfile.ZipFile(path) as archive:
        records, prefix = archive_records(archive, f"{path}:")
        if prefix + "data.pkl" not in records:
            raise CheckpointError(f"{path}: a zip archive without {prefix}data.pkl; not a torch.save file")
        pickled = archive.read(prefix + "data.pkl")

    def persistent_load(pid):  # ("storage", storage type, key, location, numel): torch's format
        _, storage_type, key, _, numel = pid
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        nbytes = numel * dtype.itemsize
        record = records.get(f"{prefix}data/{key}")
        if record is None or record.compress_type != zipfile.ZIP_STORED or record.file_size != nbytes:
            found = (
                "missing"
                if record is None
                else f"{record.file_size} bytes"
                + (", compressed" if record.compress_type != zipfile.ZIP_STORED else "")
            )
            raise CheckpointError(
                f"{path}: storage {key!r} needs {nbytes} bytes but its record data/{key} is "
                f"{found}; the file is corrupt or truncated: save it again"
            )
        return torch.storage.TypedStorage(
            wrap_storage=torch.UntypedStorage(nbytes, device="meta"), dtype=dtype, _internal=True
        )

    unpickler = Unpickler(io.BytesIO(pickled), encoding="utf-8")
    unpickler.persistent_load = persistent_load
    unpickler.load()


def archive_records(archive: zipfile.ZipFile, where: str) -> tuple[dict, str]:
    """A torch.save archive's records by name, each once, and their folder (torch's reader: the first
    record's); a name twice is a CheckpointError starting with `where`."""
    records = {}
    for info in archive.infolist():
        if info.filename in records:
            raise CheckpointError(f"{where} the archive holds {info.filename!r} twice; not a torch.save file")
        records[info.filename] = info
    return records, next(iter(records), "").split("/")[0] + "/"


def unwrap_state_dict(obj, where="checkpoint") -> dict:
    """The tensors of a checkpoint dict: itself, or under "state_dict" / "model" / "module" as trainers save them."""
    return state_dict_of(obj, where)[0]


def state_dict_of(obj, where="checkpoint", ema: bool = False) -> tuple[dict, str | None]:
    """The tensors of a checkpoint dict and the key they were under (None: the dict itself): under one of
    STATE_KEYS as trainers save them, or with `ema` one of EMA_KEYS. torchvision's EMA is an AveragedModel's
    state dict: its `module.` prefix is the wrapper's (removed when matching), its n_averaged no weight."""
    import torch

    keys, used = EMA_KEYS if ema else STATE_KEYS, list[str]()
    for _ in range(3):
        plain = isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values())
        if plain and (used or not ema):  # a state dict itself (an EMA copy is under a key)
            break
        key = next((k for k in keys if isinstance(obj, dict) and isinstance(obj.get(k), dict)), None)
        if key is None:
            break
        obj, keys = obj[key], STATE_KEYS
        used.append(key)
    if ema and not used:
        found = ", ".join(sorted(str(k) for k in obj)) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"{where}: holds no EMA state dict ({' or '.join(EMA_KEYS)}; it holds {found})")
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if "n_averaged" in tensors and all(k.startswith("module.") for k in tensors if k != "n_averaged"):
            del tensors["n_averaged"]
        if tensors:
            return tensors, ".".join(used) or None
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
        files = [path.parent / s for s in shard_names(path)]
        for file in files:
            regular_file(file, f"shard of {path.name}")
        return files
    return [path]


def shard_names(index: Path) -> list[str]:
    """The shard file names a safetensors index's weight_map names: plain names of files beside it."""
    with os.fdopen(open_regular(index, "shard index"), "rb") as f:
        document = st.parse_json(f.read(), index, "shard index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(
            f'{index}: not a safetensors index: want {{"weight_map": {{tensor name: shard file name, ...}}}}'
        )
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if shard in ("", ".", "..") or Path(shard).name != shard:  # an index must not point outside its directory
            raise CheckpointError(f"{index}: shard name {shard!r} is not a plain file name")
    return shards


def weights_file(weights) -> Path:
    """The path `weights` names: a str or os.PathLike; anything else (a number, bytes, a list) is refused."""
    if not isinstance(weights, (str, os.PathLike)):
        raise InvalidArgument(
            f"weights is a path, a weights tag, 'pretrained', 'hf://ORG/NAME' or a state dict, not "
            f"{type(weights).__name__} {weights!r:.80}"
        )
    return Path(weights)
