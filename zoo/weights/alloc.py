"""The memory a load reads into, and the threads that fill it."""

import functools
import mmap
import os
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from zoo.caching import register


def allocate(shapes: list[tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """Empty tensors for a load, each with a storage of its own, as the library's own model has: one
    shared allocation would share one autograd version counter (BatchNorm's in-place running-stat
    updates then break backward), one dtype for torch.save, and one file for a submodule's state dict."""
    return [torch.empty(shape, dtype=dt, device=device) for shape, dt in shapes]


_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGE = 4096


@functools.cache
def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


register("libc", bound=1, clear=_libc.cache_clear, size=lambda: _libc.cache_info().currsize)


def map_private(fd: int, length: int):
    """A private (copy-on-write) mapping of a file's first `length` bytes, as a writable buffer that tensors
    take views of (torch.frombuffer: each its own storage); unmapped when the last of them is freed. Not
    mmap.mmap: that keeps a duplicate of the descriptor open as long as the mapping lives (one per file per
    load, so a process that keeps loading runs out of descriptors), where the kernel needs none."""
    if not sys.platform.startswith("linux"):
        return mmap.mmap(fd, length, access=mmap.ACCESS_COPY)
    import ctypes

    libc = _libc()
    addr = libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        err = ctypes.get_errno()
        raise OSError(err, f"cannot map the weights file: {os.strerror(err)}")
    buffer = (ctypes.c_char * length).from_address(addr)
    weakref.finalize(buffer, libc.munmap, addr, length)
    return buffer


def populate(t: torch.Tensor) -> None:
    """Fault in a fresh CPU tensor's pages with one madvise before a read fills it: the kernel zeroes
    them in a loop instead of taking a trap per 4 KiB page (ViT-L's first load: 0.33 -> 0.28 s on 2
    cores). Huge pages (MADV_HUGEPAGE) were measured too: this kernel compacts synchronously for them
    and the same load took 1.3-1.4 s. Where the call is not available nothing happens."""
    if t.device.type != "cpu" or t.nbytes < (1 << 20) or not sys.platform.startswith("linux"):
        return
    start = (t.data_ptr() + _PAGE - 1) // _PAGE * _PAGE
    end = (t.data_ptr() + t.nbytes) // _PAGE * _PAGE
    if end > start:
        _libc().madvise(start, end - start, _MADV_POPULATE_WRITE)  # an old kernel's EINVAL: the read faults them


def parallel(fn, jobs, weight) -> None:
    """Run fn over jobs on a few threads, balanced by bytes: reads and copies release the GIL."""
    workers = min(len(jobs), os.cpu_count() or 1, 8)
    if workers <= 1:
        for job in jobs:
            fn(job)
        return
    groups: list[list] = [[] for _ in range(workers)]
    loads = [0] * workers
    for job in sorted(jobs, key=weight, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(job)
        loads[i] += weight(job)
    with ThreadPoolExecutor(workers) as pool:
        for result in [pool.submit(lambda g: [fn(j) for j in g], g) for g in groups]:
            result.result()
