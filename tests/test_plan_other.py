"""zoo.planning.OTHER's framework terms against what a real FSDP2 fully_shard and a real DistributedDataParallel
hold beyond the model states, on gloo ranks (CPU), for a tiny Llama and a timm ViT.

FSDP2's extra bytes are sampled after every aten op of a training step and of a forward under no_grad (a
TorchDispatchMode): the storages alive of each FSDPParam's unsharded parameter (all_gather_outputs), of the flat
all-gather buffers and reduce-scatter inputs the param groups and their comm context hold, and of the unsharded
gradients (param.grad of the unsharded parameters, and the tensors FSDP's copy-in ops read), each storage once, less
the sharded parameters and gradients (the plan's model states). The ranks run synchronously (gloo on CPU has no
streams), but what is held is what FSDP2 references from Python, the same on CUDA."""

import json
import weakref
from datetime import timedelta
from pathlib import Path

import pytest
import transformers

import zoo
from zoo.planning import PlanOptions, model_states, other_bytes, shape_groups

TINY = "hf/test-org/tiny-llama-other"
VIT = "timm/vit_tiny_patch16_224"
MODELS = [TINY, VIT]
# the root's parameters whose gradients autograd gives after the blocks' (the inputs' embeddings): the only bytes
# the plan's training term counts that FSDP2 does not hold at its peak
AFTER_BLOCKS = {TINY: ("model.embed_tokens.",), VIT: ("patch_embed.", "cls_token", "pos_embed")}
COPY_OPS = ("chunk_cat", "split_with_sizes_copy", "all_gather_copy_in", "allgather", "_foreach_copy")


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    """A registry with the tiny Llama of tests/test_plan.py (4 layers, 250 rows: padded over 4 ranks) and the ViT."""
    root = tmp_path_factory.mktemp("plan_other")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=250,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config.save_pretrained(root / "tiny-llama")
    url = f"sqlite:///{root / 'other.db'}"
    assert zoo.connect(url).index("hf", [str(root / "tiny-llama")], name=TINY).failed == {}
    assert zoo.connect(url).index("timm", [VIT.removeprefix("timm/")]).failed == {}
    return url


