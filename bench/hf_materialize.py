"""Hugging Face models: zoo.get + materialize against AutoModelForCausalLM.from_pretrained, and zoo.get at 405B.

One run prints:
  - a random ~1.1B-parameter Llama-style model (TinyLlama's shape, bf16), saved once with
    save_pretrained as sharded safetensors under $ZOO_BENCH_DIR (default /tmp/zoo_bench), files in
    the page cache: wall time of
      zoo.get(name).materialize(weights=DIR)            (copies into its own memory),
      zoo.get(name).materialize(weights=DIR, copy=False) (views of the mapped files), and
      AutoModelForCausalLM.from_pretrained(DIR),
    each in a fresh process with torch and transformers' llama modules already imported, and the
    process's peak RSS growth (VmHWM) over the model's bytes once every parameter has been read
    (what a first forward does: mapped file pages count only when touched);
  - zoo.get("hf/meta-llama/Llama-3.1-405B") in a fresh process (template build, then a cached get),
    beside transformers' own meta build (`with torch.device("meta"): from_config`). Target: under 1 s.

    .venv/bin/python bench/hf_materialize.py [--json]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("ZOO_BENCH_DIR", "/tmp/zoo_bench"))
MODEL_DIR = WORK / "hf-llama-1b"
REGISTRY = WORK / "hf.db"
NAME = "hf/bench/llama-1b"
BIG = "hf/meta-llama/Llama-3.1-405B"
# TinyLlama-1.1B's shape: GQA, SwiGLU, untied head.
CONFIG = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    dtype="bfloat16",
)


def make_model() -> int:
    """The random model saved sharded (once, in a child process); returns its safetensors bytes."""
    if not (MODEL_DIR / "model.safetensors.index.json").exists():
        code = (
            "import sys, json, torch\n"
            "from transformers import AutoModelForCausalLM, LlamaConfig\n"
            "torch.manual_seed(0)\n"
            "model = AutoModelForCausalLM.from_config(LlamaConfig(**json.loads(sys.argv[1])))\n"
            "model.save_pretrained(sys.argv[2], max_shard_size='500MB')\n"
        )
        subprocess.run([sys.executable, "-c", code, json.dumps(CONFIG), str(MODEL_DIR)], check=True, cwd=ROOT)
    return sum(p.stat().st_size for p in MODEL_DIR.glob("*.safetensors"))


def index() -> None:
    import zoo

    registry = zoo.connect(f"sqlite:///{REGISTRY}")
    for source, name in ((str(MODEL_DIR), NAME), (str(ROOT / "catalog/hf/meta-llama__Llama-3.1-405B.json"), BIG)):
        outcome = registry.index("hf", [source], name=name)
        if outcome.failed:
            raise RuntimeError(outcome.failed)


def warm(path: Path) -> None:
    for file in path.glob("*.safetensors"):
        with open(file, "rb") as f:
            while f.read(64 << 20):
                pass


CHILD = """
import json, sys, time
import torch, transformers, zoo
from transformers import AutoModelForCausalLM
import transformers.models.llama.modeling_llama  # the modeling module: imported by both, not timed
def status(field):  # VmHWM: this process's peak RSS, reset at exec (ru_maxrss would be the parent's)
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith(field)).split()[1]) * 1024
mode, registry, name, path = sys.argv[1:5]
z = zoo.connect(registry)
before = status('VmRSS')
t = time.perf_counter()
if mode == 'zoo':
    m = z.get(name).materialize(device='cpu', weights=path)
elif mode == 'zoo-nocopy':
    m = z.get(name).materialize(device='cpu', weights=path, copy=False)
elif mode == 'hf':
    m = AutoModelForCausalLM.from_pretrained(path)
elif mode == 'get':
    m = z.get(name)
    first = time.perf_counter() - t
    t = time.perf_counter()
    m2 = z.get(name)
elif mode == 'meta':
    config = transformers.AutoConfig.from_pretrained(path)
    t = time.perf_counter()
    with torch.device('meta'):
        m = AutoModelForCausalLM.from_config(config)
