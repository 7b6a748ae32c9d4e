"""Materialize from weights against timm's pretrained path and eager build + load_state_dict.

For each model (default: vit_large_patch16_224, 1.2 GB fp32, and convnext_xxlarge, 3.4 GB),
one run prints:
  - zoo.get + materialize(weights=FILE.safetensors), file in the page cache (by default views of a private
    mapping of the file where it holds a tensor 64-byte aligned, the rest copied; and with copy=True: each
    tensor allocated, then read into), against
      timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=FILE.safetensors)) and
      timm.create_model(name) + load_state_dict(torch.load(FILE.pth, mmap=True));
  - copy=True's throughput against the limit measured in the same run: the same file read into one freshly
    allocated buffer of the same size (target >= 85% of it);
  - the same against a read into a buffer whose pages are already touched (target >= 70% of it);
  - the storages of the loaded model, both ways: one per tensor, as the library's own model has, and the
    total of each tensor's untyped_storage().nbytes() (the model's bytes when no storage is shared);
  - peak RSS of a fresh process around the call, over the model's bytes (target for copy=True <= 1.05x);
  - materialize(weights=None) against eager construction.
Target: zoo >= 5x faster than timm's path.

    .venv/bin/python bench/materialize_vs_timm.py [--models NAME ...] [--json]
Weight files (random values) are made under $ZOO_BENCH_DIR (default /tmp/zoo_bench) and deleted
after the run unless --keep.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("ZOO_BENCH_DIR", "/tmp/zoo_bench"))


def make_files(name: str) -> tuple[Path, Path, int]:
    """FILE.safetensors and FILE.pth with the model's state dict (random values), made once."""
    import torch
    from safetensors.torch import save_file

    import zoo

    st, pth = WORK / f"{name}.safetensors", WORK / f"{name}.pth"
    if not (st.exists() and pth.exists()):
        WORK.mkdir(parents=True, exist_ok=True)
        table = zoo.info(f"timm/{name}", tensors=True).tensor_table
        state = {}
        for t in table:
            if t.persistent and t.tied_to is None:
                dtype = getattr(torch, t.dtype)
                state[t.name] = (
                    torch.randn(t.shape, dtype=dtype) if dtype.is_floating_point else torch.zeros(t.shape, dtype=dtype)
                )
        save_file(state, str(st))
        torch.save(state, pth)
        del state
    return st, pth, st.stat().st_size


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def read_limit(path: Path, touched: bool = False) -> float:
    """Seconds to read the file into one freshly allocated buffer of its size, or (touched) into one whose
    pages are already touched: no first-touch faults, the floor for a load into fresh memory."""
    import torch

    buf = (torch.ones if touched else torch.empty)(path.stat().st_size, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < len(view):
            done += f.readinto(view[done:])
    return time.perf_counter() - t


def storages(module) -> tuple[int, int, int]:
    """(distinct tensors, distinct storages, each tensor's untyped_storage().nbytes() summed) of a loaded module."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    distinct = {t.untyped_storage().data_ptr() for t in tensors.values()}
    return len(tensors), len(distinct), sum(t.untyped_storage().nbytes() for t in tensors.values())


def timed(fn) -> float:
    import gc

    gc.collect()
    t = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - t
    del out
    gc.collect()
    return elapsed


def peak_rss_child(name: str, st: Path) -> dict:
    """Peak RSS of a fresh process around zoo.get + materialize, and the same for eager + load_state_dict."""
    code = f"""
import json, zoo, torch, timm, sys
mode = sys.argv[1]
def status(key):
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) * 1024
m0 = zoo.get('timm/{name}') if mode.startswith('zoo') else None
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # reset the peak (VmHWM): ru_maxrss would carry the parent's peak from fork
before = status('VmRSS')
if mode.startswith('zoo'):
    m = m0.materialize(weights={str(st)!r}, copy=mode == 'zoo copy=True' or None)
else:
    from safetensors.torch import load_file
    m = timm.create_model('{name}')
    m.load_state_dict(load_file({str(st)!r}))
