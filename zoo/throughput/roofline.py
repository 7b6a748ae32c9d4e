"""A roofline estimate of a model's throughput on a listed device, from what the registry records on meta.

Pure Python (no torch): it reads a registry row's numbers and a hardware table (catalog/hardware.csv:
peak FLOP/s and memory bandwidth per device and mode, with their sources). The estimate is an upper
bound in the roofline sense: a step can go no faster than its arithmetic at the peak rate, nor than
its memory traffic at the peak bandwidth, so

    seconds per sample = max(flops_per_sample / peak_flops, bytes_per_sample / bandwidth)

with, for one sample of a batch of B:

- flops_per_sample: the row's `flops` (inference, batch 1, 2 per multiply-accumulate). A training
  step is counted as 3x the forward (the backward computes a gradient for the inputs and one for
  the weights of every layer, each about as much arithmetic as the forward).
- bytes_per_sample: activations plus weights. Every tensor autograd saves for backward
  (`train_activation_bytes`, recorded in fp32) is an activation some layer wrote and a later layer
  read, so an inference forward moves it twice (one write, one read), at the mode's element size
  (2 bytes under AMP, 4 in fp32: the recorded bytes scaled by element_bytes / 4). A training step
  moves 3x that (the forward's traffic, then the backward reads what was saved and writes and reads
  gradients of the same size). The weights (`bytes`: parameters and buffers, fp32 as stored) are
  read once per step (3x in training: forward, backward, the optimizer's update), shared by the B
  samples of the batch, so they add bytes / B per sample: nothing at batch 1024 on a GPU, most of
  the traffic at batch 1 on a CPU.

No per-step overhead (kernel launches, Python, framework dispatch) is added: nothing recorded on
meta says how many kernels a compiled or eager step launches, and a constant would be a fit, not a
derivation. Caches are ignored too (a batch-1 CPU step whose weights fit in L2/L3 is not bound by
DRAM). What the estimate misses shows up as measured/predicted below 1: the ratio is the fraction
of the roofline a model reaches (bench/predict_throughput.py reports it per device and family).
"""

import csv
import math
from collections.abc import Mapping
from pathlib import Path

from zoo.columns import THROUGHPUT
from zoo.errors import InvalidArgument
from zoo.records import Record

# catalog/hardware.csv, linked into the package so that an installed zoo searches the predicted fields too
HARDWARE = Path(__file__).resolve().parent.parent / "hardware.csv"
MODES = {"infer": 1, "train": 3}  # FLOPs and activation traffic of a step, in forwards
FIELDS = (
    "column",
    "device",
    "mode",
    "precision",
    "element_bytes",
    "batch",
    "peak_tflops",
    "peak_basis",
    "bandwidth_gbs",
    "bandwidth_basis",
    "source",
    "checked",
)  # checked: what could be confirmed
PREFIX = "pred_"  # a predicted field is named after the measured column it predicts: pred_infer_4090_amp
UNIT = "samples/s"


class Device(Record):
    __slots__ = ("column", "device", "mode", "precision", "element_bytes", "batch", "peak_flops", "bandwidth", "source")
    column: str  # zoo's measured-throughput column for this device and mode, e.g. infer_4090_amp
    device: str
    mode: str  # infer or train
    precision: str
    element_bytes: int  # bytes of an activation in this mode: 2 under AMP (fp16), 4 in fp32
    batch: int  # the batch size its predicted field assumes: the one most of timm's measurements used
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    source: str

    def __init__(
        self,
        column: str,
        device: str,
        mode: str,
        precision: str,
        element_bytes: int,
        batch: int,
        peak_flops: float,
        bandwidth: float,
        source: str,
    ):
        self._init(column, device, mode, precision, element_bytes, batch, peak_flops, bandwidth, source)


class Estimate(Record):
    __slots__ = ("samples_per_s", "compute_s", "memory_s", "bytes_per_sample")
    samples_per_s: float
    compute_s: float  # seconds per sample at the peak FLOP/s
    memory_s: float  # seconds per sample at the peak bandwidth
    bytes_per_sample: float

    def __init__(self, samples_per_s: float, compute_s: float, memory_s: float, bytes_per_sample: float):
        self._init(samples_per_s, compute_s, memory_s, bytes_per_sample)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


# The most each number of the table may be: far above any device (the largest GPUs: a few PFLOP/s, 8 TB/s),
# far below a float's overflow, so that every coefficient and prediction stays finite and above zero.
# element_bytes and batch are whole numbers (an element of 0.5 bytes would be read as 0).
_MOST = {"element_bytes": 8, "batch": 1 << 20, "peak_tflops": 1e6, "bandwidth_gbs": 1e6}
_WHOLE = ("element_bytes", "batch")


