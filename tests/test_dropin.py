"""Drop-in parity: a zoo model behaves exactly as the library's own model in training code.

For a sample of models (BatchNorm CNNs, a ViT, a Swin, detection with targets, segmentation, a tiny Llama
and a tiny Mixtral MoE) the library's model is built eagerly under a seed and saved; the zoo model is
gotten on meta and materialized from that file (a save_pretrained directory for transformers). Both then
run the same training code side by side: three optimizer steps (AdamW, SGD with momentum), torch.save,
deepcopy and pickle, torch.compile, bf16 autocast and bf16 weights, DDP, FSDP2, tensor parallelism and
FSDP2 x TP on gloo ranks. The math is the same ops in the same order on both sides, so every comparison
is bitwise (torch.equal) except inductor's, whose generated kernels are compared within tolerance.
Models, inputs, losses, the training loop and the per-rank checks are in tests/dropin_support.py."""

import copy
import io
import math
import pickle

import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from tests import dropin_support as ds
from tests.conftest import cli_json
from tests.dropin_support import CASES, LLAMA, MOE, differing, optimizer_tensors, part, predict, train
from tests.test_training_code import saved_size

R18, MBV3, VIT = "timm/resnet18", "torchvision/mobilenet_v3_small", "timm/vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> ds.Sample:
    """The sample, with its two transformers models saved and indexed into a temporary registry in one CLI call
    (`zoo index hf DIR...` names each row after its directory)."""
    root = tmp_path_factory.mktemp("dropin")
    sample = ds.Sample(root, f"sqlite:///{root / 'hf.db'}")
    saved = [sample.weights(name) for name in (LLAMA, MOE)]  # save_pretrained directories
    out = cli_json("index", "hf", *saved, registry=sample.hf_url, env_extra={"ZOO_CACHE": str(root / "zoo_cache")})
    assert out == {"indexed": 2, "unchanged": 0, "failed": {}}
    return sample


def assert_same_losses(got: list, want: list) -> None:
    assert len(got) == len(want), (got, want)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)), (got, want)


def assert_same_model(got, want) -> None:
    """Every persistent tensor (parameters, BatchNorm statistics, num_batches_tracked) and every buffer,
    non-persistent ones too, bit for bit."""
    assert not differing(got.state_dict(), want.state_dict())
    assert not differing(dict(got.named_buffers()), dict(want.named_buffers()))


# --- training ------------------------------------------------------------------------------------------


# The two largest of the sample train for seconds a step on 2 cores: slow (make test runs them, make test-fast does not)
LARGE = ("timm/swin_tiny_patch4_window7_224", "torchvision/fasterrcnn_mobilenet_v3_large_fpn")


@pytest.mark.parametrize("optimizer, load", [("adamw", "views"), ("sgd", "views"), ("sgd", "copy"), ("adamw", "cast")])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n in LARGE else ()) for n in CASES])
def test_three_optimizer_steps_equal_the_library_models(sample, name, optimizer, load):
    case = CASES[name]
    eager, m = sample.eager_for(name, load), sample.zoo(name, load)
    assert type(m) is type(eager)
    want, eager_opt = train(eager, case, optimizer)
    got, opt = train(m, case, optimizer)
    assert_same_losses(got, want)
    assert not torch.equal(want[0], want[-1])  # the steps did train
    assert_same_model(m, eager)
    assert not differing(optimizer_tensors(opt), optimizer_tensors(eager_opt))
    norms = [n for n, mod in eager.named_modules() if isinstance(mod, _BatchNorm) and mod.track_running_stats]
    for n in norms:  # the running statistics moved, once per step (and are equal: assert_same_model)
        assert int(m.get_submodule(n).num_batches_tracked) == 3, n
    assert bool(norms) == name.startswith(("timm/resnet", "torchvision/")), norms[:3]  # the sample's BatchNorm models
    assert saved_size(part(m, case).state_dict()) == saved_size(part(eager, case).state_dict())


def test_a_one_ulp_change_in_one_weight_is_seen(sample):
    """The comparisons are bitwise: one element of one weight moved by one ulp before training gives other
    trained weights (so every parity test here can fail)."""
    case = CASES[LLAMA]
    eager = sample.eager(LLAMA)
    state = {k: v.clone() for k, v in eager.state_dict().items()}
    w = state["model.layers.0.mlp.down_proj.weight"].view(-1)
    w[0] = torch.nextafter(w[0], torch.tensor(math.inf))
    m = sample.get(LLAMA).materialize(weights=state)
    assert differing(m.state_dict(), eager.state_dict()) == ["model.layers.0.mlp.down_proj.weight"]
    train(eager, case, "sgd")
    train(m, case, "sgd")
    assert len(differing(m.state_dict(), eager.state_dict())) > 1  # it spread through the steps