peak = status('VmHWM')
print(json.dumps({{'before': before, 'peak': peak}}))
"""
    out = {}
    for mode in ("zoo", "zoo copy=True", "eager"):
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, cwd=ROOT)
        if proc.returncode:
            raise RuntimeError(proc.stderr)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def bench(name: str) -> dict:
    import timm
    import torch

    import zoo

    st, pth, nbytes = make_files(name)
    zoo.get(f"timm/{name}")  # the registry lookup and template build are not what this measures
    for path in (st, pth):
        warm(path)
    limit = min(read_limit(st) for _ in range(2))
    touched = min(read_limit(st, touched=True) for _ in range(2))
    mapped = storages(zoo.get(f"timm/{name}").materialize(weights=str(st)))
    n_tensors, n_storages, storage_bytes = storages(zoo.get(f"timm/{name}").materialize(weights=str(st), copy=True))
    zoo_load = min(timed(lambda: zoo.get(f"timm/{name}").materialize(weights=str(st))) for _ in range(2))
    zoo_copy = min(timed(lambda: zoo.get(f"timm/{name}").materialize(weights=str(st), copy=True)) for _ in range(2))
    timm_path = timed(lambda: timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(st))))

    def eager_load():
        m = timm.create_model(name)
        m.load_state_dict(torch.load(pth, mmap=True, weights_only=True))
        return m

    eager = timed(eager_load)
    torch.manual_seed(0)
    zoo_init = timed(lambda: zoo.get(f"timm/{name}").materialize())
    torch.manual_seed(0)
    eager_init = timed(lambda: timm.create_model(name))
    rss = peak_rss_child(name, st)
    return {
        "model": name,
        "bytes": nbytes,
        "zoo_s": zoo_load,
        "timm_pretrained_s": timm_path,
        "eager_load_state_dict_s": eager,
        "speedup_vs_timm": timm_path / zoo_load,
        "speedup_vs_eager": eager / zoo_load,
        "zoo_gb_s": nbytes / zoo_load / 1e9,
        "zoo_copy_s": zoo_copy,
        "zoo_copy_gb_s": nbytes / zoo_copy / 1e9,
        "limit_gb_s": nbytes / limit / 1e9,
        "fraction_of_limit": limit / zoo_copy,
        "touched_gb_s": nbytes / touched / 1e9,
        "fraction_of_touched": touched / zoo_copy,
        "tensors": n_tensors,
        "storages": n_storages,
        "storage_bytes": storage_bytes,
        "mapped_storages": mapped[1],
        "mapped_storage_bytes": mapped[2],
        "zoo_peak_over_bytes": (rss["zoo"]["peak"] - rss["zoo"]["before"]) / nbytes,
        "zoo_copy_peak_over_bytes": (rss["zoo copy=True"]["peak"] - rss["zoo copy=True"]["before"]) / nbytes,
        "eager_peak_over_bytes": (rss["eager"]["peak"] - rss["eager"]["before"]) / nbytes,
        "zoo_init_s": zoo_init,
        "eager_init_s": eager_init,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["vit_large_patch16_224", "convnext_xxlarge"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the weight files for the next run")
    args = p.parse_args()
    try:
        rows = [bench(n) for n in args.models]
    finally:
        if not args.keep:  # the temp dir is shared: leave nothing behind
            for n in args.models:
                for suffix in (".safetensors", ".pth"):
                    (WORK / f"{n}{suffix}").unlink(missing_ok=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['model']} ({r['bytes'] / 1e9:.2f} GB)")
        print(
            f"  zoo get+materialize     {r['zoo_s']:7.2f} s   {r['zoo_gb_s']:.2f} GB/s (default: views where aligned)"
        )
        print(
            f"  the same, copy=True     {r['zoo_copy_s']:7.2f} s   {r['zoo_copy_gb_s']:.2f} GB/s (owned memory, read)"
        )
        print(
            f"  timm pretrained=True    {r['timm_pretrained_s']:7.2f} s   zoo {r['speedup_vs_timm']:.1f}x faster"
            " (target >= 5x)"
        )
        print(
            f"  eager + load_state_dict {r['eager_load_state_dict_s']:7.2f} s   zoo {r['speedup_vs_eager']:.1f}x faster"
        )
        print(
            f"  read into fresh buffer  {r['bytes'] / r['limit_gb_s'] / 1e9:7.2f} s   {r['limit_gb_s']:.2f} GB/s; "
            f"copy=True at {100 * r['fraction_of_limit']:.0f}% of it (target >= 85%)"
        )
        print(
            f"  read into touched pages {r['bytes'] / r['touched_gb_s'] / 1e9:7.2f} s   {r['touched_gb_s']:.2f} GB/s; "
            f"copy=True at {100 * r['fraction_of_touched']:.0f}% of it (target >= 70%)"
        )
        print(
            f"  storages                copy=True {r['storages']} for {r['tensors']} tensors, each tensor's "
            f"untyped_storage().nbytes() summed {r['storage_bytes'] / 1e9:.3f} GB"
            f" for a {r['bytes'] / 1e9:.3f} GB file; "
            f"zero-copy {r['mapped_storages']} storages, {r['mapped_storage_bytes'] / 1e9:.3f} GB"
        )
        print(
            f"  peak RSS over bytes     copy=True {r['zoo_copy_peak_over_bytes']:.2f}x (target <= 1.05x), zero-copy "
            f"{r['zoo_peak_over_bytes']:.2f}x, eager {r['eager_peak_over_bytes']:.2f}x"
        )
        print(f"  weights=None            zoo {r['zoo_init_s']:.2f} s, eager construction {r['eager_init_s']:.2f} s")


if __name__ == "__main__":
    main()
