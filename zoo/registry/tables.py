"""The registry's tables (SQLAlchemy 2.0); the models table is derived from zoo.columns, and alembic
migrations create and change them."""

from datetime import datetime

from sqlalchemy import (
    BigInteger, Column, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Table, Text, UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from zoo.columns import COLUMNS


class Base(DeclarativeBase):
    pass


def _sql_type(c):
    if c.kind == "int":
        return BigInteger if c.wide else Integer
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
Index("ix_models_family_params", models.c.family, models.c.params)


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
