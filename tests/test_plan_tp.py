"""zoo.plan under tensor parallelism: per-rank weights, gradients and optimizer states against a real
parallelize_module with the documented plan (zoo.planning.TP_COLWISE / TP_ROWWISE by module name), alone and under
FSDP2 (2D), over gloo ranks."""

import json
from datetime import timedelta
from pathlib import Path

import pytest
import transformers

import zoo
from zoo.errors import InvalidArgument
from zoo.planning import TP_COLWISE, TP_ROWWISE, PlanOptions, model_states, shape_groups

TINY = "hf/test-org/tiny-llama-tp"
VIT = "timm/vit_tiny_patch16_224"  # attn.qkv (fused), attn.proj, mlp.fc1, mlp.fc2: the plan's names
# (model, tp, fsdp) on each world size: TP alone, and FSDP2 over TP on a (fsdp, tp) mesh
LAYOUTS = {2: [(TINY, 2, 1), (VIT, 2, 1)], 4: [(TINY, 4, 1), (VIT, 4, 1), (TINY, 2, 2)]}
# Attention reshapes its projections to this rank's heads: plain local tensors. The MLP's stay DTensors into the
# row-wise layer: a local shard made a DTensor again is taken for an even one (4 x 43 = 172 of 170 columns).
LOCAL_OUTPUT = ("q_proj", "k_proj", "v_proj", "qkv")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A registry with a tiny Llama indexed from its config: heads and key-value heads divide 4; an intermediate
    size that does not (170 = 43 + 43 + 43 + 41), so the last TP rank holds fewer columns."""
    root = tmp_path_factory.mktemp("plan_tp")
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=170,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=250,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config.save_pretrained(root / "tiny-llama")
    url = f"sqlite:///{root / 'tiny.db'}"
    assert zoo.connect(url).index("hf", [str(root / "tiny-llama")], name=TINY).failed == {}
    return url


def registry_of(name: str, tiny: str) -> zoo.Zoo:
    return zoo.Zoo(tiny if name == TINY else None)


def _storage_bytes(tensors) -> int:
    """The bytes of the storages behind the tensors' local shards, each storage once: what the rank holds."""
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def _parallelized(name: str, tiny: str, tp: int, fsdp: int):
    """The model zoo builds on meta, parallelize_module-d with the documented plan over the TP sub-mesh, each block
    and the root fully_shard-ed over the FSDP sub-mesh where fsdp > 1, then materialized by zoo (each rank's part)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (fsdp, tp), mesh_dim_names=("fsdp", "tp"))
    # vit_tiny has 3 heads, which neither 2 nor 4 divides: built with 4 (same tensors, 48-wide heads)
    model = registry_of(name, tiny).get(name, **({"num_heads": 4} if name == VIT else {}))
    plan = {}
    for path, module in model.named_modules():
        last = path.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and last in TP_COLWISE:
            plan[path] = ColwiseParallel(use_local_output=last in LOCAL_OUTPUT)
        elif isinstance(module, torch.nn.Linear) and last in TP_ROWWISE:
            plan[path] = RowwiseParallel()
        if hasattr(module, "qkv") and hasattr(module, "num_heads"):  # timm's Attention: its heads on this rank
            module.num_heads //= tp
            module.attn_dim //= tp
    parallelize_module(model, mesh["tp"], plan)
    if fsdp > 1:
        stacks = [m for m in model.modules() if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))]
        for block in max(stacks, key=len):
            fully_shard(block, mesh=mesh["fsdp"])
        fully_shard(model, mesh=mesh["fsdp"])
    return model.materialize(device="cpu")


def _rank(rank: int, world: int, tiny: str, out: str) -> None:
    import gc

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    try:
        result = {}
        for name, tp, fsdp in LAYOUTS[world]:
            model = _parallelized(name, tiny, tp, fsdp)
            torch.manual_seed(0)
            if name == TINY:
                loss = model(torch.randint(0, 250, (1, 16))).logits.float().sum()
            else:  # batch 2: at batch 1 cls_token's gradient is a view of the whole token gradient, 197 x 192 floats
                loss = model(torch.randn(2, 3, 224, 224)).float().sum()
            loss.backward()
            gradients = _storage_bytes([p.grad for p in model.parameters()])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
            opt.step()
            states = _storage_bytes([v for s in opt.state.values() for v in s.values()])
            # after the step: FSDP2's lazy init (the first forward) moves a shard zoo materialized unpadded into
            # its padded buffer
            weights = _storage_bytes([*model.parameters(), *model.buffers()])
            result[f"{name} tp={tp} fsdp={fsdp}"] = {"weights": weights, "gradients": gradients, "optimizer": states}
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
def measured(tiny, tmp_path_factory) -> dict:
    """{world: {rank: {"NAME tp=T fsdp=F": {weights, gradients, optimizer}}}} from real ranks."""
    return {world: _spawn(world, tiny, tmp_path_factory.mktemp(f"tp_{world}")) for world in LAYOUTS}


def _planned(name: str, tiny: str, tp: int, fsdp: int, rank: int) -> dict:
    info = registry_of(name, tiny).info(name, tensors=True)
    o = PlanOptions(hardware="cpu", devices=tp * fsdp, fsdp=fsdp, tp=tp, training=True, dtype="fp32")
    return model_states(shape_groups(info.tensor_table), o.checked(), rank)


@pytest.mark.parametrize(
    "world, name, tp, fsdp", [(w, *layout) for w, layouts in LAYOUTS.items() for layout in layouts]
)
def test_tp_model_states_are_a_real_parallelize_modules_on_every_rank(measured, tiny, world, name, tp, fsdp):
    for rank, result in measured[world].items():
        assert _planned(name, tiny, tp, fsdp, rank) == result[f"{name} tp={tp} fsdp={fsdp}"], f"rank {rank}"


def test_the_vit_built_with_four_heads_has_the_tensors_its_row_records():
    table = {t.name: tuple(t.shape) for t in zoo.info(VIT, tensors=True).tensor_table if t.kind == "parameter"}
    assert {n: tuple(p.shape) for n, p in zoo.get(VIT, num_heads=4).named_parameters()} == table


def test_the_last_tp_rank_holds_fewer_columns_of_an_uneven_split(measured):
    """170 MLP columns over 4 ranks: 43 on ranks 0-2, 41 on rank 3, unpadded (unlike FSDP2's dim-0 shards)."""
    ranks = measured[4]
    key = f"{TINY} tp=4 fsdp=1"
    assert ranks[0][key] == ranks[1][key] == ranks[2][key]
    # 2 layers x 3 MLP matrices x 2 columns x 64 rows x 4 bytes fewer weights on rank 3
    assert ranks[0][key]["weights"] - ranks[3][key]["weights"] == 2 * 3 * 2 * 64 * 4


def test_tp_divides_what_the_plan_splits_and_keeps_the_rest_whole(tiny):
    """The split layers' bytes are divided by tp; embeddings, norms and the output head stay whole."""
    table = registry_of(TINY, tiny).info(TINY, tensors=True).tensor_table
    names = {*TP_COLWISE, *TP_ROWWISE}
    whole = sum(t.numel for t in table if t.kind == "parameter" and t.name.split(".")[-2] not in names)
    split = sum(t.numel for t in table if t.kind == "parameter") - whole
    o = PlanOptions(hardware="cpu", devices=2, tp=2, training=True, dtype="fp32", optimizer="sgd").checked()
    assert model_states(shape_groups(table), o)["gradients"] == 4 * (whole + split // 2)  # 170 splits evenly over 2


def test_a_plan_with_tp_holds_rank_zeros_model_states(measured, tiny):
    p = registry_of(TINY, tiny).plan(TINY, hardware="cpu", devices=4, tp=4, training=True, dtype="fp32", batch=1)
    assert {k: p.per_device[k] for k in ("weights", "gradients", "optimizer")} == measured[4][0][f"{TINY} tp=4 fsdp=1"]


def test_a_vision_row_without_heads_is_refused_tp():
    """timm rows record no heads, so zoo.plan refuses tp > 1 for the ViT whose states the plan gets right above."""
    with pytest.raises(InvalidArgument, match="must divide the attention heads"):
        zoo.plan(VIT, hardware="H100", devices=2, tp=2)
