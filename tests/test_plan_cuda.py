"""bench/plan_cuda.py, the GPU check of zoo.plan: its training step on CPU holds the model states the plan counts;
on a CUDA GPU (skipped without one) a step at the plan's max_batch fits an emulated RTX 3090."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo

BENCH = Path(__file__).resolve().parent.parent / "bench" / "plan_cuda.py"
spec = importlib.util.spec_from_file_location("plan_cuda", BENCH)
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_benchmarks_step_holds_the_model_states_the_plan_counts():
    """After the steps, weights, gradients (zeroed in place, kept) and SGD's momentum buffers are all there: fp32
    parameters three times over (amp-fp16 keeps fp32 masters), buffers once, as the plan has them."""
    z = zoo.Zoo()
    model, opt = bench.build(z, "resnet18", "cpu")
    bench.train_steps(model, opt, 2, (3, 64, 64), "cpu", steps=2)
    params = list(model.parameters())
    held = sum(p.nbytes for p in params) + sum(b.nbytes for b in model.buffers())
    held += sum(p.grad.nbytes for p in params) + sum(opt.state[p]["momentum_buffer"].nbytes for p in params)
    p = bench.planned(z, "resnet18", "24GiB", batch=2)
    assert held == p.per_device["weights"] + p.per_device["gradients"] + p.per_device["optimizer"]
    assert held == 3 * 4 * zoo.info("timm/resnet18").params + sum(b.nbytes for b in model.buffers())


def test_without_a_gpu_the_benchmark_says_so_and_exits_2():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the benchmark runs")
    done = subprocess.run([sys.executable, str(BENCH), "--models", "resnet18"], capture_output=True, text=True)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_a_step_at_max_batch_fits_an_emulated_rtx_3090():
    total = torch.cuda.mem_get_info()[1]
    if total < 24 * 2**30:
        pytest.skip("a GPU smaller than an RTX 3090")
    torch.cuda.set_per_process_memory_fraction(24 * 2**30 / total)  # the caching allocator gets 24 GiB
    try:
        r = bench.check(zoo.Zoo(), "resnet18", "RTX 3090", steps=2)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert r["max_batch"] > 512 and r["at"]["ran"], r
    assert r["at"]["allocated"] <= r["capacity"]
