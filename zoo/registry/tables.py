"""The registry's ORM tables (SQLAlchemy 2.0 typed); alembic migrations create and change them."""

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Model(Base):
    """One architecture: its recipe and the metadata its meta build gave."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)  # "timm/resnet50"
    short: Mapped[str] = mapped_column(String(255), index=True)  # "resnet50": bare-name lookups
    family: Mapped[str] = mapped_column(String(32), index=True)
    builder: Mapped[str] = mapped_column(String(255))  # family-specific: timm model name, "pkg.mod:fn", file path
    kwargs: Mapped[str] = mapped_column(Text, default="{}")  # JSON object
    arch: Mapped[str | None] = mapped_column(String(255), index=True)  # module class, "timm.models.resnet.ResNet"
    task: Mapped[str | None] = mapped_column(String(64), index=True)  # hub pipeline names
    input_size: Mapped[str | None] = mapped_column(String(64))  # JSON list, e.g. [3, 224, 224]
    versions: Mapped[str] = mapped_column(Text, default="{}")  # JSON {"torch": ..., "timm": ...}
    dtype: Mapped[str | None] = mapped_column(String(32))  # dtype of most parameter bytes
    params: Mapped[int | None] = mapped_column(BigInteger, index=True)  # tied tensors counted once
    trainable: Mapped[int | None] = mapped_column(BigInteger)
    buffers: Mapped[int | None] = mapped_column(BigInteger)  # elements in buffers
    tensors: Mapped[int | None] = mapped_column(Integer)  # distinct parameter and buffer tensors
    param_bytes: Mapped[int | None] = mapped_column(BigInteger)
    buffer_bytes: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger, index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # "ok" or "error"
    error: Mapped[str | None] = mapped_column(Text)
    source_hash: Mapped[str] = mapped_column(String(64))  # recipe + library versions: unchanged means not rebuilt
    indexed_at: Mapped[datetime] = mapped_column(DateTime)
    # Analysis (migration 0003, zoo.analysis): one forward on meta at batch 1 with the family's input.
    flops: Mapped[int | None] = mapped_column(BigInteger, index=True)  # inference; 2 per multiply-accumulate
    macs: Mapped[int | None] = mapped_column(BigInteger)
    train_activation_bytes: Mapped[int | None] = mapped_column(BigInteger)  # saved for backward, training mode
    peak_activation_bytes: Mapped[int | None] = mapped_column(BigInteger)  # peak live activations, inference
    output_shapes: Mapped[str | None] = mapped_column(Text)  # JSON [[path, shape, dtype], ...]
    scan_status: Mapped[str | None] = mapped_column(String(16))  # "ok", "error", "no-input"; NULL: not analysed
    scan_error: Mapped[str | None] = mapped_column(Text)


class ModelTensors(Base):
    """A model's tensor table, one zlib-compressed JSON list per model.

    A row per tensor would make the shipped registry (about 600,000 tensors) some 40 MB;
    compressed per model it is about 2 MB. Rows: [name, kind, persistent, shape, dtype,
    numel, bytes, tied_to].
    """

    __tablename__ = "model_tensors"

    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


Index("ix_models_family_params", Model.family, Model.params)


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
