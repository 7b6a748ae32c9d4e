"""The streaming load (zoo.weights.stream): the chunk plan, bit-exact fills through it on CPU (ordinary
buffers, synchronous copies) and on CUDA (pinned ring, copy stream), and materialize on top of it."""

import os
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.test_materialize import _still_meta, assert_same_model, eager_model, save
from zoo import materialize as mat
from zoo.errors import CheckpointError, InvalidArgument
from zoo.weights import opening, stream
from zoo.weights.sources import SafetensorsSource
from zoo.weights.stream import plan_chunks, stream_into

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


# --- the plan, pure ----------------------------------------------------------------------------


def _check_plan(ranges, chunks, buffer_bytes):
    covered = {j: 0 for j, r in enumerate(ranges) if r[2]}
    for chunk in chunks:
        assert 0 < chunk.size <= buffer_bytes
        filled = {}  # buffer offset -> (fd, file offset) as the reads put it there
        for r in chunk.reads:
            filled.update({r.offset + k: (r.fd, r.start + k) for k in range(r.length)})
        assert sorted(filled) == list(range(chunk.size))  # the buffer is filled exactly, no gaps
        for p in chunk.pieces:
            fd, start, _ = ranges[p.job]
            assert p.at == covered[p.job], "a tensor's pieces come in order, none lost or repeated"
            assert all(filled[p.offset + k] == (fd, start + p.at + k) for k in range(p.length))
            covered[p.job] += p.length
    assert covered == {j: r[2] for j, r in enumerate(ranges) if r[2]}


@pytest.mark.parametrize("buffer_bytes", [1, 7, 64, 1000, 1 << 20])
def test_the_plan_puts_every_byte_once_where_it_belongs(buffer_bytes):
    rng = random.Random(buffer_bytes)
    for _ in range(20):
        ranges, offsets = [], {3: 0, 4: 0, 5: 0}
        for _ in range(rng.randrange(1, 40)):
            fd = rng.choice([3, 4, 5])
            offsets[fd] += rng.choice([0, 0, 0, rng.randrange(1, 50)])  # mostly back to back, sometimes a gap
            length = rng.choice([0, 1, 3, rng.randrange(1, 3000)])
            ranges.append((fd, offsets[fd], length))
            offsets[fd] += length
        rng.shuffle(ranges)
        _check_plan(ranges, plan_chunks(ranges, buffer_bytes), buffer_bytes)


def test_tensors_back_to_back_in_the_file_share_one_read():
    ranges = [(3, 100 + 4 * i, 4) for i in range(50)] + [(3, 1000, 8), (4, 1008, 8)]
    chunks = plan_chunks(ranges, 1 << 20)
    assert len(chunks) == 1 and len(chunks[0].pieces) == 52
    assert [(r.fd, r.start, r.length) for r in chunks[0].reads] == [(3, 100, 200), (3, 1000, 8), (4, 1008, 8)]
    big = plan_chunks([(3, 0, 10_000)], 4096)
    assert [c.size for c in big] == [4096, 4096, 1808] and [c.pieces[0].at for c in big] == [0, 4096, 8192]


# --- stream_into: bit for bit, on CPU and on CUDA ----------------------------------------------------


def _checkpoint(tmp_path, shards: int) -> tuple[list, dict]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "big": torch.randn(100, 300, generator=g),  # 120 kB: many 4 KiB chunks
        "bf16": torch.randn(37, 11, generator=g).to(torch.bfloat16),
        "half": torch.randn(5, 1000, generator=g).half(),
        "ids": torch.randint(0, 1 << 40, (129,), generator=g),
        "mask": torch.rand(77, generator=g) > 0.5,
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        **{f"tiny.{i}": torch.randn(i % 5 + 1, generator=g) for i in range(200)},  # many share one chunk
    }
    paths = []
    for s in range(shards):
        path = tmp_path / f"shard{s}.safetensors"
        save_file({k: v for i, (k, v) in enumerate(tensors.items()) if i % shards == s}, str(path))
        paths.append(path)
    return paths, {k: v for p in paths for k, v in load_file(str(p)).items()}


