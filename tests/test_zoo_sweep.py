"""The whole zoo through materialize (`make sweep`; CI runs CI_SAMPLE and tests/test_materialize.py).

For every timm and torchvision model: the seeded eager model against zoo.get(name).materialize()
under the same seed (no-weights init, bit for bit), then the eager state dict loaded into a
fresh zoo.get(name) (state, buffers and forward output bit for bit). Results, per model, go to
$ZOO_SWEEP_OUT (default sweep-results.json); the test fails listing every model that did not pass.

On 2 cores: models up to 3e8 params in two shards side by side (ZOO_SWEEP_SHARD=0/2 and 1/2,
OMP_NUM_THREADS=1, ZOO_SWEEP_MAX_PARAMS=3e8) take about 27 minutes; the 191 larger ones in one
process (ZOO_SWEEP_MIN_PARAMS=3e8 ZOO_SWEEP_MAX_PARAMS=2e9) about an hour, needing ~16 GB.
"""

import gc
import json
import os
import signal
import time

import pytest
import torch

import zoo
from tests.test_whole_zoo import eager_build
from zoo.families import family

MAX_PARAMS = int(float(os.environ.get("ZOO_SWEEP_MAX_PARAMS", 1.5e9)))  # larger ones: skipped, and counted
MIN_PARAMS = int(float(os.environ.get("ZOO_SWEEP_MIN_PARAMS", 0)))  # smaller ones: left out (a second pass)
PER_MODEL_S = 600


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _state_equal(got, want) -> list[str]:
    g, w = dict(got.named_buffers()), dict(want.named_buffers())
    g.update(got.state_dict())
    w.update(want.state_dict())
    if g.keys() != w.keys():
        return sorted(g.keys() ^ w.keys())[:3]
    return [k for k in w if not (g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]))][:3]


def _inputs(info):
    torch.manual_seed(123)
    task, size = info.task, info.input_size
    if task == "object-detection":
        return ([torch.rand(3, 256, 256)],)
    if task == "optical-flow":
        return (torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128))
    return (torch.randn(1, *(size or (3, 224, 224))),)


def check_model(name: str) -> dict:
    info = zoo.info(name)
    if info.params > MAX_PARAMS:
        return {"skipped": f"{info.params:,} params > {MAX_PARAMS:,}"}
    family_name, builder = name.split("/", 1)
    result = {}
    torch.manual_seed(0)
    eager = eager_build(family_name, builder)
    torch.manual_seed(0)
    initialized = zoo.get(name).materialize()
    bad = _state_equal(initialized, eager)
    result["init"] = not bad
    if bad:
        result["init_diff"] = bad
    del initialized
    gc.collect()
    loaded = zoo.get(name).materialize(weights={k: v for k, v in eager.state_dict().items()})
    bad = _state_equal(loaded, eager)
    result["state"] = not bad
    if bad:
        result["state_diff"] = bad
    eager.eval(), loaded.eval()
    with torch.no_grad():
        x = _inputs(info)
        result["forward"] = _equal(loaded(*x), eager(*x))
    return result


def _hard_cases_first(names: list[str]) -> list[str]:
    """torchvision, then models with non-persistent buffers or ties, then the rest: a sweep cut
    short has covered the cases most likely to break."""

    def hard(name):
        table = zoo.info(name, tensors=True).tensor_table or []
        return any(not t.persistent or t.tied_to for t in table)

    return sorted(names, key=lambda n: (not n.startswith("torchvision/"), not hard(n), n))


# CI's share of the sweep: small models from the hard families (non-persistent buffers, ties,
# plain tensor attributes, RNG-driven inits), about a second each.
CI_SAMPLE = [
    "timm/test_coatnet",
    "timm/test_vit_relpos",
    "timm/efficientvit_m0",
    "timm/efficientformerv2_s0",
    "timm/eva02_tiny_patch14_224",
    "timm/vit_pe_spatial_tiny_patch16_512",
    "timm/convit_tiny",
    "timm/coat_lite_tiny",
    "timm/levit_128s",
    "timm/efficientnet_blur_b0",
    "timm/regnetx_002",
    "torchvision/fasterrcnn_mobilenet_v3_large_320_fpn",
    "torchvision/ssdlite320_mobilenet_v3_large",
    "torchvision/raft_small",
    "torchvision/swin_v2_t",
]


@pytest.mark.parametrize("name", CI_SAMPLE)
def test_a_sample_of_hard_cases(name):
    result = check_model(name)
    assert result == {"init": True, "state": True, "forward": True}, result


class _Timeout(Exception):
    pass


@pytest.mark.sweep
def test_whole_zoo_round_trip_and_init():
    out = os.environ.get("ZOO_SWEEP_OUT", "sweep-results.json")
    only = os.environ.get("ZOO_SWEEP_ONLY")  # a glob, to sweep part of the zoo
    shard, shards = map(int, os.environ.get("ZOO_SWEEP_SHARD", "0/1").split("/"))  # run i of n in parallel
    names = _hard_cases_first([f"{f}/{b}" for f in ("timm", "torchvision") for b in family(f).available()])
    if only:
        import fnmatch

        names = [n for n in names if fnmatch.fnmatchcase(n, only)]
    if MIN_PARAMS:
        names = [n for n in names if zoo.info(n).params > MIN_PARAMS]
    names = names[shard::shards]
    results = {}

    def alarm(*_):
        raise _Timeout()

    signal.signal(signal.SIGALRM, alarm)
    for name in names:
        start = time.perf_counter()
        signal.alarm(PER_MODEL_S)
        try:
            results[name] = check_model(name)
        except _Timeout:
            results[name] = {"error": f"over {PER_MODEL_S} s"}
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            signal.alarm(0)
            gc.collect()
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    failed = {
        n: r
        for n, r in results.items()
        if "skipped" not in r and not (r.get("init") and r.get("state") and r.get("forward"))
    }
    summary = {key: sum(1 for r in results.values() if r.get(key)) for key in ("init", "state", "forward")}
    print(f"\nsweep over {len(results)} models: {summary}, skipped {sum('skipped' in r for r in results.values())}")
    assert not failed, f"{len(failed)} models failed:\n" + "\n".join(f"  {n}: {r}" for n, r in sorted(failed.items()))
