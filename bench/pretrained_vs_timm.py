"""Load published weights by name: zoo.get(tag, weights="pretrained") against timm.create_model(tag, pretrained=True).

Both read the same file from the same warm Hugging Face hub cache (a tmp HF_HOME, HF_HUB_OFFLINE=1),
holding seeded stand-in weights in the exact layout the hub cache has (blobs/<sha256>, a snapshot
symlink, refs/main). Each measure runs in a fresh process (imports done first, then the peak RSS reset),
so the RSS of one is not the other's. zoo's time includes its registry lookup, meta build and the
sha256 check of the blob where it runs: zoo hashes a cached file once and remembers the check by
the file's state ($ZOO_CACHE), so the bench shows a process that hashes it and a later one that does not.
Targets: zoo >= 5x faster; zoo's peak RSS growth <= 1.15x the model's bytes.

    .venv/bin/python bench/pretrained_vs_timm.py [--tag TAG] [--json]
Files are made once under $ZOO_BENCH_DIR (default /tmp/zoo_bench).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("ZOO_BENCH_DIR", "/tmp/zoo_bench"))
DEFAULT_TAG = "vit_large_patch16_224.augreg_in21k_ft_in1k"  # 304M params, 1.2 GB fp32


def make_cache(tag: str) -> tuple[Path, int]:
    """HF_HOME with timm/TAG's model.safetensors (seeded random values from timm's own model), made once."""
    hf_home = WORK / "hf_home"
    repo = hf_home / "hub" / f"models--timm--{tag}"
    link = repo / "snapshots" / ("0" * 40) / "model.safetensors"
    if not link.exists():
        import timm
        import torch
        from safetensors.torch import save_file

        model = timm.create_model(tag, device="meta")
        g = torch.Generator().manual_seed(0)
        state = {
            k: torch.randn(v.shape, generator=g, dtype=v.dtype)
            if v.is_floating_point()
            else torch.zeros(v.shape, dtype=v.dtype)
            for k, v in model.state_dict().items()
        }
        tmp = WORK / "staged.safetensors"
        WORK.mkdir(parents=True, exist_ok=True)
        save_file(state, str(tmp))
        del state
        with open(tmp, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        os.replace(tmp, repo / "blobs" / sha)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / sha, link.parent))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("0" * 40)
    return hf_home, link.resolve().stat().st_size


def make_registry(tag: str) -> str:
    """A registry with the variant row, as the indexer writes it."""
    path = WORK / f"registry-{tag}.db"
    if not path.exists():
        from zoo.indexing import indexer
        from zoo.recipe import Recipe
        from zoo.registry import db

        url = f"sqlite:///{path}"
        db.open_registry(url, write=True, create=True)
        record, table = indexer.record_of(f"timm/{tag}", Recipe("timm", tag, {}), None)
        record.update(kind="variant", tag=tag.split(".", 1)[1], arch_name=f"timm/{tag.split('.')[0]}")
        indexer.save(url, record, table)
    return f"sqlite:///{path}"


CHILD = """
import gc, json, sys, time
mode, tag, url = sys.argv[1:4]
import torch, timm, zoo, safetensors.torch, huggingface_hub
def status(key):
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) * 1024
def load():
    if mode == 'zoo':
        return zoo.connect(url).get('timm/' + tag, weights='pretrained')
    return timm.create_model(tag, pretrained=True)
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # reset VmHWM: the peak of this call alone
before = status('VmRSS')
t = time.perf_counter()
m = load()
first = time.perf_counter() - t
peak = status('VmHWM')
del m
gc.collect()  # the first model's memory is freed before the second load, on both sides
t = time.perf_counter()
m = load()
second = time.perf_counter() - t
print(json.dumps({'first_s': first, 'second_s': second, 'before': before, 'peak': peak}))
"""


def child(mode: str, tag: str, url: str, hf_home: Path, zoo_cache: Path) -> dict:
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        "ZOO_CACHE": str(zoo_cache),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, tag, url], capture_output=True, text=True, cwd=ROOT, env=env
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(tag: str) -> dict:
    hf_home, nbytes = make_cache(tag)
    url = make_registry(tag)
    with open(next((hf_home / "hub" / f"models--timm--{tag}" / "blobs").iterdir()), "rb") as f:
        while f.read(64 << 20):  # warm: both read from the page cache
            pass
    import shutil
    import tempfile

    zoo_cache = Path(tempfile.mkdtemp(prefix="zoo_cache_"))  # empty: zoo hashes the file on its first load
    try:
        checking = child("zoo", tag, url, hf_home, zoo_cache)  # records the check in zoo_cache
        zoo_run = child("zoo", tag, url, hf_home, zoo_cache)  # a later process: the check is remembered
        timm_run = child("timm", tag, url, hf_home, zoo_cache)
    finally:
        shutil.rmtree(zoo_cache)
    return {
        "tag": tag,
        "bytes": nbytes,
        "zoo_hashing_s": checking["first_s"],
        "speedup_hashing": timm_run["first_s"] / checking["first_s"],
        "zoo_hashing_peak_over_bytes": (checking["peak"] - checking["before"]) / nbytes,
        "zoo_first_s": zoo_run["first_s"],
        "zoo_second_s": zoo_run["second_s"],
        "timm_first_s": timm_run["first_s"],
        "timm_second_s": timm_run["second_s"],
        "speedup_first": timm_run["first_s"] / zoo_run["first_s"],
        "speedup_second": timm_run["second_s"] / zoo_run["second_s"],
        "zoo_peak_over_bytes": (zoo_run["peak"] - zoo_run["before"]) / nbytes,
        "timm_peak_over_bytes": (timm_run["peak"] - timm_run["before"]) / nbytes,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", default=DEFAULT_TAG)
    p.add_argument("--json", action="store_true")
    r = bench(p.parse_args().tag)
    if p.parse_args().json:
        print(json.dumps(r, indent=1))
        return
    print(f"{r['tag']} ({r['bytes'] / 1e9:.2f} GB, warm hub cache)")
    print(
        f"  zoo, file's sha256 checked now     first {r['zoo_hashing_s']:6.2f} s   "
        f"({r['speedup_hashing']:.1f}x timm's first; peak RSS {r['zoo_hashing_peak_over_bytes']:.2f}x bytes)"
    )
    print(f"  zoo.get(weights='pretrained')      first {r['zoo_first_s']:6.2f} s   again {r['zoo_second_s']:6.2f} s")
    print(f"  timm.create_model(pretrained=True) first {r['timm_first_s']:6.2f} s   again {r['timm_second_s']:6.2f} s")
    print(
        f"  zoo faster by                      first {r['speedup_first']:5.1f}x    again {r['speedup_second']:5.1f}x "
        f"(target >= 5x)"
    )
    print(
        f"  peak RSS over bytes (first call)   zoo {r['zoo_peak_over_bytes']:.2f}x,"
        f" timm {r['timm_peak_over_bytes']:.2f}x "
        f"(target zoo <= 1.15x)"
    )


if __name__ == "__main__":
    main()
