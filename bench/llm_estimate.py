"""Language models: zoo.estimate of Llama-3.1-405B at batch 8 and 8k tokens, and indexing the shipped hf
catalog with analysis.

1. In a fresh subprocess (clean RSS): `zoo.estimate("hf/meta-llama/Llama-3.1-405B", batch=8,
   seq_len=8192, dtype="bf16", kv_dtype="fp8")` against a registry indexed beforehand: seconds for the
   imports, for the estimate call (meta build + meta prefill), and the process's peak RSS (VmHWM).
   Another fresh subprocess times `zoo.get` of the 405B on meta alone.
   Beside it, the plain arithmetic a sizing sheet does (parameters x 2 bytes, and the KV formula
   layers x kv heads x head dim x 2 x 1 byte x tokens), which zoo's measured terms must meet.
2. Every catalog/hf config indexed into a fresh registry in this process (build on meta, inspect, the LLM
   fields, two meta forwards at 128 tokens): seconds per model, median, p90 and the slowest, and each
   row's scan status.

Run: .venv/bin/python bench/llm_estimate.py [--skip-index] [--json]
Targets: estimate < 5 s and peak RSS < 1 GB.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CATALOG = ROOT / "catalog" / "hf"
NAME = "hf/meta-llama/Llama-3.1-405B"

_CHILD = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
import zoo
import torch, transformers  # what the estimate imports anyway, timed apart from it, with the llama
import transformers.models.llama.modeling_llama  # modules transformers imports lazily (torchvision too: ~3 s)
t1 = time.perf_counter()
rss_after_imports = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
if sys.argv[3] == "get":
    zoo.connect(sys.argv[1]).get(sys.argv[2])
    e = {}
else:
    e = zoo.connect(sys.argv[1]).estimate(sys.argv[2], batch=8, seq_len=8192, dtype="bf16", kv_dtype="fp8").as_dict()
t2 = time.perf_counter()
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"import_s": t1 - t0, "call_s": t2 - t1, "peak_rss_bytes": hwm * 1024,
                  "import_rss_bytes": rss_after_imports * 1024, **e}))
"""


def _child(url: str, call: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, url, NAME, call],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def estimate_405b(url: str) -> dict:
    got = _child(url, "get")
    result = _child(url, "estimate")
    result.update(get_s=got["call_s"], get_peak_rss_bytes=got["peak_rss_bytes"], estimate_s=result.pop("call_s"))
    config = json.loads((CATALOG / "meta-llama__Llama-3.1-405B.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    tokens = 8 * 8192
    result["plain_kv_bytes"] = config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 2 * 1 * tokens
    result["plain_weight_bytes"] = json.loads((CATALOG / "published.json").read_text())[NAME]["params"] * 2
    return result


def index_catalog(url: str) -> dict:
    import zoo

    files = sorted(str(p) for p in CATALOG.glob("*__*.json"))
    registry = zoo.connect(url)
    times, last = {}, [time.perf_counter()]

    def progress(name, done, total):
        now = time.perf_counter()
        times[name] = now - last[0]
        last[0] = now

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        outcome = registry.index("hf", files, force=True, progress=progress)
        total = time.perf_counter() - start
    rows = registry.search("family=hf", fields=("name", "scan_status", "scan_error"))
    seconds = sorted(times.values())
    return {
        "models": len(files),
        "total_s": total,
        "median_s": statistics.median(seconds),
        "p90_s": seconds[int(0.9 * (len(seconds) - 1))],
        "slowest": sorted(times.items(), key=lambda kv: -kv[1])[:5],
        "failed": outcome.failed,
        "scan_status": {r["name"]: r["scan_status"] for r in rows},
        "scan_errors": {r["name"]: r["scan_error"] for r in rows if r["scan_status"] != "ok"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-index", action="store_true", help="only the 405B estimate")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        import zoo

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zoo.connect(url).index("hf", [str(CATALOG / "meta-llama__Llama-3.1-405B.json")])
        est = estimate_405b(url)
        catalog = None if args.skip_index else index_catalog(url)
    if args.json:
        print(json.dumps({"estimate_405b": est, "index_catalog": catalog}, indent=1))
        return
    gib = 2**30
    print(f"zoo.estimate({NAME}, batch=8, seq_len=8192, bf16, kv fp8), fresh process:")
    print(
        f"  zoo.get on meta alone (another fresh process): {est['get_s']:.2f} s (target 1 s), "
        f"peak RSS {est['get_peak_rss_bytes'] / gib:.2f} GiB"
    )
    print(
        f"  imports {est['import_s']:.2f} s; estimate call {est['estimate_s']:.2f} s (target < 5 s); "
        f"peak RSS {est['peak_rss_bytes'] / gib:.2f} GiB (target < 1 GB), "
        f"{(est['peak_rss_bytes'] - est['import_rss_bytes']) / gib:.2f} GiB above the imports' "
        f"{est['import_rss_bytes'] / gib:.2f} GiB (torch alone maps about 0.7 GiB here)"
    )
    print(
        f"  weights {est['weights'] / gib:.1f} GiB (plain params x 2: {est['plain_weight_bytes'] / gib:.1f}); "
        f"KV cache {est['kv_cache'] / gib:.2f} GiB (plain formula: {est['plain_kv_bytes'] / gib:.2f}); "
        f"activations {est['activations'] / gib:.2f} GiB; peak {est['total'] / gib:.1f} GiB"
    )
    if catalog:
        ok = sum(s == "ok" for s in catalog["scan_status"].values())
        print(
            f"index catalog/hf with analysis: {catalog['models']} models in {catalog['total_s']:.1f} s; "
            f"per model median {catalog['median_s']:.2f} s, p90 {catalog['p90_s']:.2f} s; "
            f"analysis ok {ok}/{len(catalog['scan_status'])}; failed builds {len(catalog['failed'])}"
        )
        print("  slowest: " + ", ".join(f"{n} {s:.1f} s" for n, s in catalog["slowest"]))
        for name, error in catalog["scan_errors"].items():
            print(f"  {name}: {error}")


if __name__ == "__main__":
    main()
