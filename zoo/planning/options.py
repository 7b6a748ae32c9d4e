"""PlanOptions: what a plan is of, checked together before any model is built; the precisions and optimizers it
knows."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from zoo.dtypes import FLOAT_NAMES
from zoo.errors import InvalidArgument
from zoo.planning.hardware import hardware_of

# dtype -> (compute bytes, master bytes, the dtype the forward runs in). amp-*: autocast (or FSDP2's
# MixedPrecisionPolicy(param_dtype=...)) over fp32 parameters, the fp32 master weights torch.amp keeps.
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
PRECISIONS = {k: (_BYTES[v], _BYTES[v], k) for k, v in FLOAT_NAMES.items()} | {
    "amp-bf16": (2, 4, "bf16"),
    "amp-fp16": (2, 4, "fp16"),
}
# The KV cache's element bytes by dtype name (zoo.analysis.memory.KV_DTYPES, torch-free)
KV_BYTES = {k: _BYTES[v] for k, v in FLOAT_NAMES.items()} | {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
STATES = {"adamw": 2, "adam": 2, "sgd": 1, "none": 0}  # optimizer tensors per parameter
STEP_BYTES = {"adamw": 4, "adam": 4, "sgd": 0, "none": 0}  # adam's 0-d float32 step, one per parameter


@dataclass(frozen=True)
class PlanOptions:
    """What a plan is of: zoo.plan's keyword arguments, checked together before any model is built."""

    hardware: Any = None  # a device of catalog/hardware.csv, "cpu", or bytes ("24GiB", 24 * 2**30)
    devices: int = 1
    training: bool = False
    batch: int | None = None  # per device; None: the plan at max_batch
    seq_len: int | None = None
    input_size: tuple[int, ...] | None = None  # a vision model's (C, H, W), in place of its row's
    dtype: str | None = None  # default: amp-bf16 training, bf16 inference
    optimizer: str | None = None  # default: adamw training
    fsdp: int = 1
    tp: int = 1
    checkpointing: bool = False
    kv_dtype: str | None = None

    @classmethod
    def of(cls, options: dict) -> PlanOptions:
        """The options from keyword arguments; an unknown one is refused with the known ones named."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(options) - set(known)):
            raise InvalidArgument(f"unknown plan option {', '.join(unknown)}: the options are {', '.join(known)}")
        return cls(**options)

    def checked(self) -> PlanOptions:
        """The options with their defaults filled in, once every one is valid (InvalidArgument otherwise)."""
        if self.hardware is None:
            raise InvalidArgument("give hardware: a device ('H100', 'RTX 4090'), 'cpu' or bytes ('24GiB')", "hardware")
        hardware_of(self.hardware)  # HardwareNotFound before any model is built
        for label in ("devices", "fsdp", "tp", "batch", "seq_len"):
            value = getattr(self, label)
            if (value is not None or label in ("devices", "fsdp", "tp")) and not _whole(value):
                raise InvalidArgument(f"{label} must be a whole number from 1 to 2**31 - 1, not {value!r:.40}", label)
        if self.devices % (self.fsdp * self.tp):
            raise InvalidArgument(
                f"devices ({self.devices}) must be a multiple of fsdp x tp ({self.fsdp} x {self.tp}): the devices are "
                "DDP replicas of FSDP groups of TP groups",
                "devices",
            )
        dtype = str(self.dtype or ("amp-bf16" if self.training else "bf16")).lower().removeprefix("torch.")
        if dtype not in PRECISIONS:
            raise InvalidArgument(f"dtype must be one of {', '.join(PRECISIONS)}, not {self.dtype!r:.40}", "dtype")
        optimizer = (self.optimizer or "adamw") if self.training else None
        if optimizer is not None and optimizer not in STATES:
            raise InvalidArgument(f"optimizer must be one of {', '.join(STATES)}, not {optimizer!r:.40}", "optimizer")
        if self.checkpointing and not self.training:
            raise InvalidArgument("checkpointing applies to training: give training=True with it", "checkpointing")
        size = self.input_size
        if size is not None and not (
            isinstance(size, (list, tuple)) and len(size) == 3 and all(_whole(d) for d in size)
        ):
            raise InvalidArgument(f"input_size must be (channels, height, width), not {size!r:.40}", "input_size")
        if self.kv_dtype is not None and self.training:
            raise InvalidArgument("kv_dtype applies to inference: leave it unset with training=True", "kv_dtype")
        kv_dtype = str(self.kv_dtype).lower().removeprefix("torch.") if self.kv_dtype is not None else None
        if kv_dtype is not None and kv_dtype not in KV_BYTES:
            raise InvalidArgument(
                f"kv_dtype must be one of {', '.join(KV_BYTES)}, not {self.kv_dtype!r:.40}", "kv_dtype"
            )
        size = tuple(size) if size else None
        return replace(self, dtype=dtype, optimizer=optimizer, input_size=size, kv_dtype=kv_dtype)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value < 2**31


def autocast(o: PlanOptions) -> bool:
    """Whether the step runs under torch.autocast over fp32 parameters (amp-* without FSDP2, whose
    MixedPrecisionPolicy casts the parameters instead): its weight casts are then measured with the activations."""
    return o.dtype in ("amp-bf16", "amp-fp16") and o.fsdp == 1
