"""The one declaration of a model's recorded fields: the registry table, ModelInfo, the search fields
and the analysis result are all derived from COLUMNS (migrations, being history, spell out their own).

Pure data: importing it imports neither torch nor SQLAlchemy.
"""

import json
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "text", "int", "json" (JSON text), "shape" (JSON list, read as a tuple), "datetime"
    doc: str
    size: int | None = None  # text and JSON: a VARCHAR of this many characters; None: unbounded TEXT
    wide: bool = True  # int: 64-bit
    nullable: bool = True
    indexed: bool = False
    unique: bool = False
    searchable: bool = False
    unit: str | None = None  # of a number: "elements", "bytes", "FLOPs", ...
    public: bool = True  # an attribute of ModelInfo
    analysis: bool = False  # filled by the index-time analysis (zoo.analysis), not by the build
    default: str | None = None  # what an insert that leaves it out stores

    @property
    def search_type(self) -> str:
        """What the search grammar compares it as: "number" or "string"."""
        return "number" if self.kind == "int" else "string"

    def python_type(self):
        base = {"text": str, "int": int, "json": object, "shape": tuple, "datetime": datetime}[self.kind]
        return base | None if self.nullable else base

    def decode(self, value):
        """The registry's stored value as ModelInfo holds it."""
        if self.kind == "json":
            return json.loads(value) if value else (None if self.nullable else {})
        if self.kind == "shape":
            return tuple(json.loads(value)) if value else None
        return value

    def encode(self, value):
        """A Python value as the registry stores it."""
        if value is None or self.kind not in ("json", "shape"):
            return value
        # the separators the shipped registry was written with, so that a rebuild compares equal
        return json.dumps(list(value)) if self.kind == "shape" else json.dumps(value, separators=(",", ":"))


COLUMNS: tuple[Column, ...] = (
    Column("name", "text", "full name: family/builder, e.g. timm/resnet50", size=255, nullable=False, unique=True,
           searchable=True),
    Column("short", "text", "the name without its family, for bare-name lookups", size=255, nullable=False,
           indexed=True, searchable=True, public=False),
    Column("family", "text", "timm, torchvision, hf, user or checkpoint", size=32, nullable=False, indexed=True,
           searchable=True),
    Column("builder", "text", "family-specific: timm model name, pkg.mod:fn, auto class, file path", size=255,
           nullable=False, searchable=True),
    Column("kwargs", "json", "the recipe's keyword arguments (a JSON object)", nullable=False, default="{}"),
    Column("arch", "text", "the module's class, e.g. timm.models.resnet.ResNet", size=255, indexed=True,
           searchable=True),
    Column("task", "text", "hub pipeline name, e.g. image-classification", size=64, indexed=True, searchable=True),
    Column("input_size", "shape", "documented input without the batch, e.g. [3, 224, 224]", size=64),
    Column("versions", "json", "library versions that built it, e.g. {torch, timm}", nullable=False, default="{}"),
    Column("dtype", "text", "dtype of most parameter bytes", size=32, searchable=True),
    Column("params", "int", "parameter elements, tied tensors once", indexed=True, searchable=True, unit="elements"),
    Column("trainable", "int", "parameter elements that require grad", searchable=True, unit="elements"),
    Column("buffers", "int", "buffer elements", searchable=True, unit="elements"),
    Column("tensors", "int", "distinct parameter and buffer tensors", wide=False, searchable=True, unit="tensors"),
    Column("param_bytes", "int", "bytes of parameters", searchable=True, unit="bytes"),
    Column("buffer_bytes", "int", "bytes of buffers", searchable=True, unit="bytes"),
    Column("bytes", "int", "bytes of parameters and buffers", indexed=True, searchable=True, unit="bytes"),
    Column("status", "text", "ok, or error when the build failed", size=16, nullable=False, indexed=True,
           searchable=True),
    Column("error", "text", "why the build failed"),
    Column("source_hash", "text", "recipe + library versions: unchanged means not rebuilt", size=64, nullable=False,
           public=False),
    Column("indexed_at", "datetime", "when it was recorded (UTC)", nullable=False),
    Column("flops", "int", "inference FLOPs at batch 1, 2 per multiply-accumulate", indexed=True, searchable=True,
           unit="FLOPs", analysis=True),
    Column("macs", "int", "multiply-accumulates at batch 1 (torchvision's 'GFLOPS')", searchable=True, unit="MACs",
           analysis=True),
    Column("train_activation_bytes", "int", "bytes autograd saves for backward, training mode, batch 1",
           searchable=True, unit="bytes", analysis=True),
    Column("peak_activation_bytes", "int", "peak live activation bytes, inference, batch 1", searchable=True,
           unit="bytes", analysis=True),
    Column("output_shapes", "json", "the output: [[path, shape, dtype], ...]", analysis=True),
    Column("scan_status", "text", "ok, error or no-input; empty: not analysed", size=16, searchable=True,
           analysis=True),
    Column("scan_error", "text", "why the meta forward failed", analysis=True),
)

BY_NAME = {c.name: c for c in COLUMNS}
# Searchable field -> "number" or "string"; each is the registry column of the same name.
SEARCH_FIELDS: dict[str, str] = {c.name: c.search_type for c in COLUMNS if c.searchable}
PUBLIC = tuple(c for c in COLUMNS if c.public)
ANALYSIS = tuple(c for c in COLUMNS if c.analysis)
