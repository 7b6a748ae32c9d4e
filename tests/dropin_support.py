"""Drop-in parity (tests/test_dropin.py): the sample of models, how each is built eagerly, saved, gotten and
materialized, its inputs and loss, the training loop, and the checks each spawned rank runs. A module of its
own so that ranks started with torch.multiprocessing import it without importing a test module's fixtures."""

import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from tests.conftest import ROOT
from tests.test_hf import tiny_config
from tests.test_materialize import eager_model, pad_header, save

SHIPPED = str(ROOT / "registry.db")
# The tiny transformers models are saved under these directory names; `zoo index hf DIR` names a row after
# its directory, so both are indexed in one call.
LLAMA, MOE = "hf/dropin-llama", "hf/dropin-mixtral"
MIXTRAL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
    num_local_experts=4,
    num_experts_per_tok=2,
    output_router_logits=True,
    tie_word_embeddings=False,
)  # the router's loss too


# --- the sample: inputs and losses ------------------------------------------------------------------------


def _images(size: int, batch: int = 2):
    def make(gen):
        return torch.randn(batch, 3, size, size, generator=gen), torch.randint(0, 1000, (batch,), generator=gen)

    return make


def _classify(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def _segmentation_batch(gen):
    return torch.randn(2, 3, 96, 96, generator=gen), torch.randint(0, 21, (2, 96, 96), generator=gen)


def _segment(model, batch):
    x, mask = batch
    return F.cross_entropy(model(x)["out"], mask)


def _detection_batch(gen):
    images, targets = [], []
    for _ in range(2):
        images.append(torch.rand(3, 96, 128, generator=gen))
        corner = torch.rand(3, 2, generator=gen) * torch.tensor([64.0, 48.0])
        size = 16 + torch.rand(3, 2, generator=gen) * 32
        labels = torch.randint(1, 91, (3,), generator=gen)
        targets.append({"boxes": torch.cat([corner, corner + size], 1), "labels": labels})
    return images, targets


def _detect(model, batch):
    images, targets = batch
    return sum(model(images, targets).values())  # train mode with targets: the dict of losses


def _tokens(gen):
    return torch.randint(1, 128, (2, 16), generator=gen)


def _causal_lm(model, ids):
    return model(input_ids=ids, labels=ids).loss  # a MoE's loss includes its router's load-balancing loss


@dataclass(frozen=True)
class Case:
    name: str
    part: str  # a submodule whose state_dict is saved alone
    batch: Callable[[torch.Generator], object]
    loss: Callable[[nn.Module, object], torch.Tensor]
    kwargs: tuple = ()  # zoo.get kwargs, the same given to the library's builder


CASES = {
    c.name: c
    for c in [
        Case("timm/resnet18", "layer1", _images(128), _classify),
        Case("torchvision/mobilenet_v3_small", "features.1", _images(128), _classify),
        Case("timm/vit_tiny_patch16_224", "blocks.0", _images(224), _classify),
        Case("timm/swin_tiny_patch4_window7_224", "layers.0", _images(224, batch=1), _classify),
        # resized to 128 pixels, not 800, and fewer proposals and sampled boxes: minutes on 2 cores otherwise
        Case(
            "torchvision/fasterrcnn_mobilenet_v3_large_fpn",
            "backbone.body",
            _detection_batch,
            _detect,
            (
                ("min_size", 128),
                ("max_size", 160),
                ("rpn_pre_nms_top_n_train", 300),
                ("rpn_post_nms_top_n_train", 300),
                ("rpn_batch_size_per_image", 64),
                ("box_batch_size_per_image", 64),
            ),
        ),
        Case("torchvision/lraspp_mobilenet_v3_large", "classifier", _segmentation_batch, _segment),
        Case(LLAMA, "model.layers.0", _tokens, _causal_lm),
        Case(MOE, "model.layers.0.mlp", _tokens, _causal_lm),
    ]
}


def part(model: nn.Module, case: Case) -> nn.Module:
    return model.get_submodule(case.part)


# --- building: the library's own model, its saved weights, and the zoo model loaded from them ------------


def hf_config(name: str):
    import transformers

    return tiny_config("llama") if name == LLAMA else transformers.MixtralConfig(**MIXTRAL)


class Sample:
    """Builds each model of the sample eagerly (seed 0), saves its weights once under `root`, and gets the zoo
    model from the shipped registry (timm, torchvision) or the temporary one (`hf_url`)."""

    def __init__(self, root, hf_url: str):
        self.root, self.hf_url = Path(root), hf_url

    def eager(self, name: str) -> nn.Module:
        kwargs = dict(CASES[name].kwargs)
        if name.startswith("hf/"):
            import transformers

            torch.manual_seed(0)
            return transformers.AutoModelForCausalLM.from_config(hf_config(name))
        if not kwargs:
            return eager_model(name)
        from torchvision.models import get_model

        from tests.test_whole_zoo import _no_backbone

        family, builder = name.split("/", 1)
        assert family == "torchvision"
        torch.manual_seed(0)
        return get_model(builder, weights=None, **_no_backbone(builder), **kwargs)

    def weights(self, name: str) -> str:
        """The eager model's weights: a .safetensors file, or (hf) its save_pretrained directory; saved once,
        the data 64-byte aligned."""
        if name.startswith("hf/"):
            path = self.root / name.removeprefix("hf/")
            if not path.exists():
                self.eager(name).save_pretrained(path)
                for file in path.glob("*.safetensors"):  # 64-byte aligned as the eager model's memory: the views
                    pad_header(file)  # compute as it does on any machine (from_pretrained's do at any alignment)
            return str(path)
        path = self.root / (name.replace("/", "_") + ".safetensors")
        if not path.exists():
            save(self.root, self.eager(name), path.name)
        return str(path)

    def registry(self, name: str):
        return zoo.connect(self.hf_url if name.startswith("hf/") else SHIPPED)

    def get(self, name: str) -> nn.Module:
        """The zoo model, on meta."""
        return self.registry(name).get(name, **dict(CASES[name].kwargs))

    def zoo(self, name: str, load: str = "views") -> nn.Module:
        """The zoo model, materialized on CPU from the eager model's saved weights, by one of LOADS."""
        if load == "cast":
            return self.get(name).materialize(device="cpu", weights=self.bf16_weights(name))
        return self.get(name).materialize(device="cpu", weights=self.weights(name), copy=load == "copy" or None)

    def bf16_weights(self, name: str) -> str:
        """The eager model's floating tensors rounded to bfloat16, in one file: a load casts them back."""
        from safetensors.torch import save_file

        path = self.root / (name.replace("/", "_") + ".bf16.safetensors")
        if not path.exists():
            state, seen = {}, set()
            for key, t in self.eager(name).state_dict().items():
                if t.data_ptr() not in seen or not t.numel():  # a tie is saved once, as save_pretrained does
                    seen.add(t.data_ptr())
                    state[key] = t.to(torch.bfloat16) if t.is_floating_point() else t.contiguous()
            save_file(state, str(path))
        return str(path)

    def eager_for(self, name: str, load: str = "views") -> nn.Module:
        """The eager model the zoo model loaded `load`'s way must equal: for a cast, its values rounded as
        the file rounded them."""
        eager = self.eager(name)
        if load == "cast":
            with torch.no_grad():
                for t in eager.state_dict(keep_vars=True).values():  # what a file holds
                    if t.is_floating_point():
                        t.copy_(t.to(torch.bfloat16))
        return eager


# The three ways a CPU load fills a module: views of the file mapped copy-on-write (the default for a
# file in the model's dtype), owned memory read into (copy=True), and a cast from a bfloat16 file.
LOADS = ("views", "copy", "cast")


# --- training ------------------------------------------------------------------------------------------

OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}


