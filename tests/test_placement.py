"""DTensors of any placement materialize to exactly what distribute_tensor gives each rank: Shard on any
dim, 2D meshes, uneven shards, FSDP2's _StridedShard over tensor parallelism. Every rank of a 4-rank
mesh is checked in this process through torch's fake process group (no collective runs: each rank's
part is computed locally, as distribute_tensor(..., src_data_rank=None) computes it); the gloo tests
in tests/test_dropin.py run the same loads on real ranks."""

import itertools

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from zoo.materialize import materialize
from zoo.weights.placement import box_slices, local_box
from zoo.weights.sources import SafetensorsSource

PLACEMENTS = [
    (Replicate(), Replicate()),
    (Shard(0), Replicate()),
    (Replicate(), Shard(1)),
    (Shard(0), Shard(1)),
    (Shard(1), Shard(0)),
    (Shard(1), Shard(1)),
    (Shard(0), Shard(0)),
    (Shard(2), Shard(1)),
]
SHAPES = [(7, 5, 3), (2, 9, 4), (1, 1, 5), (8, 8, 2)]  # uneven, fewer rows than ranks, even


def ranks(world: int = 4, mesh_shape=(2, 2)):
    """Each rank of a fake world in turn, with its ("dp", "tp") mesh; the process group is torn down after each."""
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            yield rank, init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
        finally:
            dist.destroy_process_group()


def test_the_local_box_is_exactly_what_distribute_tensor_gives_each_rank():
    fulls = [torch.arange(torch.Size(s).numel(), dtype=torch.float32).reshape(s) for s in SHAPES]
    for _, mesh in ranks():
        for full, placements in itertools.product(fulls, PLACEMENTS):
            want = distribute_tensor(full, mesh, placements, src_data_rank=None)
            assert torch.equal(full[box_slices(local_box(want))], want.to_local()), (tuple(full.shape), placements)


def test_a_plain_tensor_has_no_box():
    assert local_box(torch.empty(3, device="meta")) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_safetensors_reads_any_box_of_a_tensor(tmp_path, dtype):
    full = torch.randn(6, 5, 4, 3).to(dtype)
    save_file({"t": full}, tmp_path / "t.safetensors")
    boxes = [
        ((0, 6), (0, 5), (0, 4), (0, 3)),
        ((2, 5), (0, 5), (0, 4), (0, 3)),
        ((0, 6), (1, 4), (0, 4), (0, 3)),
        ((1, 3), (2, 3), (1, 4), (0, 2)),
        ((5, 6), (4, 5), (3, 4), (2, 3)),
        ((0, 6), (0, 5), (0, 4), (1, 2)),
    ]
    with SafetensorsSource([tmp_path / "t.safetensors"]) as source:
        for box in boxes:
            for into in (dtype, torch.float64):  # the file's dtype (read in place), and a cast
                dest = torch.empty([e - s for s, e in box], dtype=into)
                source.read_into("t", dest, box)
                assert torch.equal(dest, full[box_slices(box)].to(into)), (box, into)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(6, 10)
        self.down = nn.Linear(10, 5)  # 10 and 5 rows: uneven over 2 and over 4 ranks
        self.norm = nn.LayerNorm(5)


def parallelized(model: nn.Module, mesh, fsdp: bool) -> nn.Module:
    """Column-wise up, row-wise down (Shard(0), Shard(1)) on the tp dim; with fsdp, fully_shard on the
    dp dim over that (FSDP2 x TP: _StridedShard and 2D placements)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    if fsdp:
        fully_shard(model, mesh=mesh["dp"])
    return model


def _parallel_rank(rank, world, init_file, path, failures):
    """One gloo rank: the eager model parallelized from its full weights (torch scatters rank 0's), and
    the meta model parallelized, then materialized from the file, a state dict, and the DCP checkpoint
    the parallel eager model saved; every local tensor must be equal."""
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        state = torch.load(path.replace(".safetensors", ".pt"))
        for fsdp in (False, True):
            eager = Net()
            eager.load_state_dict(state)
            want = dict(parallelized(eager, mesh, fsdp).named_parameters())
            checkpoint = f"{path}.dcp{int(fsdp)}"  # what a parallel training run saves: each rank its shards
            dcp.save(eager.state_dict(), checkpoint_id=checkpoint)
            with torch.device("meta"):
                model = Net()
            parallelized(model, mesh, fsdp)
            before = dict(model.named_parameters())
            for weights in (path, state, checkpoint):
                materialize(model, weights=weights)
                assert all(p is before[n] for n, p in model.named_parameters()), "identity"
                for name, p in model.named_parameters():
                    placements = getattr(p, "placements", None)
                    assert placements == getattr(want[name], "placements", None), name
                    got, expected = (p, want[name]) if placements is None else (p.to_local(), want[name].to_local())
                    if not torch.equal(got, expected):
                        failures.put(f"rank {rank} fsdp={fsdp} {name} {placements}")
                    if placements is not None:
                        failures.put(("seen", tuple(type(pl).__name__ for pl in placements)))
                model = Net().to_empty(device="meta")  # the next load starts on meta again
                parallelized(model, mesh, fsdp)
                before = dict(model.named_parameters())
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed  # ranks spawned as processes
@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_and_fsdp2_over_tp_load_each_ranks_part_on_gloo(tmp_path, world):
    """Parallelized while on meta, then materialized (from a file, a state dict and a DCP checkpoint that
    the same parallel layout saved): on every rank each local tensor is the one torch's tensor
    parallelism and FSDP2 cut from the full weights (a 1x2 and a 2x2 mesh; 10 and 5 rows: uneven over
    2 and 4)."""
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    state = {k: v.clone() for k, v in Net().state_dict().items()}
    save_file(state, tmp_path / "net.safetensors")
    torch.save(state, tmp_path / "net.pt")
    failures = mp.get_context("spawn").SimpleQueue()
    mp.spawn(
        _parallel_rank, args=(world, str(tmp_path / "init"), str(tmp_path / "net.safetensors"), failures), nprocs=world
    )
    seen, bad = set(), []
    while not failures.empty():
        item = failures.get()
        (seen.add(item[1]) if isinstance(item, tuple) else bad.append(item))
    assert not bad
    assert {("Shard",), ("Replicate",), ("_StridedShard", "Shard") if world == 4 else ("Shard",)} <= seen


def test_a_cast_converts_the_mapped_file_chunk_by_chunk_exactly(tmp_path, monkeypatch):
    """The one-pass cast walks the file in chunks (16 MiB; 100 bytes here, so every tensor spans many,
    with a chunk that ends mid-page and a short last one) and each lands at its own place."""
    from zoo.weights import sources

    monkeypatch.setattr(sources, "_CAST_CHUNK", 100)
    state = {"a": torch.randn(37, 11), "b": torch.randn(5000), "c": torch.randn(3, 2, 7).double()}
    save_file(state, tmp_path / "t.safetensors")
    with SafetensorsSource([tmp_path / "t.safetensors"]) as source:
        for key, want in state.items():
            for into in (torch.bfloat16, torch.float16):
                dest = torch.empty(want.shape, dtype=into)
                source.read_into(key, dest)
                assert torch.equal(dest, want.to(into)), (key, into)
        rows = torch.empty(20, 11, dtype=torch.bfloat16)
        source.read_into("a", rows, ((10, 30), (0, 11)))
        assert torch.equal(rows, state["a"][10:30].to(torch.bfloat16))
