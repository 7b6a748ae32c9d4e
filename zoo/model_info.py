"""ModelInfo: the public, torch-free view of one registry row; its fields are zoo.columns' public ones."""

import json
import zlib
from dataclasses import field, make_dataclass

from zoo.columns import PUBLIC
from zoo.inspection import TensorInfo

TENSOR_COLUMNS = ("name", "kind", "persistent", "shape", "dtype", "numel", "bytes", "tied_to")


def _from_row(cls, row, tensor_blob: bytes | None = None, weights: list[dict] | None = None):
    """A ModelInfo from a registry row; tensor_blob adds its tensor table, weights its recorded files."""
    values = {c.name: c.decode(getattr(row, c.name)) for c in PUBLIC}
    tensors = decode_tensors(tensor_blob) if tensor_blob is not None else None
    return cls(**values, tensor_table=tensors, weights=weights)


def _as_dict(self) -> dict:
    out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "tensor_table"}
    for c in PUBLIC:
        if c.kind == "datetime" and out[c.name] is not None:
            out[c.name] = out[c.name].isoformat(timespec="seconds")
    out["input_size"] = list(self.input_size) if self.input_size else None
    if self.tensor_table is not None:
        out["tensor_table"] = [dict(zip(TENSOR_COLUMNS, t.to_row())) for t in self.tensor_table]
    return out


ModelInfo = make_dataclass(
    "ModelInfo",
    [(c.name, c.python_type()) for c in PUBLIC]
    + [("tensor_table", list[TensorInfo] | None, field(default=None, repr=False)),  # info(name, tensors=True)
       ("weights", list[dict] | None, field(default=None))],  # recorded files: tag, path, sha256, bytes
    namespace={"from_row": classmethod(_from_row), "as_dict": _as_dict,
               "__doc__": "One model's recorded metadata (fields: zoo.columns.COLUMNS, public ones)."},
    frozen=True,
)
ModelInfo.__module__ = __name__  # make_dataclass takes module= only from Python 3.12


def encode_tensors(table: list[TensorInfo]) -> bytes:
    return zlib.compress(json.dumps([t.to_row() for t in table], separators=(",", ":")).encode(), 9)


def decode_tensors(blob: bytes) -> list[TensorInfo]:
    return [TensorInfo.from_row(r) for r in json.loads(zlib.decompress(blob))]
