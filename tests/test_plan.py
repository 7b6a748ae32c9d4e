"""zoo.plan: typed errors, the largest batch that fits, the ZeRO paper's closed forms, and FSDP2's per-rank bytes
against a real fully_shard over gloo ranks."""

import json
from datetime import timedelta
from pathlib import Path

import pytest
import transformers

import zoo
from zoo.errors import HardwareNotFound, InvalidArgument
from zoo.planning import PlanOptions, hardware_of, model_states, shape_groups

LLAMA_1B = "hf/meta-llama/Llama-3.2-1B"  # 1,235,814,400 parameters, 32 heads, 8 key-value heads
TINY = "hf/test-org/tiny-llama"
MODELS = ["timm/resnet10t", "timm/vit_tiny_patch16_224", TINY]  # a timm CNN, a ViT, a tiny Llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A registry with a tiny Llama indexed from its config (GQA, untied head, 4 layers)."""
    root = tmp_path_factory.mktemp("plan")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=250,  # 250 rows: uneven over 4 ranks (63 + 63 + 63 + 61), so a shard is padded
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config.save_pretrained(root / "tiny-llama")
    url = f"sqlite:///{root / 'tiny.db'}"
    assert zoo.connect(url).index("hf", [str(root / "tiny-llama")], name=TINY).failed == {}
    return url


def registry_of(name: str, tiny: str) -> zoo.Zoo:
    return zoo.Zoo(tiny if name == TINY else None)


# --- errors, before anything is built ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, error, match",
    [
        (dict(hardware="H1000"), HardwareNotFound, "H100"),
        (dict(hardware="A100"), HardwareNotFound, "A100 40GB SXM, NVIDIA A100 80GB SXM"),
        (dict(hardware="H100", devices=8, fsdp=3), InvalidArgument, "multiple of fsdp x tp"),
        (dict(hardware="H100", devices=4, fsdp=2, tp=4), InvalidArgument, "multiple of fsdp x tp"),
        (dict(hardware="H100", batch=0), InvalidArgument, "batch must be"),
        (dict(hardware="H100", batch=-4), InvalidArgument, "batch must be"),
        (dict(hardware="H100", devices=0), InvalidArgument, "devices must be"),
        (dict(hardware="H100", dtype="int8"), InvalidArgument, "amp-bf16"),
        (dict(hardware="H100", training=True, optimizer="lion"), InvalidArgument, "optimizer"),
        (dict(hardware="H100", checkpointing=True), InvalidArgument, "training=True"),
        (dict(hardware="H100", gpus=8), InvalidArgument, "unknown plan option gpus"),
        (dict(), InvalidArgument, "give hardware"),
        (dict(hardware="H100", tp=3, devices=3), InvalidArgument, "must divide the attention heads"),
    ],
)
def test_a_bad_option_is_a_typed_error(options, error, match):
    with pytest.raises(error, match=match):
        zoo.plan(LLAMA_1B, **options)


def test_hardware_goes_by_its_short_names_or_an_amount_of_memory():
    assert hardware_of("h100").name == hardware_of("NVIDIA H100 80GB SXM").name == "NVIDIA H100 80GB SXM"
    assert hardware_of("A100-80GB").capacity == 80 * 2**30 and hardware_of("a100 40gb").capacity == 40 * 2**30
    assert hardware_of("RTX 3090").name == "NVIDIA GeForce RTX 3090" and hardware_of("rtx4090").capacity == 24 * 2**30
    assert hardware_of("24GiB").capacity == 24 * 2**30 and hardware_of("80 GB").capacity == 80 * 10**9
    assert hardware_of(10**9).capacity == 10**9
    meminfo = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
    assert meminfo <= hardware_of("cpu").capacity <= meminfo * 1.05  # this machine's RAM, read at run time


