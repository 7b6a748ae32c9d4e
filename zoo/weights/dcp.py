"""Weights from a torch.distributed.checkpoint (DCP) directory, as dcp.save writes it from one rank or many.

The directory holds `.metadata`, a pickle of DCP's dataclasses (each tensor's dtype, global shape and
chunks, and where each chunk is stored), and `__R_I.distcp` data files in which every chunk is a whole
torch.save archive (a stored zip: data.pkl plus the raw storage) at an offset. Nothing a pickle names
runs: `.metadata` is read into inert stand-ins of DCP's own classes (torch's weights-only unpickler
cannot read pickle protocol 4), a chunk's data.pkl by torch's weights-only unpickler onto meta; the
bytes then come straight from the files by pread, only the chunks (and rows of them) a box needs.
"""

import io
import math
import os
import pickle
import struct
import sys
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.errors import CheckpointError, InvalidArgument
from zoo.inspection import dtype_name
from zoo.weights.paths import open_regular, regular_file
from zoo.weights.sources import Source, Spec, archive_records, read_exact
from zoo.weights.tiling import check_tiling

if TYPE_CHECKING:  # torch only when a checkpoint is read
    import torch

METADATA = ".metadata"
MAX_METADATA_BYTES = 1 << 30  # a model of 10^5 tensors on 10^3 ranks stays well below
MAX_CHUNK_PICKLE_BYTES = 1 << 20  # a chunk's data.pkl describes one tensor: a few hundred bytes
MAX_DIMS = 64


class _Record:
    """An inert stand-in for one of DCP's metadata classes: it keeps what the pickle hands it and runs nothing."""

    def __init__(self, *args):  # REDUCE calls the class: an enum's value, a path's parts, a layout's name
        self.args = args

    def __setstate__(self, state):  # BUILD: a dataclass's fields (TensorProperties: a tuple)
        self.state = state