elapsed = time.perf_counter() - t
if mode in ('zoo', 'zoo-nocopy', 'hf'):
    with torch.no_grad():
        for p in m.parameters():
            p.sum()
out = {'s': elapsed, 'peak_over_start': status('VmHWM') - before, 'params': sum(p.numel() for p in m.parameters())}
if mode == 'get':
    out['first_s'], out['cached_s'] = first, elapsed
print(json.dumps(out))
"""


def child(mode: str, path: str, name: str = NAME) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(REGISTRY), name, path], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    nbytes = make_model()
    index()
    warm(MODEL_DIR)
    zoo_run, view_run, hf_run = (child(mode, str(MODEL_DIR)) for mode in ("zoo", "zoo-nocopy", "hf"))
    big_dir = WORK / "llama-405b-config"
    big_dir.mkdir(exist_ok=True)
    (big_dir / "config.json").write_text((ROOT / "catalog/hf/meta-llama__Llama-3.1-405B.json").read_text())
    get_run, meta_run = child("get", "", BIG), child("meta", str(big_dir))
    result = {
        "model_bytes": nbytes,
        "params": zoo_run["params"],
        "zoo_materialize_s": zoo_run["s"],
        "from_pretrained_s": hf_run["s"],
        "zoo_copy_false_s": view_run["s"],
        "speedup": hf_run["s"] / zoo_run["s"],
        "speedup_copy_false": hf_run["s"] / view_run["s"],
        "zoo_peak_over_bytes": zoo_run["peak_over_start"] / nbytes,
        "zoo_copy_false_peak_over_bytes": view_run["peak_over_start"] / nbytes,
        "from_pretrained_peak_over_bytes": hf_run["peak_over_start"] / nbytes,
        "peak_ratio": zoo_run["peak_over_start"] / hf_run["peak_over_start"],
        "peak_ratio_copy_false": view_run["peak_over_start"] / hf_run["peak_over_start"],
        "get_405b_first_s": get_run["first_s"],
        "get_405b_cached_s": get_run["cached_s"],
        "get_405b_peak_over_start_bytes": get_run["peak_over_start"],
        "params_405b": get_run["params"],
        "transformers_meta_405b_s": meta_run["s"],
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    r = result
    print(
        f"random Llama-style model: {r['params'] / 1e9:.2f}B params, {nbytes / 1e9:.2f} GB bf16, "
        f"{len(list(MODEL_DIR.glob('*.safetensors')))} shards, page cache warm"
    )
    rows = [
        ("zoo.get + materialize", r["zoo_materialize_s"], r["zoo_peak_over_bytes"]),
        ("zoo.get + materialize(copy=False)", r["zoo_copy_false_s"], r["zoo_copy_false_peak_over_bytes"]),
        ("AutoModelForCausalLM.from_pretrained", r["from_pretrained_s"], r["from_pretrained_peak_over_bytes"]),
    ]
    for label, seconds, peak in rows:
        print(f"  {label:38s} {seconds:6.2f} s   peak RSS growth {peak:.2f}x bytes")
    print(
        f"  time from_pretrained/zoo: {r['speedup']:.2f}x (copy=False {r['speedup_copy_false']:.2f}x); "
        f"peak zoo/from_pretrained: {r['peak_ratio']:.2f} (copy=False {r['peak_ratio_copy_false']:.2f})"
    )
    print(f"Llama-3.1-405B on meta ({r['params_405b']:,} params)")
    print(
        f"  {'zoo.get, template build':38s} {r['get_405b_first_s']:6.3f} s (target < 1 s); cached get "
        f"{r['get_405b_cached_s']:.3f} s; peak RSS growth {r['get_405b_peak_over_start_bytes'] / 2**20:.0f} MiB"
    )
    print(f"  {'transformers from_config on meta':38s} {r['transformers_meta_405b_s']:6.3f} s")


if __name__ == "__main__":
    main()
