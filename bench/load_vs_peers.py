"""zoo's load against transformers, accelerate, DCP and timm, each in a fresh process, side by side.

Checkpoints (random values; made under $ZOO_BENCH_DIR, default /tmp/zoo_bench, deleted after the run
unless --keep): a 1.1 B Llama (TinyLlama-1.1B's shape) saved by save_pretrained in 500 MB shards, in
bf16 and in fp32; and timm's vit_large_patch16_224 (1.22 GB fp32) as one safetensors file.

Loads, every one in a fresh process with the page cache warm, in alternating order, --rounds rounds:
  zoo            zoo.get + materialize (CPU default: same-dtype tensors are views of the mapped file, all of
                 the Llama's as from_pretrained's, ViT-L's where 64-byte aligned; the rest copied)
  zoo copy=True  the same into owned memory
  transformers   AutoModelForCausalLM.from_pretrained(DIR, dtype=...)
  accelerate     init_empty_weights + load_checkpoint_and_dispatch(device_map={"": "cpu"}, dtype=...)
  dcp            DCP's HuggingFaceStorageReader into the meta-built model after to_empty
  timm           timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=FILE)) (ViT-L)
  floor          preadv of the files into private memory (same dtype), or mmap + cast per tensor (fp32 -> bf16)
Each loader's process imports torch and the model's library (transformers, timm) before the clock, and the
loader's own modules (zoo, accelerate, DCP) inside it: DCP's import pulls torch._dynamo, which building the
Llama imports too (through transformers' config, which imports torchvision), so imported before the clock it
hid a second of the build from DCP's column. (The floor imports torch and safetensors only.)
Columns (medians): load s (the loading call, model built included; zoo's materialize alone is its `read`
in --json and the copy=True line), touched s (load plus reading every
page of every tensor once), process s (interpreter start to exit), peak RSS over the model's bytes.
Every tensor of every loader is compared bitwise (a digest per tensor, first round).

    .venv/bin/python bench/load_vs_peers.py [--rounds 5] [--cases bf16 fp32 vit] [--keep] [--json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("ZOO_BENCH_DIR", "/tmp/zoo_bench")) / "peers"
LLAMA = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
VIT = "vit_large_patch16_224"

# Each loader is the body of a fresh process: it defines `load()` returning the module (or a dict of
# tensors for the floor). The header measures around it; {dir}, {dtype}, {url} are filled in.
HEADER = """
import json, os, sys, time, hashlib
def status(key):
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) * 1024
"""
MEASURE = """
with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # reset VmHWM: the peak from here on
before = status('VmRSS')
t = time.perf_counter()
out = load()
load_s = time.perf_counter() - t
tensors = out if isinstance(out, dict) else out.state_dict()
for v in tensors.values():  # one read per page
    flat = v.detach().reshape(-1).view(torch.uint8) if v.numel() else None
    if flat is not None:
        flat[::4096].sum()
touched_s = time.perf_counter() - t
peak = status('VmHWM')
digest = {{k: hashlib.blake2b(v.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()
          for k, v in sorted(tensors.items())}} if {digest} else None
print(json.dumps(dict(load=load_s, read=globals().get("read_s", load_s), touched=touched_s, rss=peak - before,
                 digest=digest)))
"""

LOADERS = {
    "zoo": """
import torch, {library}  # the library the model needs, imported before the clock; each loader's own inside
def load():
    global read_s
    import zoo
    model = zoo.connect({url!r}).get({name!r})
    t = time.perf_counter()
    model.materialize(weights={path!r}, dtype={dtype})
    read_s = time.perf_counter() - t
    return model
""",
    "zoo copy=True": """
import torch, {library}
def load():
    global read_s
    import zoo
    model = zoo.connect({url!r}).get({name!r})
    t = time.perf_counter()
    model.materialize(weights={path!r}, dtype={dtype}, copy=True)
    read_s = time.perf_counter() - t
    return model
""",
    "transformers": """
import torch, transformers
def load():
    return transformers.AutoModelForCausalLM.from_pretrained({path!r}, dtype={dtype})
""",
    "accelerate": """
import torch, transformers
def load():
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    config = transformers.AutoConfig.from_pretrained({path!r})
    with init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype={dtype})
    return load_checkpoint_and_dispatch(model, {path!r}, device_map={{"": "cpu"}}, dtype={dtype})
""",
    "dcp": """
import torch, transformers
def load():
    import torch.distributed.checkpoint as dcp  # it imports torch._dynamo, which the model's build needs too
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    config = transformers.AutoConfig.from_pretrained({path!r})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype={dtype})
    model.to_empty(device="cpu")
    state = model.state_dict()
    dcp.load(state, storage_reader=HuggingFaceStorageReader({path!r}), no_dist=True)
    return model
