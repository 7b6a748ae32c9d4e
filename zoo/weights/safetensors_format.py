"""safetensors headers, read and validated without touching tensor data (the file is untrusted)."""

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import CheckpointError
from zoo.weights.paths import open_regular

# safetensors dtype codes -> (torch dtype name, bytes per element)
DTYPES = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "U16": ("uint16", 2),
    "U32": ("uint32", 4),
    "U64": ("uint64", 8),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_header(path: str | Path, fd: int | None = None) -> tuple[list[Entry], dict]:
    """Entries in file order and the __metadata__ dict; raises CheckpointError if the header lies.
    fd: the file already open (a reader then takes header and data from the same file)."""
    path = Path(path)
    own = fd is None
    if fd is None:
        fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        raw = os.pread(fd, 8, 0)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header length {n} exceeds the file ({size} bytes)")
        header = parse_json(os.pread(fd, n, 8), path, "header")
    finally:
        if own:
            os.close(fd)
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: __metadata__ is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    entries = [_entry(path, name, spec, data_start, data_len) for name, spec in header.items()]
    _check_no_overlap(path, entries)
    return entries, metadata


def parse_json(raw: bytes, path, what: str):
    """JSON from an untrusted file; CheckpointError for anything that is not (a 200k-deep nesting
    exhausts the parser's recursion: that is a malformed file too)."""
    try:
        return json.loads(raw)
    except ValueError as e:  # not UTF-8, not JSON, or an integer past Python's 4300-digit limit
        raise CheckpointError(f"{path}: {what} is not valid JSON: {e}") from None
    except RecursionError:
        raise CheckpointError(f"{path}: {what} is JSON nested too deeply to be a checkpoint's") from None


def _entry(path, name, spec, data_start, data_len) -> Entry:
    try:
        dtype, itemsize = DTYPES[spec["dtype"]]
        shape, offsets = spec["shape"], spec["data_offsets"]
    except (KeyError, TypeError):
        raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry: {str(spec)[:200]}") from None
    # lists of plain ints, as the format says: not a JSON object or string that tuple() would accept, not bools
    if not (
        isinstance(shape, list)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(d) is int and 0 <= d < 1 << 63 for d in shape)
        and all(type(o) is int for o in offsets)
    ):
        raise CheckpointError(f"{path}: tensor {name!r}: shape and offsets must be lists of non-negative integers")
    shape, (begin, end) = tuple(shape), offsets
    if not 0 <= begin <= end <= data_len:
        raise CheckpointError(f"{path}: tensor {name!r}: offsets {begin}..{end} outside the data ({data_len} bytes)")
    if end - begin != math.prod(shape) * itemsize:
        raise CheckpointError(f"{path}: tensor {name!r}: {end - begin} bytes for shape {list(shape)} of {dtype}")
    return Entry(name, dtype, shape, data_start + begin, data_start + end)


def _check_no_overlap(path, entries) -> None:
    """No two tensors share a byte. Compared with the furthest end seen so far, not the previous
    entry's: an empty tensor between two overlapping ones must not reset it."""
    furthest = None
    for e in sorted(entries, key=lambda e: (e.start, e.end)):
        if e.end == e.start:
            continue  # holds no bytes: overlaps nothing
        if furthest is not None and e.start < furthest.end:
            raise CheckpointError(f"{path}: tensors {furthest.name!r} and {e.name!r} overlap in the file")
        if furthest is None or e.end > furthest.end:
            furthest = e
