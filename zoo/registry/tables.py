"""The registry's tables (SQLAlchemy 2.0); the models table is derived from zoo.columns, and alembic
migrations create and change them."""

from datetime import datetime

from sqlalchemy import (
    BigInteger, Boolean, Column, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Table, Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from zoo.columns import COLUMNS


class Base(DeclarativeBase):
    pass


def _sql_type(c):
    if c.kind == "int":
        return BigInteger if c.wide else Integer
    if c.kind == "float":
        return Float
    if c.kind == "datetime":
        return DateTime
    return String(c.size) if c.size else Text


models = Table(
    "models", Base.metadata,
    Column("id", Integer, primary_key=True),
    *(Column(c.name, _sql_type(c), nullable=c.nullable, index=c.indexed, unique=c.unique,
             default=c.default)
      for c in COLUMNS),
)
# Ranges sorted by name or by another number without touching the table: migrations 0005 and 0007 (which
# made the first three carry the numbers a search sorts by, and on PostgreSQL the id).
for _columns in (("params", "name"), ("bytes", "name"), ("flops", "name"), ("family", "params", "name")):
    _carried = [c for c in ("params", "bytes", "flops", "top1") if c not in _columns] if len(_columns) == 2 else []
    Index(f"ix_models_{'_'.join(_columns)}", *(models.c[c] for c in (*_columns, *_carried)),
          **({"postgresql_include": ["id"]} if _carried else {}))
# What migrations 0005 and 0007 create per backend and the ORM cannot declare: SQLite's FTS5 trigram table over
# names (its shadow tables models_fts_*, and the triggers that keep it in step), PostgreSQL's bytewise name index
# and pg_trgm GIN indexes on name and short, and the (family, name) index, bytewise on PostgreSQL. The schema
# comparison with this metadata leaves out names starting with these.
SEARCH_ACCELERATORS = ("models_fts", "ix_models_name_bytewise", "ix_models_name_trgm", "ix_models_short_trgm",
                       "ix_models_family_name_bytewise")


def compared(name, kind, parent) -> bool:
    """alembic's include_name: whether schema comparison (autogenerate, `alembic check`) looks at an object."""
    return not (name or "").startswith(SEARCH_ACCELERATORS)


class Model(Base):
    """One architecture: its recipe and the metadata its meta build gave (columns: zoo.columns)."""

    __table__ = models


class ModelTensors(Base):
    """A model's tensor table, one zlib-compressed JSON list per model.

    A row per tensor would make the shipped registry (about 600,000 tensors) some 40 MB;
    compressed per model it is about 2 MB. Rows: [name, kind, persistent, shape, dtype,
    numel, bytes, tied_to].
    """

    __tablename__ = "model_tensors"

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Weights(Base):
    """A weights file recorded for a model under a tag ("default"); its sha256 is checked before loading."""

    __tablename__ = "weights"
    __table_args__ = (UniqueConstraint("model_id", "tag"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    tag: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)  # a file, a shard index or a directory
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    added_at: Mapped[datetime] = mapped_column(DateTime)


class Measurement(Base):
    """One throughput measurement by `zoo bench` (zoo.throughput.benchmark): a model, the hardware it ran on, the mode
    (infer/train, dtype, batch, torch.compile, channels_last, threads), the result, and who measured it when
    with which library versions. Rows from everyone's machines sit side by side in a team's registry."""

    __tablename__ = "measurements"
    __table_args__ = (Index("ix_measurements_model_device_mode", "model_id", "device", "mode", "samples_per_s"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    hardware: Mapped[str] = mapped_column(String(255))  # the GPU's or CPU's model name
    device: Mapped[str] = mapped_column(String(16))  # cpu or cuda
    mode: Mapped[str] = mapped_column(String(16))  # infer or train
    dtype: Mapped[str] = mapped_column(String(16))
    batch: Mapped[int] = mapped_column(Integer)
    compiled: Mapped[bool] = mapped_column(Boolean)
    channels_last: Mapped[bool] = mapped_column(Boolean)
    threads: Mapped[int] = mapped_column(Integer)
    inputs: Mapped[str] = mapped_column(Text)  # JSON: [{name, shape, dtype}] at this batch
    samples_per_s: Mapped[float] = mapped_column(Float)
    step_ms: Mapped[float] = mapped_column(Float)
    peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    steps: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[int] = mapped_column(Integer)
    versions: Mapped[str] = mapped_column(Text)  # JSON: torch, timm, torchvision, zoo
    who: Mapped[str] = mapped_column(String(255))  # user@host
    measured_at: Mapped[datetime] = mapped_column(DateTime)