_RECORDS = {
    name: type(name, (_Record,), {})
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_StorageInfo",
        "Other",
    )
}
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_STAND_INS = {
    **{
        (_METADATA_MODULE, name): _RECORDS[name]
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _RECORDS["_StorageInfo"],
    # where older torch kept TensorProperties
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"): _RECORDS["TensorProperties"],
    # fields zoo never reads: a memory format, a layout, StorageMeta's checkpoint path
    **{
        key: _RECORDS["Other"]
        for key in (
            (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"),
            ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
            ("torch.serialization", "_get_layout"),
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("pathlib", "WindowsPath"),
            ("pathlib", "PureWindowsPath"),
        )
    },
    ("torch", "Size"): lambda dims=(): tuple(dims),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path):
        super().__init__(file)
        self.path = path

    def find_class(self, module, name):
        import torch

        found = _STAND_INS.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise CheckpointError(
                f"{self.path}: its pickle names {module}.{name}, which is not part of DCP's "
                f"checkpoint metadata; zoo never runs a pickle's code: save the checkpoint "
                f"again with torch.distributed.checkpoint.save"
            )
        return found


@dataclass
class _Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str = ""  # a data file's name in the directory
    start: int = 0  # of its torch.save archive in that file
    length: int = 0
    # read from the archive when first needed: (data start in the file, storage offset, strides, contiguous)
    layout: "tuple | None" = field(default=None, repr=False)


@dataclass
class _Tensor:
    fqn: str
    dtype: "torch.dtype"
    shape: tuple[int, ...]
    chunks: list[_Chunk]


class DcpSource(Source):
    """A DCP checkpoint directory. Keys of a state dict saved as {"model": ..., "optim": ...} lose their
    "model." prefix and the other groups are left out; non-tensor (bytes) entries are never listed."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.fds: dict[str, int] = {}
        self._lock = threading.Lock()  # materialize reads tensors from several threads
        metadata_path = self.directory / METADATA
        fields = _fields(_read_metadata(metadata_path), "Metadata", metadata_path, "the checkpoint")
        tensors, paths = _tensors(fields, metadata_path)
        self.tensors = {name: tensors[fqn] for name, fqn in _exposed(tensors, paths).items()}
        self._locate(fields.get("storage_data"), metadata_path)
        self.specs = {name: Spec(dtype_name(t.dtype), t.shape) for name, t in self.tensors.items()}

    def _locate(self, storage_data, metadata_path) -> None:
        """Each exposed chunk's file and byte range, checked against the file's size."""
        if not isinstance(storage_data, dict):
            raise CheckpointError(
                f"{metadata_path}: no storage_data (where each chunk is); not a FileSystemWriter checkpoint"
            )
        where = {}
        for index, info in storage_data.items():
            index = _fields(index, "MetadataIndex", metadata_path, "a storage index")
            if not isinstance(index.get("fqn"), str):
                raise CheckpointError(f"{metadata_path}: a storage index without a name")
            if index.get("offset") is not None:  # None: a bytes entry
                where[(index.get("fqn"), _dims(index.get("offset"), metadata_path, "a storage index"))] = info
        sizes: dict[str, int] = {}
        for t in self.tensors.values():
            for c in t.chunks:
                info = where.get((t.fqn, c.offsets))
                if info is None:
                    raise CheckpointError(f"{metadata_path}: no storage entry for the chunk of {t.fqn} at {c.offsets}")
                info = _fields(info, "_StorageInfo", metadata_path, f"the storage of {t.fqn}")
                c.file, c.start, c.length = info.get("relative_path"), info.get("offset"), info.get("length")
                if not isinstance(c.file, str) or c.file in ("", ".", "..") or Path(c.file).name != c.file:
                    raise CheckpointError(f"{metadata_path}: data file {c.file!r} of {t.fqn} is not a plain file name")
                if not all(type(v) is int and v >= 0 for v in (c.start, c.length)):
                    raise CheckpointError(f"{metadata_path}: a bad byte range for {t.fqn}: {c.start!r}, {c.length!r}")
                if info.get("transform_descriptors"):
                    raise CheckpointError(
                        f"{metadata_path}: {t.fqn} is stored through "
                        f"{list(info['transform_descriptors'])!r} (compressed); zoo reads plain "
                        f"chunks only: save without _extensions"
                    )
                if c.file not in sizes:
                    sizes[c.file] = regular_file(self.directory / c.file, "DCP data file").st_size
                needed = math.prod(c.sizes) * t.dtype.itemsize
                if c.start + c.length > sizes[c.file] or c.length < needed:
                    raise CheckpointError(
                        f"{self.directory / c.file}: the chunk of {t.fqn} at {c.offsets} is said to "
                        f"be bytes {c.start}..{c.start + c.length} ({needed} of data), but the file "
                        f"has {sizes[c.file]} bytes (truncated?)"
                    )

    def read_into(self, name, dest, box=None) -> None:
        """Copy the tensor, or the box of it (one (start, stop) per dim, global), into dest (cast if need be)."""
        t = self.tensors[name]
        box = tuple((0, n) for n in t.shape) if box is None else tuple(tuple(b) for b in box)
        if len(box) != len(t.shape) or any(not 0 <= a <= b <= n for (a, b), n in zip(box, t.shape)):
            raise InvalidArgument(f"box {box} is not inside {name}'s shape {t.shape}")
        if tuple(dest.shape) != tuple(b - a for a, b in box):
            raise InvalidArgument(f"destination shape {tuple(dest.shape)} is not box {box}'s")
        for c in t.chunks:
            cut = tuple((max(a, o), min(b, o + s)) for (a, b), o, s in zip(box, c.offsets, c.sizes))
            if all(a < b for a, b in cut):
                target = dest[tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(cut, box))]
                self._read_chunk(t, c, tuple((a - o, b - o) for (a, b), o in zip(cut, c.offsets)), target)

    def _read_chunk(self, t: _Tensor, c: _Chunk, local, target) -> None:
        """Copy the part `local` (chunk coordinates) of chunk c into target: a contiguous chunk's needed
        rows only, straight into target when nothing is cut off or cast; another layout whole."""
        import torch

        fd = self._fd(c.file)
        data, offset, strides, contiguous = self._layout(t, c, fd)
        item = t.dtype.itemsize
        if contiguous:
            rows = local[0] if local else (0, 1)  # a 0-d chunk: its one element
            start = data + (offset + rows[0] * math.prod(c.sizes[1:])) * item
            whole_rows = all((a, b) == (0, n) for (a, b), n in zip(local[1:], c.sizes[1:]))
            if whole_rows and target.dtype == t.dtype and target.device.type == "cpu" and target.is_contiguous():
                self._pread(c, fd, start, target.nbytes, target)
                return
            staging = torch.empty((rows[1] - rows[0], *c.sizes[1:]) if local else (), dtype=t.dtype)
            self._pread(c, fd, start, staging.nbytes, staging)
            target.copy_(staging[(slice(None),) + tuple(slice(a, b) for a, b in local[1:])] if local else staging)
            return
        span = 1 + sum((n - 1) * s for n, s in zip(c.sizes, strides))
        staging = torch.empty(span, dtype=t.dtype)
        self._pread(c, fd, data + offset * item, staging.nbytes, staging)
        chunk = staging.as_strided(c.sizes, strides)
        target.copy_(chunk[tuple(slice(a, b) for a, b in local)])

    def _pread(self, c: _Chunk, fd: int, start: int, length: int, dest) -> None:
        try:
            read_exact(fd, start, length, dest)
        except CheckpointError as e:
            raise CheckpointError(f"{self.directory / c.file}: {e}") from None

    def _fd(self, file: str) -> int:
        with self._lock:
            if file not in self.fds:
                self.fds[file] = open_regular(self.directory / file, "DCP data file")
            return self.fds[file]

    def _layout(self, t: _Tensor, c: _Chunk, fd: int):
        if c.layout is None:  # two threads may both parse it: the same answer, assigned at once
            c.layout = _chunk_layout(fd, self.directory / c.file, t, c)
        return c.layout

    def close(self) -> None:
        with self._lock:
            for fd in self.fds.values():
                os.close(fd)
            self.fds = {}


# --- .metadata ---------------------------------------------------------------------------------


def _read_metadata(path: Path):
    with os.fdopen(open_regular(path, "DCP metadata file"), "rb") as f:
        data = f.read(MAX_METADATA_BYTES + 1)
    if len(data) > MAX_METADATA_BYTES:
        raise CheckpointError(f"{path}: over {MAX_METADATA_BYTES >> 20} MiB; not a DCP metadata file")
    try:
        return _MetadataUnpickler(io.BytesIO(data), path).load()
    except CheckpointError:
        raise
    except Exception as e:  # whatever a corrupt pickle makes the unpickler raise
        detail = " ".join(str(e).split())[:200]
        raise CheckpointError(
            f"{path}: not a readable DCP metadata file (corrupt or truncated?): {type(e).__name__}: {detail}"
        ) from None


def _fields(record, kind: str, path, what: str) -> dict:
    """The fields the pickle gave a stand-in of DCP's class `kind`."""
    state = getattr(record, "state", None)
    if type(record) is not _RECORDS[kind] or not isinstance(state, dict):
        raise CheckpointError(f"{path}: {what} is not a DCP {kind}; not a DCP checkpoint, or a corrupt one")
    return state


def _dims(value, path, what: str) -> tuple[int, ...]:
    if (
        not isinstance(value, tuple)
        or len(value) > MAX_DIMS
        or not all(type(n) is int and 0 <= n < 1 << 62 for n in value)
    ):
        raise CheckpointError(f"{path}: {what} has a bad shape or offset {value!r}")
    return value


def _tensors(fields: dict, path) -> tuple[dict[str, _Tensor], dict]:
    """Every tensor entry, its chunks checked to tile its shape exactly; and the planner's key paths."""
    import torch

    entries = fields.get("state_dict_metadata")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: no state_dict_metadata; not a DCP checkpoint")
    tensors = {}
    for fqn, entry in entries.items():
        if type(entry) is _RECORDS["BytesStorageMetadata"]:
            continue
        what = f"the entry of {fqn!r}"
        entry = _fields(entry, "TensorStorageMetadata", path, what)
        properties = getattr(entry.get("properties"), "state", None)
        dtype = (
            properties[0]
            if isinstance(properties, tuple) and properties
            else properties.get("dtype")
            if isinstance(properties, dict)
            else None
        )
        if not isinstance(fqn, str) or not isinstance(dtype, torch.dtype) or not isinstance(entry.get("chunks"), list):
            raise CheckpointError(f"{path}: {what} has no name, dtype or chunks")
        shape = _dims(entry.get("size"), path, what)
        chunks = []
        for chunk in entry["chunks"]:
            chunk = _fields(chunk, "ChunkStorageMetadata", path, f"a chunk of {fqn}")
            chunks.append(_Chunk(_dims(chunk.get("offsets"), path, what), _dims(chunk.get("sizes"), path, what)))
        check_tiling(fqn, shape, chunks, path)
        tensors[fqn] = _Tensor(fqn, dtype, shape, [c for c in chunks if math.prod(c.sizes)])
    paths = fields.get("planner_data")
    return tensors, paths if isinstance(paths, dict) else {}


def _exposed(tensors: dict, paths: dict) -> dict[str, str]:
    """Name -> fqn. dcp.save({"model": sd, "optim": ...}) flattens to "model.<key>"; the planner's key paths
    (("model", "<key>")) tell that apart from a model whose own keys start with "model." (a Llama's)."""
    if paths:
        grouped = [
            k
            for k in tensors
            if k.startswith("model.")
            and isinstance(paths.get(k), tuple)
            and len(paths[k]) > 1
            and paths[k][0] == "model"
        ]
    else:
        grouped = [k for k in tensors if k.startswith("model.")]
    if grouped:
        return {k.removeprefix("model."): k for k in grouped}
    return {k: k for k in tensors}


# --- a chunk: one torch.save archive inside a data file ---------------------------------------


class _FileSlice:
    """Bytes [start, start + length) of a descriptor as a read-only seekable file, for zipfile."""

    def __init__(self, fd: int, start: int, length: int):
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = max(0, (0, self.pos, self.length)[whence] + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        data = os.pread(self.fd, max(n, 0), self.start + self.pos) if n > 0 else b""
        self.pos += len(data)
        return data

    def close(self) -> None:
        pass


def _chunk_layout(fd: int, path: Path, t: _Tensor, c: _Chunk):
    """(data start in the file, storage offset, strides, contiguous) of chunk c, every number checked:
    the archive's data.pkl (weights-only, onto meta) must describe a tensor of the chunk's dtype and
    shape, within a stored (uncompressed) storage record that lies inside the chunk's byte range."""
    import torch
    from torch._weights_only_unpickler import Unpickler

    where = f"{path}: the chunk of {t.fqn} at {c.offsets} (bytes {c.start}..{c.start + c.length})"
    view = _FileSlice(fd, c.start, c.length)
    try:
        with zipfile.ZipFile(view) as archive:
            records, prefix = archive_records(archive, where)
            pkl, order = records.get(prefix + "data.pkl"), records.get(prefix + "byteorder")
            if pkl is None or pkl.file_size > MAX_CHUNK_PICKLE_BYTES:
                raise CheckpointError(f"{where} has no data.pkl of a tensor; not a torch.save archive")
            pickled = archive.read(pkl)
            if order is not None and archive.read(order) != sys.byteorder.encode():
                raise CheckpointError(
                    f"{where} was saved {archive.read(order)[:10]!r}-endian; this machine is {sys.byteorder}-endian"
                )
        storages = []

        def persistent_load(pid):  # ("storage", storage type, key, location, numel): torch's format
            _, storage_type, key, _, numel = pid
            dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
            storages.append((str(key), dtype, int(numel)))
            return torch.storage.TypedStorage(
                wrap_storage=torch.UntypedStorage(int(numel) * dtype.itemsize, device="meta"),
                dtype=dtype,
                _internal=True,
            )

        unpickler = Unpickler(io.BytesIO(pickled), encoding="utf-8")
        unpickler.persistent_load = persistent_load
        tensor = unpickler.load()
    except CheckpointError:
        raise
    except Exception as e:  # a corrupt archive or pickle, or one that would run code
        detail = " ".join(str(e).split())[:200]
        raise CheckpointError(
            f"{where} is not a weights-only torch.save archive of a tensor (corrupt or "
            f"truncated?): {type(e).__name__}: {detail}"
        ) from None
    if (
        not isinstance(tensor, torch.Tensor)
        or tensor.layout != torch.strided
        or len(storages) != 1
        or tensor.dtype != t.dtype
        or tuple(tensor.shape) != c.sizes
        or storages[0][1] != t.dtype
    ):
        found = f"{tensor.dtype} {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise CheckpointError(f"{where} holds {found}, not the {t.dtype} {c.sizes} the metadata says")
    key, _, numel = storages[0]
    record = records.get(f"{prefix}data/{key}")
    nbytes = numel * t.dtype.itemsize
    if record is None or record.compress_type != zipfile.ZIP_STORED or record.file_size != nbytes:
        raise CheckpointError(f"{where}: its storage record data/{key} is not {nbytes} stored bytes")
    view.seek(record.header_offset)
    header = view.read(30)  # the local file header: its name and extra field come before the data
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{where}: the storage record's header is corrupt")
    data = record.header_offset + 30 + sum(struct.unpack("<HH", header[26:30]))
    offset, strides = tensor.storage_offset(), tuple(tensor.stride())
    last = offset + sum((n - 1) * s for n, s in zip(c.sizes, strides))
    if data + nbytes > c.length or min(strides, default=0) < 0 or offset < 0 or last >= numel:
        raise CheckpointError(
            f"{where}: its tensor lies outside its storage record, or the record outside the chunk's bytes (truncated?)"
        )
    return c.start + data, offset, strides, tensor.is_contiguous()
