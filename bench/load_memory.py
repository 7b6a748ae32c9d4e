"""Which memory a copying load should read into: shared, private, private with huge pages, private faulted in.

Each strategy loads timm's vit_large_patch16_224 (1.22 GB fp32, random values, file in the page cache)
tensor by tensor with zoo's own reader and threads, in a fresh process, --rounds times in alternating
order; the table gives the median seconds and the ratio to the fastest:
  shared      one mmap.mmap(-1, n) for all tensors (MAP_SHARED: shmem; zoo's arena before)
  private     torch.empty per tensor (malloc: private anonymous memory, faulted page by page by the read)
  hugepage    private, with MADV_HUGEPAGE on each tensor before its read
  populate    private, with MADV_POPULATE_WRITE on each tensor before its read (what zoo does)
and a read of the same bytes into one buffer whose pages are already touched (the floor).

    .venv/bin/python bench/load_memory.py [--rounds 5] [--keep] [--json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILE = Path(os.environ.get("ZOO_BENCH_DIR", "/tmp/zoo_bench")) / "load_memory_vit_l.safetensors"
STRATEGIES = ("shared", "private", "hugepage", "populate", "touched floor")

CHILD = """
import ctypes, math, mmap, sys, time, torch
from zoo.weights.alloc import parallel
from zoo.weights.sources import SafetensorsSource
strategy, path = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
def advise(t, advice):
    start = (t.data_ptr() + 4095) // 4096 * 4096
    end = (t.data_ptr() + t.nbytes) // 4096 * 4096
    if end > start:
        libc.madvise(start, end - start, advice)
with SafetensorsSource([path]) as source:
    specs = list(source.specs.items())
    if strategy == "touched floor":
        buf = torch.ones(
            sum(math.prod(s.shape) * getattr(torch, s.dtype).itemsize for _, s in specs), dtype=torch.uint8
        )
        t = time.perf_counter()
        fd, start, _ = source.byte_range(specs[0][0])
        from zoo.weights.sources import read_exact
        read_exact(fd, start, buf.numel(), buf)
        print(time.perf_counter() - t)
        raise SystemExit
    t = time.perf_counter()
    if strategy == "shared":
        sizes = [math.prod(s.shape) * getattr(torch, s.dtype).itemsize for _, s in specs]
        arena = torch.frombuffer(mmap.mmap(-1, sum(sizes)), dtype=torch.uint8)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        dests = [
            arena[o:o + n].view(getattr(torch, s.dtype)).view(s.shape) for o, n, (_, s) in zip(offsets, sizes, specs)
        ]
    else:
        dests = [torch.empty(s.shape, dtype=getattr(torch, s.dtype)) for _, s in specs]
    def read(job):
        (key, _), dest = job
        if strategy == "hugepage":
            advise(dest, 14)
        elif strategy == "populate":
            advise(dest, 23)
        source.read_into(key, dest)
    parallel(read, list(zip(specs, dests)), lambda job: job[1].nbytes)
    print(time.perf_counter() - t)
"""


def make_file() -> int:
    if not FILE.exists():
        import torch
        from safetensors.torch import save_file

        import zoo

        FILE.parent.mkdir(parents=True, exist_ok=True)
        g = torch.Generator().manual_seed(0)
        state = zoo.get("timm/vit_large_patch16_224").state_dict()
        save_file({k: torch.randn(v.shape, generator=g) for k, v in state.items()}, str(FILE))
    with open(FILE, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    return FILE.stat().st_size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    try:
        nbytes = make_file()
        times = {s: [] for s in STRATEGIES}
        for r in range(args.rounds):
            for strategy in STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, strategy, str(FILE)],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    check=True,
                )
                times[strategy].append(float(out.stdout.strip().splitlines()[-1]))
    finally:
        if not args.keep:
            FILE.unlink(missing_ok=True)
    medians = {s: statistics.median(v) for s, v in times.items()}
    if args.json:
        print(json.dumps({"bytes": nbytes, "median_s": medians, "runs": times}, indent=1))
        return
    best = min(v for s, v in medians.items() if s != "touched floor")
    print(f"vit_large_patch16_224 ({nbytes / 1e9:.2f} GB), median of {args.rounds} fresh processes")
    for s in STRATEGIES:
        print(
            f"  {s:<14} {medians[s]:6.3f} s  {nbytes / medians[s] / 1e9:5.2f} GB/s  "
            f"{'floor' if s == 'touched floor' else f'{medians[s] / best:.2f}x the fastest'}"
        )
    print(f"  the fastest load is at {100 * medians['touched floor'] / best:.0f}% of the touched floor")


if __name__ == "__main__":
    main()