""",
    "timm": """
import torch, timm
def load():
    return timm.create_model({vit!r}, pretrained=True, pretrained_cfg_overlay=dict(file={path!r}))
""",
    "floor": """
import torch, mmap
from safetensors import safe_open
from pathlib import Path
def load():
    files = sorted(Path({path!r}).glob("*.safetensors")) if Path({path!r}).is_dir() else [Path({path!r})]
    out = {{}}
    for file in files:
        with safe_open(str(file), "pt") as f:
            keys = list(f.keys())
        header = json.loads(open(file, "rb").read(8 + int.from_bytes(open(file, "rb").read(8), "little"))[8:])
        base = 8 + int.from_bytes(open(file, "rb").read(8), "little")
        fd = os.open(file, os.O_RDONLY)
        if {dtype} is None or all(
            getattr(torch, {{"F32": "float32", "BF16": "bfloat16", "F16": "float16"}}.get(header[k]["dtype"], "int64"))
            == {dtype}
            for k in keys
        ):
            size = os.fstat(fd).st_size - base
            buf = torch.empty(size, dtype=torch.uint8)  # private anonymous memory
            view, done = memoryview(buf.numpy()), 0
            while done < size:
                done += os.preadv(fd, [view[done:]], base + done)
            for k in keys:
                s, e = header[k]["data_offsets"]
                dt = {{"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}}[
                    header[k]["dtype"]
                ]
                out[k] = buf[s:e].view(dt).view(header[k]["shape"])
        else:
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
            for k in keys:
                s, e = header[k]["data_offsets"]
                dt = {{"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}}[
                    header[k]["dtype"]
                ]
                src = torch.frombuffer(mapped, dtype=dt, count=(e - s) // dt.itemsize, offset=base + s).view(
                    header[k]["shape"]
                )
                out[k] = src.to({dtype}) if dt.is_floating_point else src.clone()
        os.close(fd)
    return out
""",
}

CASES = {  # case -> (checkpoint, dtype, loaders)
    "bf16": ("llama-bf16", "torch.bfloat16", ["zoo", "zoo copy=True", "transformers", "accelerate", "dcp", "floor"]),
    "fp32": ("llama-fp32", "torch.bfloat16", ["zoo", "transformers", "accelerate", "dcp", "floor"]),
    "vit": (f"{VIT}.safetensors", "None", ["zoo", "zoo copy=True", "timm", "floor"]),
}


def make_checkpoints(cases) -> dict:
    """The checkpoints the cases need (made once), and the registry zoo loads the Llama through."""
    import torch
    import transformers

    WORK.mkdir(parents=True, exist_ok=True)
    for case in cases:
        target = WORK / CASES[case][0]
        if target.exists():
            continue
        print(f"making {target} ...", file=sys.stderr, flush=True)  # stdout: the table or --json
        if case == "vit":
            from safetensors.torch import save_file

            import zoo

            model = zoo.get(f"timm/{VIT}")
            g = torch.Generator().manual_seed(0)
            save_file(
                {
                    k: torch.randn(v.shape, generator=g)
                    if v.is_floating_point()
                    else torch.zeros(v.shape, dtype=v.dtype)
                    for k, v in model.state_dict().items()
                },
                str(target),
            )
            continue
        dtype = torch.bfloat16 if case == "bf16" else torch.float32
        config = transformers.LlamaConfig(**LLAMA)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.to_empty(device="cpu")
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        model.save_pretrained(target, max_shard_size="500MB")
        del model
    url = f"sqlite:///{WORK / 'peers.db'}"
    if not (WORK / "peers.db").exists() and {"bf16", "fp32"} & set(cases):
        import zoo

        zoo.connect(url).index(
            "hf", [str(WORK / CASES["bf16" if "bf16" in cases else "fp32"][0])], name="hf/bench/llama-1.1b"
        )
    return {"url": url}


def run_one(loader: str, case: str, registry: dict, digest: bool) -> dict:
    checkpoint, dtype, _ = CASES[case]
    path = str(WORK / checkpoint)
    name = f"timm/{VIT}" if case == "vit" else "hf/bench/llama-1.1b"
    url = None if case == "vit" else registry["url"]
    library = "timm" if case == "vit" else "transformers"  # importing timm too cost a Llama's process 0.6 s at exit
    body = LOADERS[loader].format(url=url, name=name, path=path, dtype=dtype, vit=VIT, library=library)
    code = HEADER + body + MEASURE.format(digest=digest)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    if url is None:
        env.pop("ZOO_REGISTRY", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    process_s = time.perf_counter() - start
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process"] = process_s
    return out


def mapped_share(case: str) -> float:
    """The share of the checkpoint's bytes zoo's default load maps: none in a cast; every tensor of the
    transformers Llama, as from_pretrained maps them; those of timm's ViT held 64-byte aligned (it copies the
    rest, as PyTorch's kernels round by alignment)."""
    if case == "fp32":
        return 0.0
    alignment = 1 if case == "bf16" else 64
    target = WORK / CASES[case][0]
    aligned = total = 0
    for file in sorted(target.glob("*.safetensors")) if target.is_dir() else [target]:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for key, spec in header.items():
            if key != "__metadata__":
                start, stop = spec["data_offsets"]
                total += stop - start
                aligned += (stop - start) * ((8 + size + start) % alignment == 0)
    return aligned / total


def warm(case: str) -> int:
    target = WORK / CASES[case][0]
    files = sorted(target.glob("*.safetensors")) if target.is_dir() else [target]
    for file in files:
        with open(file, "rb") as f:
            while f.read(64 << 20):
                pass
    return sum(f.stat().st_size for f in files)


def bench(cases, rounds: int) -> dict:
    registry = make_checkpoints(cases)
    results = {}
    for case in cases:
        file_bytes = warm(case)
        loaders = CASES[case][2]
        runs = {loader: [] for loader in loaders}
        digests = {}
        for r in range(rounds):
            order = loaders if r % 2 == 0 else loaders[::-1]
            for loader in order:
                out = run_one(loader, case, registry, digest=r == 0)
                if "error" in out:
                    runs[loader].append(out)
                    continue
                if out.get("digest"):
                    digests[loader] = out.pop("digest")
                runs[loader].append(out)
        reference = digests.get("transformers") or digests.get("timm") or digests.get("zoo copy=True")
        model_bytes = file_bytes // 2 if case == "fp32" else file_bytes
        rows = {}
        for loader, outs in runs.items():
            good = [o for o in outs if "error" not in o]
            if not good:
                rows[loader] = {"error": outs[0]["error"]}
                continue
            mine = digests.get(loader, {})
            common = sorted(set(mine) & set(reference or {}))
            rows[loader] = {
                key: statistics.median(o[key] for o in good) for key in ("load", "read", "touched", "process")
            }
            rows[loader]["rss_over_model"] = statistics.median(o["rss"] for o in good) / model_bytes
            rows[loader]["bitwise"] = (
                f"{sum(mine[k] == reference[k] for k in common)}/{len(common)} equal" if reference and common else "-"
            )
        results[case] = {"model_bytes": model_bytes, "mapped_share": mapped_share(case), "rows": rows}
    return results


def print_table(results: dict) -> None:
    titles = {
        "bf16": "1.1B Llama, bf16 file -> bf16",
        "fp32": "1.1B Llama, fp32 file -> bf16",
        "vit": f"{VIT}, fp32 file -> fp32",
    }
    for case, result in results.items():
        print(
            f"\n{titles[case]} ({result['model_bytes'] / 1e9:.2f} GB in memory; "
            f"{100 * result['mapped_share']:.0f}% of the file's bytes mapped by zoo's default load)"
        )
        print(f"  {'loader':<14} {'load s':>7} {'touched s':>9} {'process s':>9} {'RSS/model':>9}  tensors")
        for loader, row in result["rows"].items():
            if "error" in row:
                print(f"  {loader:<14} error: {row['error']}")
                continue
            print(
                f"  {loader:<14} {row['load']:7.2f} {row['touched']:9.2f} {row['process']:9.2f} "
                f"{row['rss_over_model']:9.2f}  {row['bitwise']}"
            )
        rows = result["rows"]
        zoo = rows.get("zoo", {})
        for peer in ("transformers", "dcp", "timm"):
            if peer in rows and "load" in rows[peer] and "load" in zoo:
                print(
                    f"  zoo / {peer}: load {zoo['load'] / rows[peer]['load']:.2f}, touched "
                    f"{zoo['touched'] / rows[peer]['touched']:.2f} (<= 1 is zoo at least as fast)"
                )
        copied = rows.get("zoo copy=True", {})
        if "floor" in rows and "read" in copied:  # the read alone: the meta build is in `load s` above
            print(
                f"  zoo copy=True: materialize {copied['read']:.2f} s,"
                f" at {100 * rows['floor']['load'] / copied['read']:.0f}%"
                " of the floor's read into fresh memory (bench/load_memory.py compares it with touched memory)"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--keep", action="store_true", help="keep the checkpoints for the next run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    try:
        results = bench(args.cases, args.rounds)
    finally:
        if not args.keep:
            shutil.rmtree(WORK, ignore_errors=True)
    print(json.dumps(results, indent=1) if args.json else "", end="")
    if not args.json:
        print_table(results)


if __name__ == "__main__":
    main()
