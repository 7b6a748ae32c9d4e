"""Model states per device (weights, gradients, optimizer states) from a model's parameter shapes, sharded as FSDP2
and tensor parallelism shard them, and the bytes the framework adds (OTHER)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from zoo.planning.options import _BYTES, PRECISIONS, STATES, STEP_BYTES, PlanOptions, autocast

# The standard tensor-parallel plan (Megatron-LM; torch's parallelize_module with ColwiseParallel/RowwiseParallel,
# as torchtitan's Llama plan): the last module name of each split Linear.
TP_COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "qkv", "fc1", "w1", "w3")
TP_ROWWISE = ("o_proj", "down_proj", "proj", "fc2", "w2")
OTHER = {
    "fsdp_gathered": "FSDP2 (each block and the root fully_shard-ed, reshard_after_forward=True): at the compute "
    "dtype, the root's unsharded parameters (padded to the ranks, never resharded after forward) and three blocks in "
    "forward (the one running, its flat all-gather buffer, the last block's buffer still referenced while the copy-out "
    "runs); in backward four blocks (the running one's parameters and gradients, the prefetched block's all-gather "
    "buffer, the last block's reduce-scatter input) and the root's gradients. Measured on gloo ranks, "
    "tests/test_plan_other.py: exact in serving, in training above by the gradients autograd gives the root after "
    "the blocks (the input embeddings)",
    "ddp_buckets": "DDP: its all-reduce buckets, one more copy of the gradients (gradient_as_bucket_view=False, "
    "the default; with True the gradients are views of the buckets). Measured: tests/test_plan_other.py",
    "amp_copies": "amp-* under FSDP2 without autocast: low-precision copies of the weights, kept for backward",
    "cuda_reserve": "a GPU of the hardware table: the CUDA context, cuDNN's and cuBLAS's handles and workspaces",
    "allocator": "a GPU of the hardware table: the caching allocator's rounding and fragmentation (of activations)",
}


def _chunk(rows: int, ranks: int, rank: int) -> tuple[int, int]:
    """(rows held, rows stored) by `rank` of a dim of `rows` split as torch.chunk (and fully_shard) splits it."""
    size = -(-rows // ranks)
    return max(0, min(size, rows - rank * size)), size


def tp_role(name: str, shape: Sequence[int]) -> str:
    """How the standard plan splits a parameter: "col" (a TP_COLWISE module's weight and bias: dim 0), "row" (a
    TP_ROWWISE module's 2-d weight: dim 1) or "" (replicated: its bias, and every other parameter)."""
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 else ""
    if module in TP_COLWISE and shape:
        return "col"
    return "row" if module in TP_ROWWISE and parts[-1] == "weight" and len(shape) == 2 else ""


def _local(role: str, rows: int | None, rest: int, o: PlanOptions, rank: int) -> tuple[int, int, int]:
    """(rows held, rows stored, elements a row) of a parameter group on device `rank`: split by TP as DTensor's Shard
    splits (torch.chunk, unpadded: rank 0 most), then on dim 0 by FSDP2 as fully_shard does (padded). rows None: a
    0-d parameter, held whole."""
    if rows is None:
        return 1, 1, 1
    if o.tp > 1 and role == "col":
        rows = _chunk(rows, o.tp, rank % o.tp)[0]
    elif o.tp > 1 and role == "row":
        rest = _chunk(rest, o.tp, rank % o.tp)[0]
    held, stored = _chunk(rows, o.fsdp, rank // o.tp)
    return held, stored, rest


def shape_groups(tensors: Sequence) -> dict:
    """What model_states and other_bytes read of a tensor table (zoo.inspection.TensorInfo rows), small enough to be a
    registry column (`plan_shapes`, recorded by zoo index): the untied parameters grouped by (tp_role, dim 0, the
    elements of the rest: the columns of a "row" weight) with their count, the buffers' floating elements and other
    bytes, and FSDP2's units (blocks)."""
    groups: dict[tuple, int] = {}
    floating = other = 0
    for t in tensors:
        if t.tied_to is not None:
            continue
        if t.kind != "parameter":
            floating += t.numel if t.dtype in _BYTES else 0
            other += 0 if t.dtype in _BYTES else t.bytes
            continue
        key = (tp_role(t.name, t.shape), t.shape[0] if t.shape else None, math.prod(t.shape[1:]))
        groups[key] = groups.get(key, 0) + 1
    counts, root = blocks(tensors)
    return {
        "params": [[*key, n] for key, n in groups.items()],
        "buffers": [floating, other],
        "blocks": [max(counts, default=0), root],
    }


def model_states(shapes: dict, o: PlanOptions, rank: int = 0) -> dict[str, int]:
    """Weights, gradients and optimizer states on device `rank` of an (fsdp, tp) mesh (FSDP rank rank // tp, TP rank
    rank % tp) of a model's shape_groups, as the module docstring counts them. Rank 0 holds the most."""
    compute, master, _ = PRECISIONS[o.dtype or "bf16"]
    k = STATES[o.optimizer] if o.training and o.optimizer else 0
    floating, other = shapes["buffers"]
    stored_elements = held_elements = tensors = 0
    for role, rows, rest, count in shapes["params"]:
        held, stored, rest = _local(role, rows, rest, o, rank)
        stored_elements += count * stored * rest
        held_elements += count * held * rest
        tensors += count
    weights = floating * (compute if master == compute else 4) + other + stored_elements * master
    if not o.training:
        return {"weights": weights, "gradients": 0, "optimizer": 0}
    step = STEP_BYTES[o.optimizer or "none"] * tensors
    return {"weights": weights, "gradients": stored_elements * master, "optimizer": k * held_elements * master + step}


def param_count(shapes: dict) -> int:
    return sum(count * (rows or 1) * rest for _, rows, rest, count in shapes["params"])


def blocks(tensors: Sequence) -> tuple[list[int], int]:
    """The parameters' element counts of each block of the longest stack of repeated blocks (names `stack.N.`),
    and of the rest: FSDP2's units when each block and the root are fully_shard-ed."""
    stacks: dict[str, dict[str, int]] = {}
    params = [t for t in tensors if t.kind == "parameter" and t.tied_to is None]
    for t in params:
        parts = t.name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part.isdigit():
                prefix = ".".join(parts[:i])
                stacks.setdefault(prefix, {}).setdefault(part, 0)
                stacks[prefix][part] += t.numel
                break
    if not stacks:
        return [], sum(t.numel for t in params)
    best = max(stacks, key=lambda p: len(stacks[p]))
    counts = list(stacks[best].values())
    return counts, sum(t.numel for t in params) - sum(counts)


def _padding(shapes: dict, o: PlanOptions) -> int:
    """The elements fully_shard adds by padding each parameter's dim 0 to a multiple of the ranks (TP rank 0's
    split): an upper bound of the root's padding (the blocks' dims divide the ranks in the models measured)."""
    pad = 0
    for role, rows, rest, count in shapes["params"]:
        local = 1 if rows is None else _chunk(rows, o.tp, 0)[0] if o.tp > 1 and role == "col" else rows
        rest = _chunk(rest, o.tp, 0)[0] if o.tp > 1 and role == "row" else rest
        pad += count * (_chunk(local, o.fsdp, 0)[1] * o.fsdp - local) * rest
    return pad


def other_bytes(shapes: dict, o: PlanOptions, states: dict[str, int]) -> dict[str, int]:
    """The terms of OTHER that apply to this layout."""
    compute, master, _ = PRECISIONS[o.dtype or "bf16"]
    out = {}
    if o.fsdp > 1:
        largest, root = (n // o.tp for n in shapes["blocks"])
        gathered = root + _padding(shapes, o)  # the root as all-gathered: each dim 0 padded to the ranks
        # the peaks tests/test_plan_other.py measures (elements): in forward the root and three blocks, or two roots
        # and two blocks while the root's own buffer is still held; in backward (root's gradients bounded by root)
        # four blocks, or at its end the root's parameters, gradients and reduce-scatter input
        peak = (
            gathered + root + max(4 * largest, gathered)
            if o.training
            else gathered + 2 * largest + max(largest, gathered)
        )
        out["fsdp_gathered"] = peak * compute
    elif master != compute and not autocast(o):
        out["amp_copies"] = param_count(shapes) * compute // o.tp if o.training else 0
    if o.training and o.devices // (o.fsdp * o.tp) > 1 and o.fsdp == 1:
        out["ddp_buckets"] = states["gradients"]
    return out
