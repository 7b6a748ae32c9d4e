"""Which part of a full tensor a DTensor holds on this rank: a box, (start, stop) per dim.

Any placement FSDP2 and tensor parallelism make: Shard(d) on any dim, several mesh dims (2D), Replicate,
uneven shards (torch.chunk sizes), and the _StridedShard FSDP2 makes over a tensor-parallel Shard on the
same dim. A rank reads just these boxes of the file.
"""

from typing import Literal

from zoo.errors import MaterializeError

Box = tuple[tuple[int, int], ...]  # (start, stop) per dim


def local_box(t) -> Box | None:
    """For a DTensor, the box of the full tensor its local tensor holds; None for a plain tensor."""
    placements = getattr(t, "placements", None)
    if placements is None:
        return None
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = t.device_mesh
    coordinate = mesh.get_coordinate()
    box = [(0, n) for n in t.shape]
    # A _StridedShard is FSDP2 sharding a tensor-parallel shard: it chunks what the later mesh dims
    # left, so it is applied after them (torch.chunk sizes, as FSDP2 cuts its shards; torch's own
    # formula for it differs from FSDP2's shards when they are uneven).
    order = sorted(range(len(placements)), key=lambda i: isinstance(placements[i], _StridedShard))
    for mesh_dim in order:
        placement = placements[mesh_dim]
        if isinstance(placement, Replicate):
            continue
        if not isinstance(placement, (Shard, _StridedShard)):
            raise MaterializeError(
                f"cannot materialize a DTensor placed as {placement}: a partial value has no "
                f"one file value; materialize before making it partial"
            )
        start, stop = box[placement.dim]
        size, offset = Shard.local_shard_size_and_offset(stop - start, mesh.size(mesh_dim), coordinate[mesh_dim])
        box[placement.dim] = (start + offset, start + offset + size)
    shape = tuple(e - s for s, e in box)
    if tuple(t.to_local().shape) != shape:
        raise MaterializeError(
            f"a DTensor whose local shard {tuple(t.to_local().shape)} is not the one its "
            f"placements {tuple(placements)} give {tuple(t.shape)} ({shape})"
        )
    return tuple(box)


def box_slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(s, e) for s, e in box)


def leading_rows(box: Box | None, shape: tuple[int, ...]) -> tuple[int, int] | None | Literal[False]:
    """(start, stop) of dim 0 when the box is whole in every other dim (a contiguous byte range of a
    row-major tensor), None for no box (the whole tensor), False when the box is strided."""
    if box is None:
        return None
    if any(b != (0, n) for b, n in zip(box[1:], shape[1:])):
        return False
    return box[0] if box else None