def _sampler(groups):
    """A TorchDispatchMode keeping, per phase, the peak bytes of FSDP2's buffers alive after each op."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sampler(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.refs, self.peak, self.phase = [], {}, ""

        def sample(self):
            seen, total = set(), 0
            for g in groups:  # the shards are model states: not counted
                for p in g.fsdp_params:
                    for t in (p.sharded_param, p.sharded_param.grad):
                        if t is not None:
                            seen.add(t.to_local().untyped_storage().data_ptr())
            held = []
            for g in groups:
                for p in g.fsdp_params:
                    held += p.all_gather_outputs
                    unsharded = getattr(p, "_unsharded_param", None)
                    if unsharded is not None and unsharded.grad is not None:
                        self.refs.append(weakref.ref(unsharded.grad))
                if g._all_gather_result is not None:
                    held.append(g._all_gather_result.all_gather_output)
                if g.comm_ctx.all_gather_state is not None:
                    held.append(g.comm_ctx.all_gather_state.all_gather_result.all_gather_output)
                held += [s.reduce_scatter_input for s in g.comm_ctx.reduce_scatter_states]
            self.refs = [r for r in self.refs if r() is not None]
            for t in held + [r() for r in self.refs]:
                storage = t.untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
            self.peak[self.phase] = max(self.peak.get(self.phase, 0), total)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(op in str(func) for op in COPY_OPS):  # FSDP's copy-ins read the unsharded gradients
                for a in [*args, *(kwargs or {}).values()]:
                    for t in a if isinstance(a, (list, tuple)) else [a]:
                        if isinstance(t, torch.Tensor) and not hasattr(t, "to_local"):
                            self.refs.append(weakref.ref(t))
            self.sample()
            return out

    return Sampler()


def _rank(rank: int, world: int, url: str, out: str) -> None:
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    try:
        mesh, result = init_device_mesh("cpu", (world,)), {}
        for name in MODELS:
            x = torch.randint(0, 250, (1, 16)) if name == TINY else torch.randn(1, 3, 224, 224)

            def loss_of(model, x=x):
                y = model(x)
                return (y.logits if hasattr(y, "logits") else y).float().sum()

            model = zoo.Zoo(url).get(name).materialize(device="cpu")
            stacks = [m for m in model.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))]
            for block in max(stacks, key=len):  # the blocks zoo.planning.blocks counts, and the root
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
            loss_of(model).backward()  # a first step: FSDP2 builds its buffers lazily
            opt.step()
            opt.zero_grad(set_to_none=True)
            groups = [
                s._fsdp_param_group
                for s in (m._get_fsdp_state() for m in model.modules() if hasattr(m, "_get_fsdp_state"))
                if s._fsdp_param_group is not None
            ]
            sampler = _sampler(groups)
            with sampler:
                sampler.phase = "forward"
                loss = loss_of(model)
                sampler.phase = "backward"
                loss.backward()
                sampler.phase = "step"
                opt.step()
                opt.zero_grad(set_to_none=True)
            with torch.no_grad(), sampler:
                sampler.phase = "serving"
                loss_of(model)
            result[name] = sampler.peak
            del model, opt, loss
            gc.collect()
            for view in (False, True):
                model = zoo.Zoo(url).get(name).materialize(device="cpu")
                ddp = DistributedDataParallel(model, gradient_as_bucket_view=view)
                buckets = []

                def hook(state, bucket, kept=buckets):  # DDP checks the name `bucket`
                    kept.append(bucket.buffer())
                    return allreduce_hook(state, bucket)

                ddp.register_comm_hook(None, hook)
                loss_of(ddp).backward()
                grads = {p.grad.data_ptr() for p in model.parameters()}
                spans = [(b.data_ptr(), b.data_ptr() + b.untyped_storage().nbytes()) for b in buckets]
                result[name][f"ddp_buckets_view_{view}"] = sum(b.untyped_storage().nbytes() for b in buckets)
                result[name][f"ddp_grads_in_buckets_view_{view}"] = all(
                    any(a <= g < e for a, e in spans) for g in grads
                )
                del ddp, model
                gc.collect()
        Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured(registry, tmp_path_factory) -> dict:
    """{world: {rank: {model: peaks}}} on 2 and 4 gloo ranks."""
    import torch.multiprocessing as mp

    out = {}
    for world in (2, 4):
        path = tmp_path_factory.mktemp(f"other_{world}")
        mp.spawn(_rank, args=(world, registry, str(path)), nprocs=world)
        out[world] = {r: json.loads((path / f"{r}.json").read_text()) for r in range(world)}
    return out


def _planned(registry: str, name: str, world: int, **options) -> dict:
    shapes = shape_groups(zoo.Zoo(registry).info(name, tensors=True).tensor_table)
    o = PlanOptions(hardware="cpu", devices=world, fsdp=world, dtype="fp32", optimizer="adamw", **options).checked()
    return other_bytes(shapes, o, model_states(shapes, o))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", MODELS)
def test_fsdp_gathered_is_what_fully_shard_holds_in_serving(measured, registry, name, world):
    """Forward under no_grad: the root and three blocks, or two roots and two blocks, all-gathered, to the byte
    (the padding of dim 0 included: the Llama's 250 rows over 4 ranks, the ViT's 1-row cls_token and pos_embed)."""
    planned = _planned(registry, name, world)["fsdp_gathered"]
    for rank, peaks in measured[world].items():
        assert peaks[name]["serving"] == planned, f"rank {rank}"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", MODELS)
def test_fsdp_gathered_bounds_what_fully_shard_holds_in_training_by_the_embeddings_gradients(
    measured, registry, name, world
):
    """A training step's peak (in backward) is the plan's term less the gradients of the root's parameters that
    autograd gives after the blocks, which the plan's shape groups do not tell apart from the head's; the optimizer
    step holds no FSDP buffer."""
    model = zoo.Zoo(registry).get(name)  # on meta: the names and shapes
    after = sum(p.numel() for n, p in model.named_parameters() if n.startswith(AFTER_BLOCKS[name])) * 4
    planned = _planned(registry, name, world, training=True)["fsdp_gathered"]
    for rank, peaks in measured[world].items():
        p = peaks[name]
        assert planned - max(p["forward"], p["backward"]) == after and p["step"] == 0, f"rank {rank}"


@pytest.mark.parametrize("name", MODELS)
def test_ddp_buckets_are_one_more_copy_of_the_gradients(measured, registry, name):
    """DDP's buckets (gradient_as_bucket_view=False, the default) hold every gradient again: the plan's term; with
    True the gradients are views of the buckets (nothing more)."""
    shapes = shape_groups(zoo.Zoo(registry).info(name, tensors=True).tensor_table)
    o = PlanOptions(hardware="cpu", devices=2, dtype="fp32", optimizer="adamw", training=True).checked()
    planned = other_bytes(shapes, o, model_states(shapes, o))["ddp_buckets"]
    for rank, peaks in measured[2].items():
        assert peaks[name]["ddp_buckets_view_False"] == planned, f"rank {rank}"
        assert not peaks[name]["ddp_grads_in_buckets_view_False"] and peaks[name]["ddp_grads_in_buckets_view_True"]