def _positive(row: dict, key: str, path) -> float:
    try:
        value = float(row[key])
    except (TypeError, ValueError):
        raise InvalidArgument(f"{path}: {row.get('column')!r}: {key} is {row.get(key)!r}, not a number") from None
    if not (math.isfinite(value) and 0 < value <= _MOST[key]) or key in _WHOLE and value != int(value):
        kind = "a whole number" if key in _WHOLE else "a number"
        raise InvalidArgument(
            f"{path}: {row.get('column')!r}: {key} must be {kind} above 0 and at most "
            f"{_MOST[key]:g}, not {row.get(key)!r}: fix that row of the hardware table"
        )
    return value


def load_hardware(path: str | Path = HARDWARE) -> dict[str, Device]:
    """The hardware table by column name; a row without a source or with a bad number is refused."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:  # the table is in the checkout's catalog/, not the wheel
        raise InvalidArgument(f"cannot read the hardware table {path}: {e}") from None
    devices = {}
    for row in rows:
        missing = [k for k in FIELDS if not (row.get(k) or "").strip()]
        if missing:
            raise InvalidArgument(f"{path}: {row.get('column')!r} has no {', '.join(missing)}")
        if row["mode"] not in MODES:
            raise InvalidArgument(f"{path}: {row['column']!r}: mode {row['mode']!r} is not one of {sorted(MODES)}")
        devices[row["column"]] = Device(
            column=row["column"],
            device=row["device"],
            mode=row["mode"],
            precision=row["precision"],
            element_bytes=int(_positive(row, "element_bytes", path)),
            batch=int(_positive(row, "batch", path)),
            peak_flops=_positive(row, "peak_tflops", path) * 1e12,
            bandwidth=_positive(row, "bandwidth_gbs", path) * 1e9,
            source=row["source"],
        )
    return devices


INPUTS = ("flops", "bytes", "train_activation_bytes")  # the registry's numbers a prediction is computed from


def _numbers(row) -> dict:
    """flops, bytes and train_activation_bytes of a registry row: a mapping, or zoo.info's ModelInfo."""
    get = row.get if isinstance(row, Mapping) else lambda key: getattr(row, key, None)
    out = {}
    for key in INPUTS:
        value = get(key)
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise InvalidArgument(f"a roofline estimate needs a positive {key}, the row has {value!r}")
        out[key] = value
    return out


def coefficients(device: Device, batch: int) -> tuple[float, float, float]:
    """Seconds per sample per FLOP, per recorded activation byte and per weight byte: a row's time per sample is
    max(c_flop * flops, c_activation * train_activation_bytes + c_weight * bytes) (see the module's docstring).
    The search compiles predicted fields from these three numbers, so the SQL and predict() cannot differ."""
    steps = MODES[device.mode]
    return (
        steps / device.peak_flops,
        2 * steps * device.element_bytes / 4 / device.bandwidth,
        steps / batch / device.bandwidth,
    )


def predict(row, device: Device, batch: int) -> Estimate:
    """Samples/s of a row (a mapping or a ModelInfo: flops, bytes, train_activation_bytes) on `device` at
    batch size `batch`."""
    if isinstance(batch, bool) or not (isinstance(batch, int) and batch > 0):
        raise InvalidArgument(f"batch must be a positive integer, not {batch!r}")
    row = _numbers(row)
    per_flop, per_activation, per_weight = coefficients(device, batch)
    compute_s = per_flop * row["flops"]
    memory_s = per_activation * row["train_activation_bytes"] + per_weight * row["bytes"]
    seconds = max(compute_s, memory_s)
    # a Device that load_hardware would refuse (0 coefficients), or a hand-made row's 1e-300 flops: no number
    if not seconds > 0 or not math.isfinite(1 / seconds):
        raise InvalidArgument(
            f"no finite prediction on {device.column} for flops {row['flops']}, bytes "
            f"{row['bytes']}, train_activation_bytes {row['train_activation_bytes']}"
        )
    return Estimate(1 / seconds, compute_s, memory_s, memory_s * device.bandwidth)


# The searchable predictions, one per measured device of the hardware table (a pred_ field predicts a measured
# column), each at its device's batch; the rows added for planning (H100, A100, ...) have no measured column.
PREDICTED: dict[str, Device] = {PREFIX + c: d for c, d in load_hardware().items() if c in THROUGHPUT}


def predicted(row, field: str) -> float | None:
    """A predicted field's value for a row (mapping or ModelInfo); None where the row lacks the numbers."""
    device = PREDICTED[field]
    try:
        return predict(row, device, device.batch).samples_per_s
    except InvalidArgument:
        return None


def doc(field: str) -> str:
    """What `zoo search --fields` says a predicted field means."""
    d = PREDICTED[field]
    what = "training steps" if d.mode == "train" else "inference"
    return (
        f"PREDICTED, not measured: the roofline upper bound of {what} on {d.device} ({d.precision}) at batch "
        f"{d.batch}, from flops, bytes and train_activation_bytes (zoo.throughput.roofline); measured runs reach "
        f"a fraction of it (docs/guides/speed.md)"
    )
