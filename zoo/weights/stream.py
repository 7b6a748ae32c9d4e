"""Streaming a safetensors source onto a device through a small ring of reusable host buffers.

The plan (plan_chunks) is pure Python: the byte ranges to load, in file order, cut into chunks
of at most one buffer each; a tensor larger than a buffer spans several chunks, small tensors
that follow each other in the file share one chunk and one read. stream_into runs that plan: a
few threads pread chunks into the ring while the caller's thread copies filled buffers out. On
CUDA the ring is pinned and the copies are asynchronous on a dedicated stream, an event per
buffer telling when it may be refilled, so page-cache reads overlap host-to-device copies; on
CPU (the tests) the buffers are ordinary and the copies synchronous, through the same plan.
"""

import os
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

from zoo.weights.sources import SafetensorsSource, read_exact

BUFFER_BYTES = 32 << 20  # a power of two: torch's pinned-memory cache rounds sizes up to one
# Page-cache reads are memory copies; one thread cannot keep up with a PCIe 5 link. On 16-core H200 hosts
# (bench/materialize_cuda.py --sweep) 4, 8, 12 and 16 readers read 13, 19, 22 and 22 GB/s on one host,
# where 16, 32 and 64 MiB buffers were the same within noise; on a slower host 12 readers read 12.5, 17.2
# and 15.8 GB/s with 16, 32 and 64 MiB buffers. 12 readers, 32 MiB buffers (a ring of 16: 512 MiB pinned).
MAX_READERS = 12


@dataclass(frozen=True)
class Read:
    """One pread: `length` bytes at `start` of file `fd` into the buffer at `offset`."""

    fd: int
    start: int
    length: int
    offset: int


@dataclass(frozen=True)
class Piece:
    """`length` bytes at buffer `offset` that belong at byte `at` of job `job`'s tensor."""

    job: int
    at: int
    offset: int
    length: int


@dataclass
class Chunk:
    """What fills one buffer: the reads into it, and the pieces to copy out of it."""

    reads: list[Read] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    size: int = 0


def plan_chunks(ranges: list[tuple[int, int, int]], buffer_bytes: int) -> list[Chunk]:
    """Chunks of at most buffer_bytes covering every (fd, start, length) range exactly once, in file
    order (sequential reads); a read spans neighbouring ranges when they are contiguous in the file."""
    if buffer_bytes <= 0:
        raise ValueError(f"buffer_bytes must be positive, not {buffer_bytes}")
    chunks = [Chunk()]
    for job in sorted((j for j, r in enumerate(ranges) if r[2]), key=lambda j: ranges[j][:2]):
        fd, start, length = ranges[job]
        done = 0
        while done < length:
            chunk = chunks[-1]
            if chunk.size == buffer_bytes:
                chunk = Chunk()
                chunks.append(chunk)
            take = min(length - done, buffer_bytes - chunk.size)
            last = chunk.reads[-1] if chunk.reads else None
            if last is not None and last.fd == fd and last.start + last.length == start + done:
                chunk.reads[-1] = Read(fd, last.start, last.length + take, last.offset)
            else:
                chunk.reads.append(Read(fd, start + done, take, chunk.size))
            chunk.pieces.append(Piece(job, done, chunk.size, take))
            chunk.size += take
            done += take
    return [c for c in chunks if c.size]


