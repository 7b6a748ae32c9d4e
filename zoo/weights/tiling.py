"""Whether the chunks a checkpoint stores of one tensor tile its shape exactly, in time linear in the chunks."""

import itertools
import math

from zoo.errors import CheckpointError

MAX_SPLIT_DIMS = 6  # the check sums 2^6 corners a chunk; device meshes shard 1 to 3 dims


def check_tiling(fqn: str, shape, chunks: list, path) -> None:
    """The chunks (each with .offsets and .sizes) lie inside the shape, do not overlap and add up to it: every
    element is in exactly one; else CheckpointError naming the tensor `fqn` of the checkpoint at `path`."""
    for c in chunks:
        if (
            len(c.offsets) != len(shape)
            or len(c.sizes) != len(shape)
            or any(o + s > n for o, s, n in zip(c.offsets, c.sizes, shape))
        ):
            raise CheckpointError(f"{path}: a chunk of {fqn} at {c.offsets} of {c.sizes} is outside its shape {shape}")
    if sum(math.prod(c.sizes) for c in chunks) != math.prod(shape):
        raise CheckpointError(f"{path}: the chunks of {fqn} do not add up to its shape {shape}")
    if not math.prod(shape):
        return  # no elements, and (by the sum) every chunk empty
    # A box is the signed sum of the 2^d orthants at its corners (+ at the low corner, - per high coordinate),
    # and distinct orthants are independent: the chunks tile the shape exactly when their corners, summed
    # with those signs, cancel to the shape's own. O(chunks * 2^d), where comparing pairs was quadratic
    # ([1, N] saved as N [1, 1] chunks: 30,000 of them did not load in minutes). Only the dims some chunk
    # splits count: DCP splits the dims a device mesh shards.
    chunks = [c for c in chunks if math.prod(c.sizes)]
    split = [d for d, n in enumerate(shape) if any(c.sizes[d] != n for c in chunks)]
    if len(split) > MAX_SPLIT_DIMS:
        raise CheckpointError(
            f"{path}: the chunks of {fqn} split {len(split)} of its dims; zoo reads chunks split "
            f"along at most {MAX_SPLIT_DIMS} (a device mesh of that many dims)"
        )
    corners: dict[tuple, int] = {}
    for offsets, sizes, sign in [*((c.offsets, c.sizes, 1) for c in chunks), ((0,) * len(shape), shape, -1)]:
        for high in itertools.product((False, True), repeat=len(split)):
            corner = tuple(offsets[d] + sizes[d] if h else offsets[d] for d, h in zip(split, high))
            corners[corner] = corners.get(corner, 0) + (-sign if sum(high) % 2 else sign)
    if any(corners.values()):
        raise CheckpointError(
            f"{path}: chunks of {fqn} overlap: their sizes add up to its shape {shape}, but some "
            f"elements are in two chunks and others in none"
        )