# --- torch.save ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("load", ds.LOADS)
@pytest.mark.parametrize("name", list(CASES))
def test_torch_save_writes_what_the_library_model_writes(sample, name, load):
    """The same bytes count for the whole state dict and for one submodule's (only its own tensors), and
    what is written loads back equal."""
    case = CASES[name]
    eager, m = sample.eager_for(name, load), sample.zoo(name, load)
    assert saved_size(m.state_dict()) == saved_size(eager.state_dict())
    sub, eager_sub = part(m, case), part(eager, case)
    assert saved_size(sub.state_dict()) == saved_size(eager_sub.state_dict()) < saved_size(eager.state_dict())
    buffer = io.BytesIO()
    torch.save(sub.state_dict(), buffer)
    buffer.seek(0)
    assert not differing(torch.load(buffer, weights_only=True), eager_sub.state_dict())


# --- copies ----------------------------------------------------------------------------------------------

COPIES = {"deepcopy": copy.deepcopy, "pickle": lambda m: pickle.loads(pickle.dumps(m))}


@pytest.mark.parametrize("name", [R18, VIT, LLAMA, MOE])
@pytest.mark.parametrize("how", list(COPIES))
def test_copies_behave_as_the_library_models_copies(sample, name, how):
    """A copy holds equal values, predicts and trains as the eager model's copy does, keeps a .materialize
    bound to itself (an object zoo.get attaches: it must copy and pickle), and shares nothing with its
    original: training the copy leaves the original as it was."""
    case = CASES[name]
    eager, m = sample.eager(name), sample.zoo(name)
    twin, eager_twin = COPIES[how](m), COPIES[how](eager)
    assert type(twin) is type(eager_twin)
    assert type(twin.materialize) is type(m.materialize) and twin.materialize.module is twin
    assert_same_model(twin, eager_twin)
    assert torch.equal(predict(twin, case), predict(eager_twin, case))
    got, _ = train(twin, case, "sgd", steps=2)
    want, _ = train(eager_twin, case, "sgd", steps=2)
    assert_same_losses(got, want)
    assert_same_model(twin, eager_twin)
    assert_same_model(m, eager)  # neither original moved
    assert differing(m.state_dict(), twin.state_dict())


# --- torch.compile -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def inductor_dir(tmp_path_factory):
    """One inductor cache for the session, not one per test: torch remembers the precompiled header it built
    first and includes it in later compiles, so a per-test directory, removed once its test passed, broke the
    next compile (g++: header not found). pytest removes it with the session's temporary files."""
    return tmp_path_factory.mktemp("inductor")


@pytest.fixture
def fresh_dynamo(inductor_dir, monkeypatch):
    """Dynamo's caches reset around a test; inductor's files in the session's temporary directory, not in /tmp
    for good: its kernel cache, and its precompiled headers (150 MB), whose directory torch fixes at import."""
    from torch._inductor import codecache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_dir))
    headers = inductor_dir / "precompiled_headers"
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(headers), raising=False)
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", str(headers / "locks"), raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", [R18, VIT, LLAMA])
def test_torch_compile_eager_backend_trains_as_the_library_model(sample, name, fresh_dynamo):
    """Dynamo traces the zoo model to the same graph: bitwise the same training steps."""
    case = CASES[name]
    eager, m = sample.eager(name), sample.zoo(name)
    want, _ = train(torch.compile(eager, backend="eager"), case, "sgd", steps=2)
    got, _ = train(torch.compile(m, backend="eager"), case, "sgd", steps=2)
    assert_same_losses(got, want)
    assert_same_model(m, eager)


@pytest.mark.slow  # gcc compiles the kernels: 30 s for the Llama, 1-2 minutes for MBV3
@pytest.mark.parametrize("name", [LLAMA, MBV3])
def test_torch_compile_inductor_trains_as_the_library_model(sample, name, fresh_dynamo):
    """Inductor (C++ kernels, gcc) compiles the zoo model's training step: within float32 tolerance of the
    library model compiled the same way, and of the uncompiled one."""
    case = CASES[name]
    eager, m, plain = sample.eager(name), sample.zoo(name), sample.eager(name)
    want, _ = train(torch.compile(eager, backend="inductor"), case, "sgd", steps=2)
    got, _ = train(torch.compile(m, backend="inductor"), case, "sgd", steps=2)
    reference, _ = train(plain, case, "sgd", steps=2)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-4)  # another summation order than eager's
    torch.testing.assert_close(m.state_dict(), eager.state_dict())
    torch.testing.assert_close(m.state_dict(), plain.state_dict(), rtol=1e-4, atol=1e-4)


# --- bf16 --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [R18, MBV3, VIT, LLAMA, MOE])
@pytest.mark.parametrize("precision", ["autocast", "bf16-weights"])
def test_bfloat16_trains_as_the_library_model(sample, name, precision):
    """torch.autocast("cpu", bfloat16) around the forward, or model.to(torch.bfloat16) with bf16 inputs:
    two SGD steps, bitwise equal."""
    case = CASES[name]
    eager, m = sample.eager(name), sample.zoo(name)
    options = {"autocast": True} if precision == "autocast" else {"dtype": torch.bfloat16}
    if precision == "bf16-weights":
        assert m.to(torch.bfloat16) is m
        eager.to(torch.bfloat16)
        assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    want, _ = train(eager, case, "sgd", steps=2, **options)
    got, _ = train(m, case, "sgd", steps=2, **options)
    assert_same_losses(got, want)
    assert_same_model(m, eager)


