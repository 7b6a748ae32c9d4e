"""Index-time analysis: FLOPs, activation bytes and output shapes of a meta module at batch 1, for its
registry row (the analysis columns of zoo.columns). A model that cannot run on meta is a finding,
recorded with its reason: nothing is faked and nothing is estimated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from zoo.analysis.forward import accepts, device_context, outputs_of, train_mode
from zoo.analysis.inputs import inputs_of, make_inputs
from zoo.analysis.meters import LiveBytes, SavedBytes, known_storages
from zoo.analysis.plan_record import plan_activations
from zoo.columns import ANALYSIS
from zoo.errors import reason

SCAN_OK, SCAN_ERROR, SCAN_NO_INPUT = "ok", "error", "no-input"
DEFAULT_BUDGET_S = 120.0  # per model at index time; a forward past it is recorded as an error, not waited for
_ATTRIBUTE = {"scan_status": "status", "scan_error": "error"}  # column -> Analysis attribute, where they differ


@dataclass(frozen=True)
class Analysis:
    status: str  # "ok", "error" or "no-input"
    error: str | None = None
    flops: int | None = None  # batch 1, inference
    macs: int | None = None
    train_activation_bytes: int | None = None  # saved for backward, training mode, batch 1
    peak_activation_bytes: int | None = None  # peak live activations, inference, batch 1
    output_shapes: list | None = None  # [[path, shape, dtype], ...] of the inference output
    inputs: list | None = None  # [{name, shape, dtype}, ...] the forward ran with (zoo.analysis.inputs.inputs_of)
    flops_per_token: int | None = None  # flops / the spec's seq_len: prefill cost per token (token models)
    plan_activations: dict | None = None  # zoo.analysis.plan_record: activation fits per mode, for zoo.plan

    def columns(self) -> dict:
        """The registry columns this analysis fills (zoo.columns.ANALYSIS), as the registry stores them."""
        return {c.name: c.encode(getattr(self, _ATTRIBUTE.get(c.name, c.name))) for c in ANALYSIS}


def _inputs(module: nn.Module, spec: dict) -> tuple[list, dict]:
    args, kwargs = make_inputs(spec, batch=1)
    if getattr(getattr(module, "config", None), "use_cache", None) is False and accepts(module, "use_cache"):
        # a config saved with use_cache false (TinyLlama v0.4) makes transformers look for packed sequences
        # in the position ids, which reads values meta tensors lack; with a cache (as generate() prefills,
        # and as every config that leaves use_cache on runs here) it does not
        kwargs["use_cache"] = True
    return args, kwargs


def analyze(module: nn.Module, spec: dict | None, budget_s: float | None = DEFAULT_BUDGET_S) -> Analysis:
    """Measure a meta module at batch 1 with its input spec; never raises for the model's sake.

    Two forwards: eval + no_grad under LiveBytes counting FLOPs too (flops, inference peak,
    output shapes), then train mode with grad under SavedBytes (activation bytes saved for
    backward). The module's train/eval flags are restored; its tensors are not changed.
    """
    if not spec:
        return Analysis(SCAN_NO_INPUT)
    try:
        inputs = inputs_of(spec)
    except Exception as e:
        return Analysis(SCAN_ERROR, f"input spec: {reason(e)}")
    deadline = time.perf_counter() + budget_s if budget_s else None
    try:
        args, kwargs = _inputs(module, spec)
        known = known_storages(module, args, kwargs)
        with device_context(module), train_mode(module, False), torch.no_grad():
            live = LiveBytes(known, deadline, flops=True)
            with live:
                out = module(*args, **kwargs)
            shapes = outputs_of(out)
            del out
    except Exception as e:  # recorded, not raised: a model that cannot run on meta is a finding
        return Analysis(SCAN_ERROR, reason(e), inputs=inputs)
    assert live.flops is not None  # counted: LiveBytes(flops=True)
    flops = int(live.flops.total)
    saved, error = None, None
    # A model that cannot take a training step at batch 1 (BatchNorm over a single value)
    # keeps its inference figures; the training figure stays empty, with the reason.
    try:
        args, kwargs = _inputs(module, spec)
        known = known_storages(module, args, kwargs)
        with device_context(module), train_mode(module, True), torch.enable_grad():
            with SavedBytes(known, deadline) as sb:
                out = module(*args, **kwargs)
            saved = sb.bytes
            del out
    except Exception as e:
        error = f"training forward: {reason(e)}"
    per_token = flops // spec["seq_len"] if spec.get("seq_len") else None
    fits = plan_activations(module, spec)
    return Analysis(SCAN_OK, error, flops, flops // 2, saved, live.peak, shapes, inputs, per_token, fits)
