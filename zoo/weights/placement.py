"""Which parts of a full tensor a DTensor holds on this rank: boxes of the full tensor and where each goes locally.

Any placement FSDP2 and tensor parallelism make: Shard(d) on any dim, several mesh dims (2D), Replicate,
uneven shards (torch.chunk sizes), and the _StridedShard FSDP2 makes over a tensor-parallel Shard on the
same dim. The indices follow torch's own computation of a local shard (torch.distributed.tensor._utils,
left to right over the mesh dims); a rank reads just these boxes of the file.
"""

import itertools

from zoo.errors import MaterializeError

Box = tuple[tuple[int, int], ...]  # (start, stop) per dim


def local_boxes(t) -> tuple[tuple[int, ...], list[tuple[Box, Box]]] | None:
    """For a DTensor, its local shape and (box of the full tensor, box of the local tensor) pairs that
    cover the local tensor exactly; None for a plain tensor."""
    placements = getattr(t, "placements", None)
    if placements is None:
        return None
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard, _StridedShardOffsetMode

    mesh, shape = t.device_mesh, tuple(t.shape)
    coordinate = mesh.get_coordinate()
    index: list = [range(n) for n in shape]  # per dim, the full tensor's indices in local order
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        chunks, rank = mesh.size(mesh_dim), coordinate[mesh_dim]
        if isinstance(placement, _StridedShard):
            d = placement.dim
            _, offsets = placement.local_shard_size_and_offset(len(index[d]), chunks, rank,
                                                               _StridedShardOffsetMode.ALL)
            index[d] = [index[d][i] for i in offsets]
        elif isinstance(placement, Shard):
            d = placement.dim
            size, offset = Shard.local_shard_size_and_offset(len(index[d]), chunks, rank)
            index[d] = index[d][offset:offset + size]
        else:
            raise MaterializeError(f"cannot materialize a DTensor placed as {placement}: a partial value has no "
                                   f"one file value; materialize before making it partial")
    local_shape = tuple(len(i) for i in index)
    if tuple(t.to_local().shape) != local_shape:
        raise MaterializeError(f"a DTensor whose local shard {tuple(t.to_local().shape)} is not the one its "
                               f"placements {tuple(placements)} give {tuple(shape)} ({local_shape})")
    runs = [_runs(i) for i in index]
    boxes = []
    for combo in itertools.product(*runs):
        boxes.append((tuple((s, e) for s, e, _ in combo), tuple((at, at + e - s) for s, e, at in combo)))
    return local_shape, boxes


def _runs(indices) -> list[tuple[int, int, int]]:
    """Consecutive increasing indices as (start, stop, local position) runs."""
    if isinstance(indices, range) and indices.step == 1:
        return [(indices.start, indices.stop, 0)] if len(indices) else []
    runs: list[list[int]] = []
    for at, i in enumerate(indices):
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, at])
    return [tuple(r) for r in runs]


def box_slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(s, e) for s, e in box)


def leading_rows(box: Box | None, shape: tuple[int, ...]) -> tuple[int, int] | None | bool:
    """(start, stop) of dim 0 when the box is whole in every other dim (a contiguous byte range of a
    row-major tensor), None for no box (the whole tensor), False when the box is strided."""
    if box is None:
        return None
    if any(b != (0, n) for b, n in zip(box[1:], shape[1:])):
        return False
    return box[0] if box else None