# --- distributed: gloo ranks, each running every check of its world size --------------------------------


def _spawn(sample: ds.Sample, world: int, out_dir, names) -> str:
    import torch.multiprocessing as mp

    for name in names:  # saved here, once: ranks only read them
        sample.weights(name)
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: before the autouse fixture, so set here too
        patch.setenv("ZOO_CACHE", str(out_dir / "zoo_cache"))
        mp.spawn(
            ds.ranks_main,
            args=(world, str(out_dir / "init"), str(sample.root), sample.hf_url, str(out_dir)),
            nprocs=world,
        )
    return str(out_dir)


@pytest.fixture(scope="module")
def two_ranks(sample, tmp_path_factory) -> str:
    """One spawn of 2 ranks for DDP, FSDP2 and tensor parallelism (each rank re-imports torch: seconds)."""
    return _spawn(sample, 2, tmp_path_factory.mktemp("two_ranks"), {n for _, _, n in ds.TWO_RANK_CHECKS})


@pytest.fixture(scope="module")
def four_ranks(sample, tmp_path_factory) -> str:
    return _spawn(sample, 4, tmp_path_factory.mktemp("four_ranks"), {n for _, _, n in ds.FOUR_RANK_CHECKS})


def assert_ranks_agree(out_dir: str, check: str, world: int, placements: tuple = ()) -> None:
    """On every rank the zoo side's parameters are placed as the eager side's (those named in `placements`
    among them), and its losses and gathered final weights are equal, bit for bit."""

    def results(side):
        return [torch.load(f"{out_dir}/{ds.label(check, side)}-{r}.pt", weights_only=True) for r in range(world)]

    eager, got = results("eager"), results("zoo")
    for rank, (e, z) in enumerate(zip(eager, got)):
        assert "error" not in e, f"the eager side failed on rank {rank} (the check itself is wrong):\n{e['error']}"
        assert "error" not in z, f"rank {rank}:\n{z['error']}"
        assert z["placements"] == e["placements"], f"rank {rank}"
        for placement in placements:
            assert any(placement in p for p in e["placements"].values()), (placement, e["placements"])
        assert_same_losses(z["losses"], e["losses"])
        assert not torch.equal(e["losses"][0], e["losses"][-1])
        assert not differing(z["state"], e["state"]), f"rank {rank}"


@pytest.mark.parametrize("name", ds.DDP_MODELS)
def test_ddp_trains_as_the_library_model(two_ranks, name):
    """DistributedDataParallel on 2 ranks, each its own batch (BatchNorm buffers broadcast from rank 0)."""
    assert_ranks_agree(two_ranks, f"ddp-{name}", 2)


@pytest.mark.parametrize("name", ds.FSDP_MODELS)
def test_fsdp2_sharded_on_meta_trains_as_the_library_model(two_ranks, name):
    """fully_shard on each block and the root: the zoo model on meta, then materialized (each rank reads its
    rows); the eager model sharded from its full weights. Three AdamW steps, full weights gathered."""
    assert_ranks_agree(two_ranks, f"fsdp-{name}", 2, placements=("Shard(dim=0)",))


def test_tensor_parallel_on_meta_trains_as_the_library_model(two_ranks):
    """The Llama's attention and MLP projections column- and row-wise over 2 ranks (Shard(0), Shard(1)),
    applied to the meta zoo model before materialize and to the eager model with its full weights."""
    assert_ranks_agree(two_ranks, f"tp-{LLAMA}", 2, placements=("Shard(dim=0)", "Shard(dim=1)"))


def test_sequence_parallel_on_meta_trains_as_the_library_model(two_ranks):
    """torchtitan's plan: norms and the residual stream sharded on the sequence dim, attention and MLP gathered
    and scattered around; the tied embedding and head distributed apart (untied), both read from the one key
    save_pretrained keeps for them."""
    assert_ranks_agree(two_ranks, f"sp-{LLAMA}", 2, placements=("Shard(dim=0)", "Shard(dim=1)", "Replicate()"))


def test_tensor_parallel_on_a_4_rank_mesh_trains_as_the_library_model(four_ranks):
    """The embedding, the MLPs and the head split 4 ways (the tied embedding and head untied, as above)."""
    assert_ranks_agree(four_ranks, f"tp4-{LLAMA}", 4, placements=("Shard(dim=0)", "Shard(dim=1)"))


def test_fsdp2_over_tensor_parallel_on_a_2x2_mesh_trains_as_the_library_model(four_ranks):
    """TP on the mesh's "tp" dim, fully_shard on its "dp" dim (2D and _StridedShard placements), 4 ranks."""
    assert_ranks_agree(four_ranks, f"fsdp_tp-{LLAMA}", 4, placements=("_StridedShard", "Shard(dim=1)"))
