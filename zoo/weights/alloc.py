"""The memory a load reads into, and the threads that fill it."""

import os
from concurrent.futures import ThreadPoolExecutor

import torch


def allocate(shapes: list[tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """Empty tensors for a load, each with a storage of its own, as the library's own model has: one
    shared allocation would share one autograd version counter (BatchNorm's in-place running-stat
    updates then break backward), one dtype for torch.save, and one file for a submodule's state dict."""
    return [torch.empty(shape, dtype=dt, device=device) for shape, dt in shapes]


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