def _bytes(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _cast(dtype):
    return {
        torch.float32: torch.bfloat16,
        torch.bfloat16: torch.float32,
        torch.float16: torch.float32,
        torch.float64: torch.float16,
    }.get(dtype, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "buffer_bytes, ring, readers", [(4096, None, None), (1000, 1, 1), (4096, 2, 3), (1 << 20, None, None)]
)
@pytest.mark.parametrize("case", ["same", "cast", "rows", "rows+cast"])
@pytest.mark.parametrize("shards", [1, 3])
def test_stream_into_fills_every_tensor_bit_for_bit(tmp_path, device, buffer_bytes, ring, readers, case, shards):
    paths, want = _checkpoint(tmp_path, shards)
    jobs, expected = [], {}
    with SafetensorsSource(paths) as source:
        for key, value in want.items():
            rows = (
                (value.shape[0] // 3, value.shape[0] - 1)
                if "rows" in case and value.dim() > 1 and value.shape[0] > 2
                else None
            )
            value = value if rows is None else value[rows[0] : rows[1]]
            dtype = _cast(value.dtype) if "cast" in case else value.dtype
            dest = torch.empty(value.shape, dtype=dtype, device=device)
            dest.view(-1).view(torch.uint8).fill_(0xAB)  # bytes the stream misses would keep this
            jobs.append((key, dest, rows))
            expected[key] = value.to(dtype)
        stream_into(jobs, source, torch.device(device), buffer_bytes=buffer_bytes, ring=ring, readers=readers)
    for key, dest, _ in jobs:
        assert dest.device.type == device and dest.dtype == expected[key].dtype
        assert torch.equal(_bytes(dest), _bytes(expected[key])), key


def test_a_destination_that_is_not_contiguous_is_filled_through_staging(tmp_path):
    paths, want = _checkpoint(tmp_path, 1)
    dest = torch.empty(300, 100).t()
    with SafetensorsSource(paths) as source:
        stream_into([("big", dest, None)], source, torch.device("cpu"), buffer_bytes=4096)
    assert torch.equal(dest, want["big"])


@pytest.mark.parametrize("device", DEVICES)
def test_a_file_that_shrinks_mid_stream_raises_and_releases(tmp_path, device):
    paths, want = _checkpoint(tmp_path, 1)
    with SafetensorsSource(paths) as source:
        os.truncate(paths[0], os.path.getsize(paths[0]) // 2)
        jobs = [(k, torch.empty(v.shape, dtype=_cast(v.dtype), device=device), None) for k, v in want.items()]
        with pytest.raises(CheckpointError, match="early"):
            stream_into(jobs, source, torch.device(device), buffer_bytes=4096, ring=3, readers=2)


# --- materialize through the stream on CPU (forced), the path CUDA takes ------------------------------


def _count_plans(monkeypatch) -> list[int]:
    """The number of chunks of each streamed load (a wrapper around the plan only: one around
    stream_into would hold its jobs, and so the new tensors, in its frame)."""
    plans = []

    def counted(ranges, buffer_bytes):
        plans.append(len(chunks := plan_chunks(ranges, buffer_bytes)))
        return chunks

    monkeypatch.setattr(stream, "plan_chunks", counted)
    return plans


@pytest.fixture
def streamed(monkeypatch):
    """materialize streams safetensors on CPU too, through 4 KiB buffers; the chunks of each streamed load."""
    monkeypatch.setattr(mat, "STREAMED", ("cuda", "cpu"))
    monkeypatch.setattr(stream, "BUFFER_BYTES", 4096)
    return _count_plans(monkeypatch)


@pytest.mark.parametrize("name", ["timm/resnet18", "timm/vit_tiny_patch16_224", "user/tied"])
def test_materialize_streamed_on_cpu_round_trips_bit_exact(zoo_at, tmp_path, streamed, name):
    eager = eager_model(name)
    m = zoo_at.get(name)
    params = [id(p) for p in m.parameters()]
    m.materialize(weights=save(tmp_path, eager), copy=True)  # on CPU the default maps the file: nothing streams
    assert len(streamed) == 1 and streamed[0] >= (1 if name == "user/tied" else 1000)
    assert [id(p) for p in m.parameters()] == params
    assert_same_model(m, eager, name)
    assert name != "user/tied" or m.head.weight is m.embed.weight


def test_materialize_streamed_on_cpu_shards_and_casts(zoo_at, tmp_path, streamed):
    from huggingface_hub import split_torch_state_dict_into_shards

    eager = eager_model("timm/resnet18")
    state = {k: v.contiguous() for k, v in eager.state_dict().items()}
    split = split_torch_state_dict_into_shards(state, max_shard_size="5MB")
    for filename, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / filename))
    assert len(split.filename_to_tensors) > 2
    assert_same_model(zoo_at.get("timm/resnet18").materialize(weights=tmp_path, copy=True), eager, "timm/resnet18")
    m = zoo_at.get("timm/resnet18").materialize(weights=tmp_path, dtype=torch.bfloat16)
    assert len(streamed) == 2
    for k, v in state.items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert m.state_dict()[k].dtype == want.dtype and torch.equal(m.state_dict()[k], want), k


def test_a_failure_midway_leaves_the_module_on_meta_and_frees_what_it_allocated(
    zoo_at, tmp_path, streamed, monkeypatch
):
    """The header was valid when opened; the data runs out after many 4 KiB chunks went in. While the
    caller still holds the exception (and so its traceback), no new tensor is alive."""
    import weakref

    path = save(tmp_path, eager_model("timm/resnet18"))
    source = SafetensorsSource([path])
    os.truncate(path, os.path.getsize(path) * 3 // 4)
    # the source opened before the truncation, wherever the load opens one (.materialize opens it to learn
    # the checkpoint entry it reads, load_into again for a path)
    monkeypatch.setattr(opening, "open_source", lambda weights: source)
    monkeypatch.setattr(mat, "open_source", lambda weights: source)
    allocated, allocate = [], mat.allocate
    monkeypatch.setattr(mat, "allocate", lambda *a: [allocated.append(weakref.ref(t)) or t for t in allocate(*a)])
    m = zoo_at.get("timm/resnet18")
    with pytest.raises(CheckpointError, match="early") as failure:
        m.materialize(weights=path, dtype=torch.float16, copy=True)  # int64 buffers too: read, not mapped
    assert streamed and _still_meta(m)
    assert len(allocated) == len(m.state_dict()) and all(r() is None for r in allocated)
    assert failure.value.__traceback__ is not None


def test_copy_false_is_refused_off_cpu_before_anything_happens(zoo_at, tmp_path):
    path = save(tmp_path, eager_model("user/tied"))
    m = zoo_at.get("user/tied")
    for device in ("cuda", "cuda:0", "meta"):
        with pytest.raises(InvalidArgument, match="copy=False"):
            m.materialize(device=device, weights=path, copy=False)
    assert _still_meta(m)


# --- CUDA ------------------------------------------------------------------------------------------

CUDA_MODELS = ["timm/resnet18", "timm/vit_tiny_patch16_224", "timm/swin_tiny_patch4_window7_224", "user/tied"]


@needs_cuda
@pytest.mark.parametrize("name", CUDA_MODELS)  # swin and tied: non-persistent buffers; tied: a shared weight
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_cuda_round_trip_through_the_stream(zoo_at, tmp_path, monkeypatch, name, dtype):
    plans = _count_plans(monkeypatch)
    eager = eager_model(name)
    m = zoo_at.get(name)
    params = [id(p) for p in m.parameters()]
    m.materialize(device="cuda", weights=save(tmp_path, eager), dtype=dtype)
    assert len(plans) == 1
    assert [id(p) for p in m.parameters()] == params
    assert all(t.is_cuda for t in [*m.parameters(), *m.buffers()])
    assert name != "user/tied" or m.head.weight is m.embed.weight
    persistent = eager.state_dict()
    for k, v in persistent.items():
        want = v.to(dtype) if dtype is not None and v.is_floating_point() else v
        got = m.state_dict()[k]
        assert got.dtype == want.dtype and torch.equal(_bytes(got), _bytes(want)), k
    buffers = dict(m.named_buffers())
    for k, a in eager.named_buffers():
        if k not in persistent:  # constructed values, never cast unless cast_non_persistent
            assert buffers[k].dtype == a.dtype and torch.equal(buffers[k].cpu(), a), f"buffer {k}"
    if dtype is None:
        from tests.test_materialize import example_input

        eager.cuda().eval(), m.eval()
        x = example_input(name).cuda()
        with torch.no_grad():
            torch.testing.assert_close(m(x), eager(x))


@needs_cuda
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_cuda_failure_midway_leaves_meta_and_frees_device_memory(zoo_at, tmp_path, monkeypatch, dtype):
    path = save(tmp_path, eager_model("timm/vit_tiny_patch16_224"))
    source = SafetensorsSource([path])
    os.truncate(path, os.path.getsize(path) * 3 // 4)
    open_source = mat.open_source
    monkeypatch.setattr(mat, "open_source", lambda weights: source)
    monkeypatch.setattr(stream, "BUFFER_BYTES", 1 << 16)
    m = zoo_at.get("timm/vit_tiny_patch16_224")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(CheckpointError, match="early"):
        m.materialize(device="cuda", weights=path, dtype=dtype)
    assert torch.cuda.memory_allocated() == before
    assert _still_meta(m)
    monkeypatch.setattr(mat, "open_source", open_source)  # the same module loads from an intact file afterwards
    eager = eager_model("timm/vit_tiny_patch16_224")
    m.materialize(device="cuda", weights=save(tmp_path, eager, "ok.safetensors"))
    assert all(torch.equal(m.state_dict()[k].cpu(), v) for k, v in eager.state_dict().items())


@needs_cuda
def test_cuda_copy_false_is_refused(zoo_at, tmp_path):
    m = zoo_at.get("timm/resnet18")
    with pytest.raises(InvalidArgument, match="copy=False"):
        m.materialize(device="cuda", weights=save(tmp_path, eager_model("timm/resnet18")), copy=False)
    assert _still_meta(m)


def _fsdp_cuda_rank(rank, world, init_file, path, out_dir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import zoo

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = zoo.get("timm/vit_tiny_patch16_224")
        mesh = init_device_mesh("cuda", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.materialize(device="cuda", weights=path)
        local = {n: (p.to_local().device.index, p.to_local().shape[0]) for n, p in model.named_parameters() if p.dim()}
        state = {
            k: v.full_tensor().cpu() if hasattr(v, "full_tensor") else v.cpu() for k, v in model.state_dict().items()
        }
        torch.save({"state": state, "local": local}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed  # ranks spawned as processes
@needs_cuda
def test_cuda_fsdp2_each_rank_reads_its_rows_onto_its_device(zoo_at, tmp_path):
    """One process per GPU (two when there are two): each allocates and reads only its rows."""
    import torch.multiprocessing as mp

    world = min(torch.cuda.device_count(), 2)
    eager = eager_model("timm/vit_tiny_patch16_224")
    mp.spawn(_fsdp_cuda_rank, args=(world, str(tmp_path / "init"), save(tmp_path, eager), str(tmp_path)), nprocs=world)
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert all(torch.equal(got["state"][k], v) for k, v in eager.state_dict().items())
        for n, p in eager.named_parameters():
            if p.dim():
                chunk = -(-p.shape[0] // world)
                assert got["local"][n] == (rank, min(chunk, p.shape[0] - rank * chunk)), n
