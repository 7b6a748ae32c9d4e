"""The memory a load reads into, and the threads that fill it."""

import math
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import torch

_ALIGN = 64


def allocate(shapes: list[tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """Empty tensors for a load. On CPU they are views of one anonymous mapping with transparent huge
    pages: first-touch page faults, not the disk, bound a load from the page cache."""
    if device.type != "cpu":
        return [torch.empty(shape, dtype=dt, device=device) for shape, dt in shapes]
    offsets, total = [], 0
    for shape, dt in shapes:
        offsets.append(total)
        total += (math.prod(shape) * dt.itemsize + _ALIGN - 1) // _ALIGN * _ALIGN
    if total == 0:
        return [torch.empty(shape, dtype=dt) for shape, dt in shapes]
    arena = mmap.mmap(-1, total)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        arena.madvise(mmap.MADV_HUGEPAGE)
    flat = torch.frombuffer(arena, dtype=torch.uint8)  # keeps the mapping alive as long as any view
    return [flat[o:o + math.prod(shape) * dt.itemsize].view(dt).view(shape) for o, (shape, dt) in zip(offsets, shapes)]


def parallel(fn, jobs, weight) -> None:
    """Run fn over jobs on a few threads, balanced by bytes: reads and copies release the GIL."""
    workers = min(len(jobs), os.cpu_count() or 1, 8)
    if workers <= 1:
        for job in jobs:
            fn(job)
        return
    groups = [[] for _ in range(workers)]
    loads = [0] * workers
    for job in sorted(jobs, key=weight, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(job)
        loads[i] += weight(job)
    with ThreadPoolExecutor(workers) as pool:
        for result in [pool.submit(lambda g: [fn(j) for j in g], g) for g in groups]:
            result.result()
