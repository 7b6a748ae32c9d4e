"""Index-time activation fits for zoo.plan and `zoo search --fits`: for each mode of zoo.planning.RECORDED_MODES, the
two regimes zoo.planning.fit_activations fits from zoo.estimate on meta at the row's own input (its plan_activations
column), so that a plan in a recorded mode builds no module."""

from __future__ import annotations

from torch import nn

from zoo.constants import plan_fits_enabled
from zoo.errors import reason


def plan_activations(module: nn.Module, spec: dict) -> dict | None:
    """{mode: Activations.as_json()} for every recorded mode; a mode that cannot run on meta maps to the reason. None
    where ZOO_PLAN_FITS=0 turns them off."""
    if not plan_fits_enabled():
        return None
    from zoo.analysis.inputs import has_sequence
    from zoo.analysis.memory import estimate_at
    from zoo.planning import RECORDED_MODES, PlanOptions, fit_activations, measurer

    seq = spec.get("seq_len") if has_sequence(spec) else None
    out: dict = {}
    for mode, options in RECORDED_MODES.items():
        measure = measurer(lambda **kw: estimate_at(module, spec, **kw), PlanOptions(hardware=1, **options))
        try:
            out[mode] = fit_activations(measure, seq).as_json()
        except Exception as e:  # recorded, not raised: the row keeps its other figures
            out[mode] = reason(e)
    return out
