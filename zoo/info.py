"""ModelInfo: the public, torch-free view of one registry row."""

import json
import zlib
from dataclasses import dataclass, field
from datetime import datetime

from zoo.inspection import TensorInfo


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    builder: str
    kwargs: dict
    arch: str | None
    task: str | None
    input_size: tuple[int, ...] | None
    versions: dict
    dtype: str | None
    params: int | None  # elements, tied tensors once
    trainable: int | None
    buffers: int | None  # elements in buffers
    tensors: int | None  # distinct tensors
    param_bytes: int | None
    buffer_bytes: int | None
    bytes: int | None
    status: str  # "ok" or "error"
    error: str | None
    indexed_at: datetime
    tensor_table: list[TensorInfo] | None = field(default=None, repr=False)  # info(name, tensors=True)
    weights: list[dict] | None = None  # recorded weights files: tag, path, sha256, bytes (info() only)
    # Analysis (zoo.analysis), batch 1 at the recorded input; None where not analysed or not runnable on meta.
    flops: int | None = None  # inference FLOPs (2 per multiply-accumulate)
    macs: int | None = None
    train_activation_bytes: int | None = None  # saved for backward, training mode
    peak_activation_bytes: int | None = None  # peak live activations, inference
    output_shapes: list | None = None  # [[path, shape, dtype], ...]
    scan_status: str | None = None  # "ok", "error", "no-input"
    scan_error: str | None = None

    @classmethod
    def from_row(cls, row, tensor_blob: bytes | None = None, weights: list[dict] | None = None) -> "ModelInfo":
        return cls(
            name=row.name, family=row.family, builder=row.builder, kwargs=json.loads(row.kwargs), arch=row.arch,
            task=row.task, input_size=tuple(json.loads(row.input_size)) if row.input_size else None,
            versions=json.loads(row.versions), dtype=row.dtype, params=row.params, trainable=row.trainable,
            buffers=row.buffers, tensors=row.tensors, param_bytes=row.param_bytes, buffer_bytes=row.buffer_bytes,
            bytes=row.bytes, status=row.status, error=row.error, indexed_at=row.indexed_at,
            tensor_table=decode_tensors(tensor_blob) if tensor_blob is not None else None, weights=weights,
            flops=row.flops, macs=row.macs, train_activation_bytes=row.train_activation_bytes,
            peak_activation_bytes=row.peak_activation_bytes,
            output_shapes=json.loads(row.output_shapes) if row.output_shapes else None,
            scan_status=row.scan_status, scan_error=row.scan_error,
        )

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "tensor_table"}
        out["indexed_at"] = self.indexed_at.isoformat(timespec="seconds")
        out["input_size"] = list(self.input_size) if self.input_size else None
        if self.tensor_table is not None:
            out["tensor_table"] = [dict(zip(TENSOR_COLUMNS, t.to_row())) for t in self.tensor_table]
        return out


TENSOR_COLUMNS = ("name", "kind", "persistent", "shape", "dtype", "numel", "bytes", "tied_to")


def encode_tensors(table: list[TensorInfo]) -> bytes:
    return zlib.compress(json.dumps([t.to_row() for t in table], separators=(",", ":")).encode(), 9)


def decode_tensors(blob: bytes) -> list[TensorInfo]:
    return [TensorInfo.from_row(r) for r in json.loads(zlib.decompress(blob))]