# --- the largest batch ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, options",
    [
        ("timm/resnet18", dict(hardware="RTX 4090", training=True)),
        ("timm/levit_128s", dict(hardware="RTX 4090", training=True)),  # cannot run a batch of one in training
        ("timm/resnet18", dict(hardware="2GiB", dtype="fp32")),
        (TINY, dict(hardware="64MiB", training=True, fsdp=2, devices=4, seq_len=64)),
        (TINY, dict(hardware="64MiB", seq_len=64)),  # serving: weights, activations and the KV cache
    ],
)
def test_a_plan_fits_at_max_batch_and_not_one_more(tiny, name, options):
    registry = registry_of(name, tiny)
    best = registry.plan(name, **options).max_batch
    assert best > 1
    at, over = registry.plan(name, batch=best, **options), registry.plan(name, batch=best + 1, **options)
    assert at.fits and at.per_device["total"] <= at.capacity
    assert not over.fits and over.per_device["total"] > over.capacity


def test_max_batch_grows_with_capacity_and_devices_and_shrinks_with_sequence_length(tiny):
    registry = registry_of(TINY, tiny)
    base = dict(training=True, seq_len=64)
    by_capacity = [registry.plan(TINY, hardware=f"{m}MiB", **base).max_batch for m in (16, 32, 64, 128)]
    assert by_capacity == sorted(by_capacity) and by_capacity[0] < by_capacity[-1]
    by_devices = [registry.plan(TINY, hardware="12MiB", training=True, fsdp=n, devices=n).max_batch for n in (1, 2, 4)]
    assert by_devices == sorted(by_devices) and by_devices[0] < by_devices[-1]
    by_seq = [registry.plan(TINY, hardware="64MiB", training=True, seq_len=s).max_batch for s in (32, 64, 128, 256)]
    assert by_seq == sorted(by_seq, reverse=True) and by_seq[0] > by_seq[-1]


@pytest.mark.parametrize(
    "name, options, batch, seq_len",
    [
        ("timm/resnet18", dict(training=True, dtype="fp32", optimizer="sgd"), 8, None),
        # BatchNorm in training refuses a batch of one value per channel: measured at 2 and 4 instead
        ("timm/levit_128s", dict(training=True, dtype="fp32", optimizer="sgd"), 8, None),
        (TINY, dict(training=True, dtype="bf16"), 5, 96),
        (TINY, dict(dtype="bf16"), 3, 200),
    ],
)
def test_the_fitted_activations_are_what_estimate_measures_at_that_size(tiny, name, options, batch, seq_len):
    """The plan measures at a few batches and lengths (fit_points): at another batch and length the fit equals a
    direct meta measurement (of the step without its optimizer, as the plan measures it)."""
    registry = registry_of(name, tiny)
    p = registry.plan(name, hardware="H100", batch=batch, seq_len=seq_len, **options)
    e = registry.estimate(
        name, batch=batch, seq_len=seq_len, **options | ({"optimizer": "none"} if options.get("training") else {})
    )
    assert p.per_device["activations"] == pytest.approx(e.activations + e.inputs, rel=0.01)
    assert p.per_device["kv_cache"] == e.kv_cache


# --- the ZeRO paper's closed forms (Rajbhandari et al. 2020, Table 1) ----------------------------------------


@pytest.mark.parametrize("devices, fsdp", [(8, 1), (8, 8), (8, 4), (64, 64)])
def test_model_states_are_the_zero_papers_closed_forms(devices, fsdp):
    """Mixed-precision Adam keeps 16 bytes a parameter (K = 12: fp32 master weights, momentum and variance; 2 + 2:
    the half-precision parameters and gradients, which FSDP2 keeps as fp32 gradients of the fp32 shards, the same
    16). DDP replicates them (ZeRO's baseline); full sharding over N ranks divides them by N (ZeRO-3)."""
    info = zoo.info(LLAMA_1B, tensors=True)
    o = PlanOptions(hardware="H100", devices=devices, fsdp=fsdp, training=True, dtype="amp-bf16", optimizer="adam")
    states = model_states(shape_groups(info.tensor_table), o.checked())
    assert sum(states.values()) == pytest.approx(16 * info.params / fsdp, rel=0.01)


def test_a_plans_model_states_are_its_tensor_tables(tiny):
    o = PlanOptions(hardware="H100", devices=4, fsdp=4, training=True, dtype="amp-bf16", optimizer="adam", batch=1)
    p = registry_of(TINY, tiny).plan(TINY, **o.__dict__)
    states = model_states(shape_groups(registry_of(TINY, tiny).info(TINY, tensors=True).tensor_table), o.checked())
    assert {k: p.per_device[k] for k in states} == states


