"""materialize onto a CUDA GPU against the copy engine's limit and the plain ways to load a model there.

For one model over 3 GB (default timm convnext_xxlarge, 3.4 GB fp32; seeded random weights saved once
as safetensors under $ZOO_BENCH_DIR, default /tmp/zoo_bench), file in the page cache, one run prints:
  - zoo.get(...).materialize(device="cuda", weights=FILE) (best of 3, and the first call, which also
    allocates the pinned ring) against the limit measured in the same run: one pinned host buffer of
    the file's size copied to the device (target: zoo >= 80% of its throughput); also the file read
    into that pinned buffer by one thread, for scale;
  - zoo.get + materialize against timm.create_model(name, pretrained=True, pretrained_cfg_overlay=
    dict(file=FILE)).cuda(), and against timm.create_model on the device + load_state_dict(load_file(FILE))
    (target: >= 5x for both); load_file(FILE, device="cuda") beside them for scale;
  - peak host RSS of a fresh process during materialize(device="cuda") (VmHWM after resetting it
    through /proc/self/clear_refs), over its RSS before (target: < 1 GB);
  - that zoo's tensors equal, bit for bit, those of the plain load.

    .venv/bin/python bench/materialize_cuda.py [--model NAME] [--json] [--sweep]

--sweep first times materialize(device="cuda") over reader threads x ring buffer sizes (best of 3 each),
to choose zoo.weights.stream's defaults on the machine at hand.
Needs a CUDA GPU; without one it says so and exits with status 2.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("ZOO_BENCH_DIR", "/tmp/zoo_bench"))


def make_file(name: str) -> Path:
    """The model's persistent tensors (seeded random values) as one safetensors file, made once."""
    import torch
    from safetensors.torch import save_file

    import zoo

    path = WORK / f"{name}.safetensors"
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        state = {}
        for t in zoo.info(f"timm/{name}", tensors=True).tensor_table:
            if t.persistent and t.tied_to is None:
                dtype = getattr(torch, t.dtype)
                state[t.name] = (
                    torch.randn(t.shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(t.shape, dtype=dtype)
                )
        save_file(state, str(path) + ".part")
        os.replace(str(path) + ".part", path)  # a killed run leaves no half-written file behind
    return path


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def timed(fn) -> float:
    """Seconds until fn's work on the GPU is done; what fn returns is freed before the next run."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    del out
    gc.collect()
    torch.cuda.empty_cache()
    return elapsed


def read_into(path: Path, host, threads: int) -> float:
    """Seconds to read the whole file into the host tensor, in 16 MiB slices over `threads` threads."""
    from concurrent.futures import ThreadPoolExecutor

    from zoo.weights.sources import read_exact

    step = 16 << 20
    fd = os.open(path, os.O_RDONLY)
    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(
                pool.map(
                    lambda at: read_exact(fd, at, min(step, len(host) - at), host[at : at + step]),
                    range(0, len(host), step),
                )
            )
        return time.perf_counter() - t
    finally:
        os.close(fd)


def limits(path: Path) -> tuple[float, float, float]:
    """(seconds to copy one pinned buffer of the file's size to the device, best of 3; seconds to read
    the file into that buffer with one thread; and with as many threads as the stream uses, best of 3)."""
    import torch

    from zoo.weights import stream

    nbytes = path.stat().st_size
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    read = read_into(path, host, 1)
    threads = min(stream.MAX_READERS, os.cpu_count() or 1)
    read_parallel = min(read_into(path, host, threads) for _ in range(3))
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    copies = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t)
    del host, device
    gc.collect()
    torch.cuda.empty_cache()
    return min(copies), read, read_parallel


def peak_rss_child(name: str, path: Path) -> dict:
    """Host RSS of a fresh process before and at its peak during materialize(device="cuda")."""
    code = f"""
import json, torch, zoo
def status(key):
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) * 1024
torch.empty(1, device='cuda')  # the CUDA context is not what this measures
m = zoo.get('timm/{name}')
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # reset the peak (VmHWM)
before = status('VmRSS')
m.materialize(device='cuda', weights={str(path)!r})
torch.cuda.synchronize()
print(json.dumps({{'before': before, 'peak': status('VmHWM')}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sweep(name: str) -> list[dict]:
    """materialize(device="cuda") for each (reader threads, buffer size), best of 3: the stream's defaults
    are module constants read at each call, set here for the sweep and restored after it."""
    import zoo
    from zoo.weights import stream

    path = make_file(name)
    warm(path)
    nbytes = path.stat().st_size
    defaults = stream.MAX_READERS, stream.BUFFER_BYTES
    rows = []
    try:
        for readers in (4, 8, 12, 16):
            for mib in (16, 32, 64):
                stream.MAX_READERS, stream.BUFFER_BYTES = readers, mib << 20
                zoo.get(f"timm/{name}").materialize(device="cuda", weights=str(path))  # a ring of this size
                best = min(
                    timed(lambda: zoo.get(f"timm/{name}").materialize(device="cuda", weights=str(path)))
                    for _ in range(3)
                )
                rows.append({"readers": readers, "buffer_mib": mib, "s": best, "gb_s": nbytes / best / 1e9})
                print(
                    f"  sweep: {readers:2d} readers, {mib:2d} MiB buffers  {best:.3f} s  "
                    f"{nbytes / best / 1e9:6.2f} GB/s",
                    flush=True,
                )
    finally:
        stream.MAX_READERS, stream.BUFFER_BYTES = defaults
    return rows


def bench(name: str) -> dict:
    import timm
    import torch
    from safetensors.torch import load_file

    import zoo

    path = make_file(name)
    nbytes = path.stat().st_size
    warm(path)
    copy_limit, read_one_thread, read_parallel = limits(path)
    zoo.get(f"timm/{name}")  # the registry lookup and template build happen once per process
    runs = []
    for _ in range(3):
        meta = zoo.get(f"timm/{name}")
        runs.append(timed(lambda m=meta: m.materialize(device="cuda", weights=str(path))))
        del meta
    zoo_total = timed(lambda: zoo.get(f"timm/{name}").materialize(device="cuda", weights=str(path)))
    timm_path = timed(
        lambda: timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)}).cuda()
    )

    def on_device():
        with torch.device("cuda"):
            m = timm.create_model(name)
        m.load_state_dict(load_file(str(path)))
        return m

    on_device_s = timed(on_device)

    def on_device_gpu_file():
        with torch.device("cuda"):
            m = timm.create_model(name)
        m.load_state_dict(load_file(str(path), device="cuda"))
        return m

    on_device_gpu_file_s = timed(on_device_gpu_file)
    ours = zoo.get(f"timm/{name}").materialize(device="cuda", weights=str(path))
    plain = on_device()
    theirs = plain.state_dict()
    equal = all(torch.equal(v, theirs[k]) for k, v in ours.state_dict().items())
    del ours, plain, theirs
    gc.collect()
    torch.cuda.empty_cache()
    rss = peak_rss_child(name, path)
    best = min(runs)
    return {
        "model": name,
        "bytes": nbytes,
        "device": torch.cuda.get_device_name(),
        "zoo_materialize_s": best,
        "zoo_first_call_s": runs[0],
        "zoo_get_materialize_s": zoo_total,
        "zoo_gb_s": nbytes / best / 1e9,
        "copy_limit_gb_s": nbytes / copy_limit / 1e9,
        "fraction_of_limit": copy_limit / best,
        "read_one_thread_gb_s": nbytes / read_one_thread / 1e9,
        "read_parallel_gb_s": nbytes / read_parallel / 1e9,
        "fraction_of_parallel_read": read_parallel / best,
        "timm_pretrained_cuda_s": timm_path,
        "speedup_vs_timm": timm_path / zoo_total,
        "on_device_load_state_dict_s": on_device_s,
        "speedup_vs_on_device": on_device_s / zoo_total,
        "on_device_load_file_cuda_s": on_device_gpu_file_s,
        "speedup_vs_load_file_cuda": on_device_gpu_file_s / zoo_total,
        "rss_before": rss["before"],
        "rss_peak": rss["peak"],
        "rss_over_before_gb": (rss["peak"] - rss["before"]) / 1e9,
        "bitwise_equal": equal,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="convnext_xxlarge")
    p.add_argument("--json", action="store_true")
    p.add_argument("--sweep", action="store_true", help="first time reader threads x buffer sizes")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench/materialize_cuda.py needs a CUDA GPU: torch.cuda.is_available() is False here", file=sys.stderr)
        sys.exit(2)
    swept = sweep(args.model) if args.sweep else None
    r = bench(args.model)
    if swept:
        r["sweep"] = swept
    if args.json:
        print(json.dumps(r, indent=1))
        return

    def ok(good: bool) -> str:
        return "ok" if good else "MISSED"

    print(f"{r['model']} ({r['bytes'] / 1e9:.2f} GB) on {r['device']}, file in the page cache")
    print(
        f"  zoo materialize(cuda)            {r['zoo_materialize_s']:7.3f} s  {r['zoo_gb_s']:6.2f} GB/s  "
        f"(first call {r['zoo_first_call_s']:.3f} s)"
    )
    print(
        f"  pinned buffer -> device (limit)  {r['bytes'] / r['copy_limit_gb_s'] / 1e9:7.3f} s  "
        f"{r['copy_limit_gb_s']:6.2f} GB/s  zoo at {100 * r['fraction_of_limit']:.0f}% "
        f"(target >= 80%: {ok(r['fraction_of_limit'] >= 0.8)})"
    )
    print(
        f"  file -> pinned, one thread       {r['bytes'] / r['read_one_thread_gb_s'] / 1e9:7.3f} s  "
        f"{r['read_one_thread_gb_s']:6.2f} GB/s  (for scale)"
    )
    print(
        f"  file -> pinned, stream's threads {r['bytes'] / r['read_parallel_gb_s'] / 1e9:7.3f} s  "
        f"{r['read_parallel_gb_s']:6.2f} GB/s  zoo at {100 * r['fraction_of_parallel_read']:.0f}%"
        " (the host side's limit)"
    )
    print(f"  zoo get + materialize(cuda)      {r['zoo_get_materialize_s']:7.3f} s")
    print(
        f"  timm pretrained=True + .cuda()   {r['timm_pretrained_cuda_s']:7.3f} s  zoo {r['speedup_vs_timm']:.1f}x "
        f"faster (target >= 5x: {ok(r['speedup_vs_timm'] >= 5)})"
    )
    print(
        f"  on device + load_state_dict      {r['on_device_load_state_dict_s']:7.3f} s  zoo "
        f"{r['speedup_vs_on_device']:.1f}x faster (target >= 5x: {ok(r['speedup_vs_on_device'] >= 5)})"
    )
    print(
        f"  on device + load_file(cuda)      {r['on_device_load_file_cuda_s']:7.3f} s  zoo "
        f"{r['speedup_vs_load_file_cuda']:.1f}x faster (for scale)"
    )
    print(
        f"  peak host RSS over before        {r['rss_over_before_gb']:.2f} GB "
        f"(target < 1 GB: {ok(r['rss_over_before_gb'] < 1)})"
    )
    print(f"  bitwise equal to the plain load  {r['bitwise_equal']}")


if __name__ == "__main__":
    main()
