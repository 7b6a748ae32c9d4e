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


def _tp_split(name: str, shape: tuple, tp: int, rank: int = 0) -> tuple:
    """A tensor's shape on TP rank `rank`, split as DTensor's Shard splits it: torch.chunk, unpadded (rank 0 most)."""
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 else ""
    if tp == 1 or not shape:
        return shape
    if module in TP_COLWISE:
        return (_chunk(shape[0], tp, rank)[0], *shape[1:])
    if module in TP_ROWWISE and parts[-1] == "weight" and len(shape) == 2:
        return (shape[0], _chunk(shape[1], tp, rank)[0])
    return shape


def shape_groups(tensors: Sequence) -> dict:
    """What model_states and other_bytes read of a tensor table (zoo.inspection.TensorInfo rows), small enough to be a
    registry column (`plan_shapes`, recorded by zoo index): the untied parameters grouped by (module, leaf name,
    shape) with their count, the buffers' floating elements and other bytes, and FSDP2's units (blocks)."""
    groups: dict[tuple, int] = {}
    floating = other = 0
    for t in tensors:
        if t.tied_to is not None:
            continue
        if t.kind != "parameter":
            floating += t.numel if t.dtype in _BYTES else 0
            other += 0 if t.dtype in _BYTES else t.bytes
            continue
        parts = t.name.split(".")
        key = (parts[-2] if len(parts) > 1 else "", parts[-1], tuple(t.shape))
        groups[key] = groups.get(key, 0) + 1
    counts, root = blocks(tensors)
    return {
        "params": [[module, leaf, list(shape), n] for (module, leaf, shape), n in groups.items()],
        "buffers": [floating, other],
        "blocks": [max(counts, default=0), root],
    }


def model_states(shapes: dict, o: PlanOptions, rank: int = 0) -> dict[str, int]:
    """Weights, gradients and optimizer states on device `rank` of an (fsdp, tp) mesh (FSDP rank rank // tp, TP rank
    rank % tp) of a model's shape_groups, as the module docstring counts them. Rank 0 holds the most."""
    compute, master, _ = PRECISIONS[o.dtype or "bf16"]
    k = STATES[o.optimizer] if o.training and o.optimizer else 0
    floating, other = shapes["buffers"]
    out = {"weights": floating * (compute if master == compute else 4) + other, "gradients": 0, "optimizer": 0}
    for module, leaf, full, count in shapes["params"]:
        shape = _tp_split(f"{module}.{leaf}", tuple(full), o.tp, rank % o.tp)
        rest = math.prod(shape[1:]) if shape else 1
        held, stored = _chunk(shape[0], o.fsdp, rank // o.tp) if shape else (1, 1)  # fsdp=1: the whole dim
        out["weights"] += count * stored * rest * master
        if o.training:
            out["gradients"] += count * stored * rest * master
            out["optimizer"] += count * (k * held * rest * master + STEP_BYTES[o.optimizer or "none"])
    return out


def param_count(shapes: dict) -> int:
    return sum(count * math.prod(shape) for _, _, shape, count in shapes["params"])


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
    for module, leaf, full, count in shapes["params"]:
        shape = _tp_split(f"{module}.{leaf}", tuple(full), o.tp) or (1,)
        pad += count * (_chunk(shape[0], o.fsdp, 0)[1] * o.fsdp - shape[0]) * math.prod(shape[1:])
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
