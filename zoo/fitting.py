"""Search by fit: the models whose plan (zoo.planning) fits a hardware and a run, with their max_batch, from what zoo
index records in each row (plan_shapes, plan_activations): no module is built and torch is never imported."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from zoo.errors import InvalidArgument
from zoo.planning import RECORDED_MODES, Activations, Plan, PlanOptions, mode_of, plan, row_seq
from zoo.throughput.roofline import INPUTS

# --fits keys: the plan's own keyword names (and `seq` for seq_len)
KEYS = ("batch", "seq", "seq_len", "devices", "fsdp", "tp", "dtype", "optimizer", "checkpointing", "kv_dtype")
WHOLE = ("batch", "seq_len", "devices", "fsdp", "tp")
TRAIN, INFER = ("train", "training"), ("infer", "inference", "serve", "serving")
# What a plan reads of a row
ROW_FIELDS = (
    "name",
    "plan_shapes",
    "plan_activations",
    "heads",
    "kv_heads",
    "inputs",
    "layers",
    "hidden_size",
    *INPUTS,
)
FIELDS = ("max_batch",)  # what a search with fits adds to the fields it can return
EXAMPLE = "'H100 train batch=8 seq=4096 fsdp=8 devices=8'"


def fits_options(spec) -> PlanOptions:
    """The plan a --fits spec describes: the hardware's name (words), then `train` or `infer` (default), then
    key=value with the plan's keywords (batch, seq or seq_len, devices, fsdp, tp, dtype, optimizer, checkpointing,
    kv_dtype). InvalidArgument for anything else, or a mode that zoo index does not record."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(f"fits is a hardware and a run, e.g. {EXAMPLE}, not {spec!r:.80}", "fits")
    hardware: list[str] = []
    options: dict = {}
    for word in spec.split():
        key, has_value, value = word.partition("=")
        key = key.lower()
        if has_value:
            if key not in KEYS:
                raise InvalidArgument(f"fits: unknown key {key!r}; the keys are {', '.join(KEYS)}", "fits")
            options["seq_len" if key == "seq" else key] = _value(key, value)
        elif key in TRAIN + INFER:
            options["training"] = key in TRAIN
        elif key == "checkpointing":
            options["checkpointing"] = True
        elif options:
            raise InvalidArgument(
                f"fits: {word!r} after the run's options; the hardware comes first: {EXAMPLE}", "fits"
            )
        else:
            hardware.append(word)
    if not hardware:
        raise InvalidArgument(f"fits starts with the hardware (H100, 'RTX 4090', 24GiB): {EXAMPLE}", "fits")
    o = PlanOptions(hardware=" ".join(hardware), **options).checked()
    if mode_of(o) not in RECORDED_MODES:
        raise InvalidArgument(
            "fits answers from what zoo index records for every model: inference at bf16 or fp16, and training at "
            "amp-bf16, amp-fp16, bf16 or fp16 without checkpointing; for another run, plan one model with zoo plan "
            "NAME (it measures on meta)",
            "fits",
        )
    return o


def _value(key: str, text: str):
    if key == "checkpointing":
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise InvalidArgument(f"fits: checkpointing is true or false, not {text!r:.40}", "fits")
        return text.lower() in ("true", "1", "yes")
    if ("seq_len" if key == "seq" else key) in WHOLE:
        if not text.isdigit():
            raise InvalidArgument(f"fits: {key} is a whole number, not {text!r:.40}", "fits")
        return int(text)
    return text


def plan_of_row(row: dict, o: PlanOptions, mode: str) -> Plan | None:
    """The plan of a search row (ROW_FIELDS) from its recorded data for options `o` of mode_of `mode`; None where it
    records none for this mode."""
    info = SimpleNamespace(**row)
    if o.seq_len and row_seq(info) is None:  # the sequence is the token models': another is planned at its own input
        o = replace(o, seq_len=None)
    values = (row.get("plan_activations") or {}).get(mode)
    if not isinstance(values, list) or not row.get("plan_shapes"):  # text: why zoo index could not measure it
        return None
    activations = Activations.from_json(values)
    try:
        return plan(row["name"], row["plan_shapes"], info, o, activations)
    except InvalidArgument:  # a TP degree that does not divide its heads: this layout cannot run it
        return None


def fitting(rows: list[dict], o: PlanOptions) -> tuple[list[tuple[dict, Plan]], list[str]]:
    """(row, plan) of each row whose plan fits, in the rows' order; and the names of rows that record no activations
    for this mode (a model that cannot run on meta, or one indexed before zoo recorded them)."""
    kept, unplanned = [], []
    mode = mode_of(o)
    for row in rows:
        p = plan_of_row(row, o, mode)
        if p is None:
            if not isinstance((row.get("plan_activations") or {}).get(mode), list):
                unplanned.append(row["name"])
        elif p.fits:
            kept.append((row, p))
    return kept, unplanned
