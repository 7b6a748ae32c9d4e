"""The measurements table (zoo bench): record a run, tell whether a run of the same kind is recorded (a search's
bench resumes by it), and list a model's runs for `zoo show`."""

import json
from datetime import UTC, datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from zoo.columns import finite
from zoo.errors import InvalidArgument
from zoo.registry.store import check_lengths, resolve
from zoo.registry.tables import Measurement, Model
from zoo.registry.where import FINITE
from zoo.throughput.measured import RUN_JSON, clean_run

# What makes two runs the same kind: the same model on the same hardware in the same mode (a search's bench
# skips a model that has one)
KIND = ("hardware", "device", "mode", "dtype", "batch", "compiled", "channels_last", "threads")


def record(session: Session, name: str, values: dict) -> None:
    """Add one run for `name` (a full or bare name) in the current transaction; a result that is not a positive
    finite number is refused (InvalidArgument): one such run would sort first and break every JSON answer."""
    for key in ("samples_per_s", "step_ms"):
        if finite(values[key]) is None or values[key] <= 0:
            raise InvalidArgument(
                f"{name}: {key} is {values[key]!r}, not a positive finite number: nothing was "
                f"recorded; measure it again (more steps)"
            )
    row = resolve(session, name)
    columns = Measurement.__table__.c
    values = {**values, **{k: json.dumps(values[k], separators=(",", ":")) for k in RUN_JSON}}
    check_lengths(session, values, {k: getattr(columns[k].type, "length", None) for k in values})
    session.add(Measurement(model_id=row.id, measured_at=datetime.now(UTC).replace(tzinfo=None), **values))


def recorded(session: Session, name: str, kind: dict) -> bool:
    """Whether `name` has a run of this kind (the KIND fields) already."""
    row = resolve(session, name)
    where = [getattr(Measurement, k) == kind[k] for k in KIND]
    return session.scalar(select(Measurement.id).where(Measurement.model_id == row.id, *where).limit(1)) is not None


def of_model(session: Session, name: str) -> list[dict]:
    """Every run of `name`, oldest first: each column of the table but the ids, as zoo.throughput.measured.clean_run
    reads it."""
    row = resolve(session, name)
    runs = session.scalars(select(Measurement).where(Measurement.model_id == row.id).order_by(Measurement.id))
    return [
        clean_run({c.name: getattr(m, c.name) for c in Measurement.__table__.c if c.name not in ("id", "model_id")})
        for m in runs
    ]


def fastest(session: Session, names: list[str], device: str, mode: str) -> dict[str, float]:
    """Full name -> the highest samples/s of its runs of that device and mode, for those of `names` with one (runs
    of a finite number only: where.FINITE)."""
    out: dict[str, float] = {}
    for i in range(0, len(names), 500):  # bound the statement's parameters
        out.update(
            session.execute(
                select(Model.name, func.max(Measurement.samples_per_s))
                .join(Model, Model.id == Measurement.model_id)
                .where(
                    Measurement.device == device,
                    Measurement.mode == mode,
                    Model.name.in_(names[i : i + 500]),
                    text(f"measurements.samples_per_s {FINITE}"),
                )
                .group_by(Model.name)
            ).all()
        )
    return out
