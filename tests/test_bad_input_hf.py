"""Hostile config.json files and hub caches (issue 28, items 3-6): forced-meta builds that never allocate for
real, bounded configs, one bad input that fails alone while the run goes on, and hub-cache symlinks that lead
out of the cache refused. Memory is bounded with RLIMIT_AS in a child process, never measured by timing."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from zoo.errors import CheckpointError  # noqa: E402

GIB = 1 << 30
TINY_LLAMA = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                  max_position_embeddings=64)

# The child imports what a build needs and builds once (transformers loads its modules lazily), then holds its
# address space to what it has plus `extra` bytes: a real allocation past that fails at once, on any machine.
_HEAD = """
import re, resource, sys
import torch, transformers, zoo, zoo.indexer, zoo.meta
from zoo.families import hf
hf.build("AutoModelForCausalLM", {"config": %r})
vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + %d, vm + %d))
"""


def bounded(code: str, extra: int = GIB, timeout: int = 60, env=None) -> subprocess.CompletedProcess:
    """Run `code` in a child process with `extra` bytes of address space beyond its imports, for `timeout` s."""
    script = _HEAD % (TINY_LLAMA, extra, extra) + textwrap.dedent(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def index_hf_bounded(tmp_path: Path, sources: list[str], timeout: int = 60) -> tuple[subprocess.CompletedProcess, dict]:
    """`zoo index hf SOURCE... --json` in one bounded child: its exit code and the outcome it printed."""
    proc = bounded(f"""
        from zoo.cli import main
        sys.exit(main(["index", "hf", *{sources!r}, "--json", "-q"]))
        """, timeout=timeout, env={"ZOO_REGISTRY": str(tmp_path / "r.db")})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no outcome printed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")


def write_config(folder: Path, name: str, config) -> str:
    path = folder / f"{name}.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


# --- 3. forced meta checks a result's size before computing its shadow ----------------------------------------

def test_3_a_large_result_of_small_shadows_is_not_computed():
    """arange(2**20) has a shadow (it is at the limit); its product with ones(1024) would be 4 GiB of float32."""
    proc = bounded("""
        with zoo.meta.force_meta():
            x = torch.arange(2**20).float()[:, None] * torch.ones(1024)
            y = torch.arange(6).float()[:, None] * torch.ones(2)  # small: still shadowed
        assert x.is_meta and x.shape == (2**20, 1024) and zoo.meta.value_of(x) is None
        assert zoo.meta.value_of(y).tolist() == [[float(i)] * 2 for i in range(6)]
        print("ok")
        """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.parametrize("rotary_dim", [64, 2048])
def test_3_gptj_with_a_million_positions_indexes_within_a_gib(tmp_path, rotary_dim):
    """GPT-J computes its sinusoidal position table (n_positions x rotary_dim) in its constructor."""
    config = dict(model_type="gptj", architectures=["GPTJForCausalLM"], n_layer=1, n_positions=2**20, n_embd=4096,
                  n_head=16, rotary_dim=rotary_dim, vocab_size=1000)
    proc, outcome = index_hf_bounded(tmp_path, [write_config(tmp_path, "gptj", config)])
    assert outcome["indexed"] == 1 and not outcome["failed"], outcome
    info = zoo.connect(f"sqlite:///{tmp_path / 'r.db'}").info("hf/gptj")
    assert info.status == "ok" and info.params > 0