def stream_into(
    jobs,
    source: SafetensorsSource,
    device,
    buffer_bytes: int | None = None,
    ring: int | None = None,
    readers: int | None = None,
) -> None:
    """Fill each job's destination from the file; returns when every copy is done.

    jobs: (checkpoint key, destination tensor on `device`, rows of dim 0 or None). A destination
    whose dtype differs from the file's (or that is not contiguous) is filled through a device
    tensor in the file's dtype and cast on the device once its last byte has arrived. On an error
    nothing is left in flight: the stream is drained before the buffers and tensors are released.
    """
    import torch

    device = torch.device(device)
    buffer_bytes = buffer_bytes or BUFFER_BYTES
    ranges = [source.byte_range(key, rows) for key, _, rows in jobs]
    chunks = plan_chunks(ranges, buffer_bytes)
    if not chunks:
        return
    cuda = device.type == "cuda"
    readers = readers or max(1, min(MAX_READERS, os.cpu_count() or 1, len(chunks)))
    ring = min(ring or readers + 4, len(chunks))  # readers fill some buffers while others are being copied
    stream = torch.cuda.Stream(device) if cuda else None
    sink = _Sink(jobs, source, ranges, device, stream)
    del jobs  # from here on only the sink holds the destinations, so that an error can let go of them
    size = max(c.size for c in chunks)
    buffers: list[torch.Tensor] = []

    def fill(i: int, copied) -> None:
        if copied is not None:
            copied.synchronize()  # the copies out of this buffer, enqueued for chunk i - ring, are done
        buf = buffers[i % ring]
        for r in chunks[i].reads:
            read_exact(r.fd, r.start, r.length, buf[r.offset : r.offset + r.length])

    pending = {}
    try:
        buffers.extend(torch.empty(size, dtype=torch.uint8, pin_memory=cuda) for _ in range(ring))
        if stream is not None:  # on cuda
            stream.wait_stream(torch.cuda.current_stream(device))  # destinations were allocated there
        with ThreadPoolExecutor(readers) as pool:
            try:
                for i in range(ring):
                    pending[i] = pool.submit(fill, i, None)
                for i, chunk in enumerate(chunks):
                    pending.pop(i).result()
                    copied = sink.copy_out(chunk, buffers[i % ring])
                    if i + ring < len(chunks):
                        pending[i + ring] = pool.submit(fill, i + ring, copied)
            finally:
                for future in pending.values():
                    future.cancel()
    except BaseException as e:
        if stream is not None:
            stream.synchronize()  # nothing may still write into memory that is about to be freed or reused
        # A traceback keeps its frames' locals alive as long as the caller keeps the exception: let go
        # of the device and pinned memory now, so that a failed load has freed it when it raises.
        traceback.clear_frames(e.__traceback__)
        sink.release()
        buffers.clear()
        raise
    if stream is not None:
        stream.synchronize()  # the call returns with every tensor filled


class _Sink:
    """Where the pieces of each job go: the destination's own bytes, or a staging tensor in the
    file's dtype that is cast into the destination when complete."""

    def __init__(self, jobs, source, ranges, device, stream):
        import torch

        self.torch, self.stream, self.device = torch, stream, device
        self.dests = [dest for _, dest, _ in jobs]
        self.file_dtypes = [getattr(torch, source.specs[key].dtype) for key, _, _ in jobs]
        self.lengths = [length for _, _, length in ranges]
        self.targets = [
            dest.view(-1).view(torch.uint8) if self._direct(j) else None for j, dest in enumerate(self.dests)
        ]

    def release(self) -> None:
        self.dests, self.targets = [], []

    def _direct(self, j: int) -> bool:
        dest = self.dests[j]
        return dest.dtype == self.file_dtypes[j] and dest.is_contiguous() and dest.nbytes == self.lengths[j]

    def copy_out(self, chunk: Chunk, buf):
        """Enqueue the chunk's copies (and casts of the tensors it completes); on CUDA, an event
        recorded after them, when the buffer may be refilled."""
        torch = self.torch
        cuda = self.stream is not None
        # staging tensors are allocated on the copy stream: their memory is reused only in its order
        with torch.cuda.stream(self.stream) if cuda else nullcontext():
            for p in chunk.pieces:
                target = self.targets[p.job]
                if target is None:
                    target = self.targets[p.job] = torch.empty(
                        self.lengths[p.job], dtype=torch.uint8, device=self.device
                    )
                target[p.at : p.at + p.length].copy_(buf[p.offset : p.offset + p.length], non_blocking=cuda)
                if p.at + p.length == self.lengths[p.job] and not self._direct(p.job):
                    dest = self.dests[p.job]
                    dest.copy_(target.view(self.file_dtypes[p.job]).view(dest.shape))  # the cast, on the device
                    self.targets[p.job] = None
            if not cuda:
                return None
            event = torch.cuda.Event()
            event.record(self.stream)
            return event