def batch_of(case: Case, step: int, rank: int = 0, dtype: torch.dtype | None = None):
    """The inputs of one step (a rank's own under data parallelism); floating ones cast to dtype if given."""
    return _cast(case.batch(torch.Generator().manual_seed(1000 * rank + step)), dtype)


def _cast(batch, dtype):
    if dtype is None:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype) for k, v in batch.items()}
    return type(batch)(_cast(v, dtype) for v in batch)


def step_loss(model, case: Case, step: int, rank: int = 0, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The loss of one training forward. The global RNG is seeded first: whatever the forward draws
    (detection's box samplers) is the same on both sides."""
    batch = batch_of(case, step, rank, dtype)
    torch.manual_seed(100 + step)
    return case.loss(model, batch)


def train(
    model,
    case: Case,
    optimizer: str = "adamw",
    steps: int = 3,
    rank: int = 0,
    dtype: torch.dtype | None = None,
    autocast: bool = False,
):
    """`steps` optimizer steps in train mode (the forward under bf16 autocast if asked, inputs cast to
    dtype if given); returns the losses and the optimizer."""
    opt = OPTIMIZERS[optimizer](model.parameters())
    model.train()
    losses = []
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = step_loss(model, case, step, rank, dtype)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses, opt


def predict(model, case: Case) -> torch.Tensor:
    """An inference forward in eval mode: logits, or a segmentation's "out"."""
    model.eval()
    inputs = batch_of(case, 0)
    with torch.no_grad():
        if case.loss is _causal_lm:
            return model(input_ids=inputs).logits
        out = model(inputs[0])
    return out["out"] if case.loss is _segment else out


def differing(got: dict, want: dict) -> list[str]:
    """The keys whose tensors differ (in dtype, shape or any bit of a value), or are in only one dict."""
    keys = sorted(got.keys() ^ want.keys())
    for k in sorted(want.keys() & got.keys()):
        a, b = got[k], want[k]
        if not (a.dtype == b.dtype and torch.equal(a, b)):
            keys.append(k)
    return keys


def optimizer_tensors(opt) -> dict:
    """Every tensor of an optimizer's state (steps, moments, momentum buffers), by parameter index."""
    return {
        f"{i}.{k}": v
        for i, state in opt.state_dict()["state"].items()
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
    }


# --- spawned ranks --------------------------------------------------------------------------------------


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _full_state(model) -> dict:
    return {k: _full(v) for k, v in model.state_dict().items()}


def _run(label: str, out_dir: str, rank: int, check) -> None:
    """Run one check on this rank and save what it returns (or its traceback) for the test to compare. A
    barrier after each, so that a rank that failed early does not run ahead into the next check's collectives."""
    import torch.distributed as dist

    try:
        result = check()
    except Exception:
        result = {"error": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"{label}-{rank}.pt"))
    dist.barrier()


def _trained(model, case: Case, rank: int, steps: int = 3) -> dict:
    """Three AdamW steps: the losses, the full (gathered) weights, and how each parameter is placed."""
    losses, _ = train(model, case, "adamw", steps, rank)
    placements = {n: str(getattr(p, "placements", None)) for n, p in model.named_parameters()}
    return {"losses": losses, "state": _full_state(model), "placements": placements}


def _ddp(sample: Sample, name: str, rank: int, side: str) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    model = sample.eager(name) if side == "eager" else sample.zoo(name)
    return _trained(DistributedDataParallel(model), CASES[name], rank)  # each rank its own batch


def _blocks(model) -> list[nn.Module]:
    """The units FSDP2 shards one by one: a ViT's blocks, a MobileNet's feature blocks, a decoder's layers."""
    return list(getattr(model, "blocks", None) or getattr(model, "features", None) or model.model.layers)


def _fsdp(sample: Sample, name: str, rank: int, side: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    model = sample.eager(name) if side == "eager" else sample.get(name)
    for block in _blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if side == "zoo":  # sharded on meta: each rank reads its own rows
        model.materialize(device="cpu", weights=sample.weights(name))
    return _trained(model, CASES[name], rank)


def tp_plan(model) -> dict:
    """Megatron-style: q, k, v and the MLP's gate and up projections column-wise, o and down row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i in range(len(model.model.layers)):
        for proj in ("q_proj", "k_proj", "v_proj"):
            plan[f"model.layers.{i}.self_attn.{proj}"] = ColwiseParallel()
        plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        for proj in ("gate_proj", "up_proj"):
            plan[f"model.layers.{i}.mlp.{proj}"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    return plan


def sequence_parallel_plan(model) -> dict:
    """Megatron-style with sequence parallelism (as torchtitan plans a Llama): the norms and the residual stream
    sharded on the sequence dim (Shard(1)), gathered before attention and the MLP, scattered after them; the
    embedding row-wise and the head column-wise, which unties the tied pair (each is distributed apart)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    plan = {
        "model.embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        ),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        layer = f"model.layers.{i}"
        plan |= {f"{layer}.{norm}": SequenceParallel() for norm in ("input_layernorm", "post_attention_layernorm")}
        plan[f"{layer}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        )
        plan[f"{layer}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan |= {f"{layer}.self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
        plan |= {f"{layer}.mlp.{p}": ColwiseParallel() for p in ("gate_proj", "up_proj")}
        plan |= {
            f"{layer}.{p}": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
            for p in ("self_attn.o_proj", "mlp.down_proj")
        }
    return plan


def mlp_plan(model) -> dict:
    """What splits 4 ways in the tiny Llama (its 2 key/value heads do not): the embedding row-wise, the MLPs
    column- then row-wise, the head column-wise (the tied pair untied, as above)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),  # the token ids, whole on every rank
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        plan |= {f"model.layers.{i}.mlp.{p}": ColwiseParallel() for p in ("gate_proj", "up_proj")}
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    return plan


def _parallelize(sample: Sample, name: str, side: str, mesh, dp_mesh=None, plan=tp_plan) -> nn.Module:
    """Tensor parallel on `mesh` (and FSDP2 on `dp_mesh`): the eager model with its full weights, which the
    plan distributes; the zoo model on meta, before materialize, which then loads each rank's part."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    model = sample.eager(name) if side == "eager" else sample.get(name)
    parallelize_module(model, mesh, plan(model))
    if dp_mesh is not None:
        for block in _blocks(model):
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    if side == "zoo":
        model.materialize(device="cpu", weights=sample.weights(name))
    return model


def _tp(sample: Sample, name: str, rank: int, side: str, world: int = 2, plan=tp_plan) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    model = _parallelize(sample, name, side, init_device_mesh("cpu", (world,)), plan=plan)
    return _trained(model, CASES[name], rank=0)  # every rank of a tensor-parallel group sees the same batch


def _fsdp_tp(sample: Sample, name: str, rank: int, side: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _parallelize(sample, name, side, mesh["tp"], dp_mesh=mesh["dp"])
    return _trained(model, CASES[name], rank=mesh.get_local_rank("dp"))  # a batch per data-parallel rank


DDP_MODELS = ["torchvision/mobilenet_v3_small", LLAMA]
FSDP_MODELS = ["timm/vit_tiny_patch16_224", "torchvision/mobilenet_v3_small", LLAMA]  # BatchNorm trains sharded
TWO_RANK_CHECKS = (
    [(f"ddp-{n}", _ddp, n) for n in DDP_MODELS]
    + [(f"fsdp-{n}", _fsdp, n) for n in FSDP_MODELS]
    + [(f"tp-{LLAMA}", _tp, LLAMA), (f"sp-{LLAMA}", partial(_tp, plan=sequence_parallel_plan), LLAMA)]
)
FOUR_RANK_CHECKS = [
    (f"fsdp_tp-{LLAMA}", _fsdp_tp, LLAMA),
    (f"tp4-{LLAMA}", partial(_tp, world=4, plan=mlp_plan), LLAMA),
]


def label(check: str, side: str) -> str:
    return f"{check}-{side}".replace("/", "_")


def ranks_main(rank: int, world: int, init_file: str, root: str, hf_url: str, out_dir: str) -> None:
    """One rank (gloo, CPU): every check of its world size, eager side then zoo side, results saved to out_dir."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share two cores
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )  # a rank stuck in a collective fails, not hangs
    try:
        sample = Sample(root, hf_url)
        for check, fn, name in TWO_RANK_CHECKS if world == 2 else FOUR_RANK_CHECKS:
            for side in ("eager", "zoo"):
                _run(
                    label(check, side), out_dir, rank, lambda fn=fn, name=name, side=side: fn(sample, name, rank, side)
                )
    finally:
        dist.destroy_process_group()