# --- FSDP2: the bytes a real fully_shard holds on each rank --------------------------------------------------


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def _rank(rank: int, world: int, tiny: str, out: str) -> None:
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    try:
        mesh = init_device_mesh("cpu", (world,))
        result = {}
        for name in MODELS:
            registry = registry_of(name, tiny)
            model = registry.get(name).materialize(device="cpu")
            stacks = [m for m in model.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))]
            blocks = max(stacks, key=len)  # the longest stack of blocks (timm's stages, ViT's blocks, Llama's layers)
            for block in blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            weights = _storage_bytes([*model.parameters(), *model.buffers()])
            torch.manual_seed(0)
            if name == TINY:
                loss = model(torch.randint(0, 250, (1, 16))).logits.float().sum()
            else:
                loss = model(torch.randn(1, 3, 224, 224)).float().sum()
            loss.backward()
            gradients = _storage_bytes([p.grad for p in model.parameters()])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
            opt.step()
            states = _storage_bytes([v for s in opt.state.values() for v in s.values()])
            result[name] = {"weights": weights, "gradients": gradients, "optimizer": states}
            del model, opt, loss
            gc.collect()
        Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, tiny: str, out: Path) -> dict:
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(world, tiny, str(out)), nprocs=world)
    return {r: json.loads((out / f"{r}.json").read_text()) for r in range(world)}


@pytest.fixture(scope="module")
def two_ranks(tiny, tmp_path_factory) -> dict:
    return _spawn(2, tiny, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def four_ranks(tiny, tmp_path_factory) -> dict:
    return _spawn(4, tiny, tmp_path_factory.mktemp("four_ranks"))


def _planned(name: str, tiny: str, world: int, rank: int) -> dict:
    info = registry_of(name, tiny).info(name, tensors=True)
    o = PlanOptions(hardware="cpu", devices=world, fsdp=world, training=True, dtype="fp32", optimizer="adamw")
    return model_states(shape_groups(info.tensor_table), o.checked(), rank)


@pytest.mark.parametrize("name", MODELS)
def test_fsdp2_model_states_are_a_real_fully_shards_on_two_ranks(two_ranks, tiny, name):
    for rank, measured in two_ranks.items():
        assert _planned(name, tiny, 2, rank) == measured[name], f"rank {rank}"


@pytest.mark.parametrize("name", MODELS)
def test_fsdp2_model_states_are_a_real_fully_shards_on_four_ranks(four_ranks, tiny, name):
    for rank, measured in four_ranks.items():
        assert _planned(name, tiny, 4, rank) == measured[name], f"rank {rank}"
    # the padding is there: the last rank holds fewer optimizer bytes than rank 0, the same weights
    if name == TINY:
        assert four_ranks[3][name]["optimizer"] < four_ranks[0][name]["optimizer"]
        assert four_ranks[3][name]["weights"] == four_ranks[0][name]["weights"]


# --- the command ---------------------------------------------------------------------------------------------


def test_zoo_plan_prints_the_plans_attributes_as_json_and_a_table(tiny):
    from tests.conftest import run_cli

    args = ["plan", TINY, "--hardware", "64MiB", "--training", "--fsdp", "2", "--devices", "4", "--seq-len", "64"]
    got = json.loads(run_cli(*args, "--json", registry=tiny).stdout)
    want = zoo.Zoo(tiny).plan(TINY, hardware="64MiB", training=True, fsdp=2, devices=4, seq_len=64).as_dict()
    assert got == want and set(got["per_device"]) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "kv_cache",
        "other",
        "total",
    }
    text = run_cli(*args, registry=tiny).stdout
    assert f"max_batch: {want['max_batch']}" in text and "DDP 2 x FSDP 2 x TP 1" in text
    failed = run_cli("plan", TINY, "--hardware", "64MiB", "--devices", "3", "--tp", "2", registry=tiny, check=False)
    assert failed.returncode == 1 and "--devices (3) must be a multiple of fsdp x tp" in failed.stderr
    assert "zoo plan hf/meta-llama/Llama-3.1-8B --hardware H100" in run_cli("plan", "--help").stdout
