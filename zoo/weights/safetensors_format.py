"""safetensors headers, read and validated without touching tensor data (the file is untrusted)."""

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from zoo.errors import CheckpointError

# safetensors dtype codes -> (torch dtype name, bytes per element)
DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
    "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8), "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
}
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_header(path: str | Path) -> tuple[list[Entry], dict]:
    """Entries in file order and the __metadata__ dict; raises CheckpointError if the header lies."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header length {n} exceeds the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start, data_len = 8 + n, size - 8 - n
    entries = [_entry(path, name, spec, data_start, data_len) for name, spec in header.items()]
    _check_no_overlap(path, entries)
    return entries, metadata


def _entry(path, name, spec, data_start, data_len) -> Entry:
    try:
        dtype, itemsize = DTYPES[spec["dtype"]]
        shape = tuple(spec["shape"])
        begin, end = spec["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry: {spec!r}") from None
    if not all(isinstance(d, int) and d >= 0 for d in shape) or not all(isinstance(o, int) for o in (begin, end)):
        raise CheckpointError(f"{path}: tensor {name!r}: shape and offsets must be non-negative integers")
    if not 0 <= begin <= end <= data_len:
        raise CheckpointError(f"{path}: tensor {name!r}: offsets {begin}..{end} outside the data ({data_len} bytes)")
    if end - begin != math.prod(shape) * itemsize:
        raise CheckpointError(f"{path}: tensor {name!r}: {end - begin} bytes for shape {list(shape)} of {dtype}")
    return Entry(name, dtype, shape, data_start + begin, data_start + end)


def _check_no_overlap(path, entries) -> None:
    previous = None
    for e in sorted(entries, key=lambda e: (e.start, e.end)):
        if previous is not None and e.start < previous.end and e.end > e.start:
            raise CheckpointError(f"{path}: tensors {previous.name!r} and {e.name!r} overlap in the file")
        previous = e
