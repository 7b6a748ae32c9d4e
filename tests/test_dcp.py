"""DcpSource: torch.distributed.checkpoint directories saved for real, from one process and from two gloo
ranks with FSDP2, read back in one process; boxes, casts, key groups, bad and malicious input."""

import gc
import os
import pickle
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from zoo.errors import CheckpointError
from zoo.weights.dcp import DcpSource
from zoo.weights.opening import open_source
from zoo.weights.sources import Spec


def save(state_dict, path):
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore")
        dcp.save(state_dict, checkpoint_id=str(path), no_dist=True)
    return path


def read(source, name, box=None, dtype=None):
    spec = source.specs[name]
    shape = spec.shape if box is None else tuple(b - a for a, b in box)
    dest = torch.empty(shape, dtype=dtype or getattr(torch, spec.dtype))
    source.read_into(name, dest, box)
    return dest


def same(a, b) -> bool:
    """Bitwise equal: same dtype, shape and bytes (a NaN equals itself)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def _bytes(t):
    return t.clone(memory_format=torch.contiguous_format).view(-1).view(torch.uint8)


def small_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """timm resnet18's state dict (one conv weight channels_last, one tensor bf16) saved as {"model", "optim"}."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18")
    state = model.state_dict()
    state["conv1.weight"] = state["conv1.weight"].contiguous(memory_format=torch.channels_last)
    state["fc.bias"] = state["fc.bias"].to(torch.bfloat16)
    optim = {"lr": torch.tensor(0.1), "state": {"fc.weight": torch.randn(1000, 512)}, "step": 3}
    path = save({"model": state, "optim": optim}, tmp_path_factory.mktemp("dcp") / "resnet")
    return model, state, path


def test_single_rank_every_tensor_bitwise(resnet):
    _, state, path = resnet
    with open_source(str(path)) as source:
        assert isinstance(source, DcpSource)
        assert source.specs == {k: Spec(str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in state.items()}
        for name, value in state.items():
            assert same(read(source, name), value), name
        assert source.tensors["conv1.weight"].chunks[0].layout[3] is False  # the channels_last path was taken
        opened = list(source.fds.values())
    assert opened and source.fds == {}
    for fd in opened:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed


def test_boxes_and_casts(resnet):
    _, state, path = resnet
    with DcpSource(path) as source:
        for name, box in [
            ("fc.weight", ((3, 10), (0, 512))),
            ("fc.weight", ((0, 1000), (100, 300))),
            ("fc.weight", ((7, 8), (5, 6))),
            ("conv1.weight", ((1, 4), (0, 3), (2, 5), (0, 7))),
            ("conv1.weight", ((0, 64), (1, 2), (0, 7), (3, 4))),
            ("layer1.0.bn1.bias", ((5, 60),)),
            ("fc.bias", ((10, 20),)),
            ("fc.weight", ((4, 4), (0, 512))),
        ]:
            expected = state[name][tuple(slice(a, b) for a, b in box)]
            assert same(read(source, name, box), expected), (name, box)
            assert same(read(source, name, box, torch.float16), expected.to(torch.float16)), (name, box)
        assert same(read(source, "fc.weight", dtype=torch.bfloat16), state["fc.weight"].to(torch.bfloat16))
        assert same(
            read(source, "bn1.num_batches_tracked", dtype=torch.float32), state["bn1.num_batches_tracked"].float()
        )
        with pytest.raises(ValueError):
            read(source, "fc.weight", ((0, 1001), (0, 512)))


def test_only_the_needed_rows_are_read(resnet, tmp_path):
    """The data file is cut off inside fc.weight's last row once the source is open: the rows before it
    still read, so they were read without it; the last row is a CheckpointError naming the file."""
    _, state, path = resnet
    for f in os.listdir(path):
        (tmp_path / f).write_bytes((path / f).read_bytes())
    data = tmp_path / next(f for f in os.listdir(tmp_path) if f.endswith(".distcp"))
    last = state["fc.weight"][-1].numpy().tobytes()
    at = data.read_bytes().find(last)
    assert at > 0
    with DcpSource(tmp_path) as source:
        read(source, "fc.weight", ((0, 1), (0, 512)))  # the chunk's archive is parsed while it is whole
        os.truncate(data, at + 100)
        assert same(read(source, "fc.weight", ((0, 999), (0, 512))), state["fc.weight"][:999])
        assert same(read(source, "fc.weight", ((3, 9), (7, 20))), state["fc.weight"][3:9, 7:20])
        with pytest.raises(CheckpointError, match=f"{data.name}: .*truncated"):
            read(source, "fc.weight", ((990, 1000), (0, 512)))


def test_groups_and_keys(tmp_path):
    """{"model": sd, ...} exposes sd's keys; a model whose own keys start with "model." (a Llama) keeps them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).to(torch.bfloat16)
    state = llama.state_dict()
    assert "lm_head.weight" in state and "model.embed_tokens.weight" in state
    plain = save(state, tmp_path / "plain")
    grouped = save(
        {"model": state, "optim": {"exp_avg": {k: torch.zeros(2) for k in state}}, "epoch": 2}, tmp_path / "grouped"
    )
    for path in (plain, grouped):
        with DcpSource(path) as source:
            assert source.specs == {k: Spec("bfloat16", tuple(v.shape)) for k, v in state.items()}
            assert all(same(read(source, k), v) for k, v in state.items())
    metadata = _metadata(grouped)
    metadata.planner_data = None  # a planner that records no key paths: the "model." prefix alone decides
    _write_metadata(grouped, metadata)
    with DcpSource(grouped) as source:
        assert set(source.specs) == set(state)


# --- two ranks, FSDP2 -------------------------------------------------------------------------


def _rank(rank: int, tmp: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)  # the ranks share two cores with the test process
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )  # a rank stuck in a collective fails, not hangs
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = small_model()
        model.append(nn.Embedding(1, 4))  # one row over two ranks: rank 1 holds an empty shard
        for layer in (model[0], model[2], model[3]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        state = model.state_dict()
        state["columns"] = distribute_tensor(torch.arange(35.0).reshape(7, 5), mesh, [Shard(1)])  # 3 + 2 columns
        dcp.save(state, checkpoint_id=f"{tmp}/checkpoint")
        # Shut down in step, holding nothing of the group: a CI run once saw rank 0 abort ("terminate
        # called without an active exception") when a rank tore gloo down while its peer still had work
        # in flight, or freed DTensors that referenced the group during interpreter exit.
        del model, state, mesh
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    torch.multiprocessing.spawn(_rank, args=(str(tmp),), nprocs=2)
    model = small_model()
    model.append(nn.Embedding(1, 4))
    expected = {k: v.detach() for k, v in model.state_dict().items()}
    expected["columns"] = torch.arange(35.0).reshape(7, 5)
    return tmp / "checkpoint", expected


def test_two_ranks_read_in_one_process(two_ranks):
    path, expected = two_ranks
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    with DcpSource(path) as source:
        chunks = {k: [(c.offsets, c.sizes) for c in t.chunks] for k, t in source.tensors.items()}
        assert chunks["0.weight"] == [((0, 0), (3, 6)), ((3, 0), (2, 6))]  # uneven: 5 rows
        assert chunks["columns"] == [((0, 0), (7, 3)), ((0, 3), (7, 2))]  # split on dim 1
        assert chunks["3.weight"] == [((0, 0), (1, 4))]  # the empty shard is no chunk to read
        assert source.specs == {k: Spec("float32", tuple(v.shape)) for k, v in expected.items()}
        for name, value in expected.items():
            assert same(read(source, name), value), name
        for name, box in [
            ("0.weight", ((2, 4), (1, 5))),
            ("columns", ((1, 6), (2, 4))),
            ("0.bias", ((1, 5),)),
            ("columns", ((0, 7), (3, 5))),
            ("2.weight", ((1, 3), (0, 5))),
        ]:
            value = expected[name][tuple(slice(a, b) for a, b in box)]
            assert same(read(source, name, box), value), (name, box)
            assert same(read(source, name, box, torch.float64), value.double()), (name, box)


def test_only_intersecting_chunks_are_read(two_ranks, tmp_path):
    """With rank 1's file emptied after opening, boxes inside rank 0's chunks still read; one touching it fails."""
    path, expected = two_ranks
    for f in os.listdir(path):
        (tmp_path / f).write_bytes((path / f).read_bytes())
    with DcpSource(tmp_path) as source:
        (tmp_path / "__1_0.distcp").write_bytes(b"")
        assert same(read(source, "0.weight", ((0, 3), (0, 6))), expected["0.weight"][:3])
        assert same(read(source, "columns", ((2, 7), (0, 3))), expected["columns"][2:, :3])
        with pytest.raises(CheckpointError, match="__1_0.distcp"):
            read(source, "columns", ((0, 1), (2, 4)))


# --- bad input --------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path):
    model = small_model()
    return save(model.state_dict(), tmp_path / "small"), model.state_dict()


def _metadata(path):
    with open(path / ".metadata", "rb") as f:  # the test's own file: plain pickle is fine here
        return pickle.load(f)


def _write_metadata(path, metadata):
    with open(path / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


class Shell:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class OpenFile:
    def __init__(self, where):
        self.where = where

    def __reduce__(self):
        return open, (self.where, "w")


@pytest.mark.parametrize("payload", ["system", "open", "nested"])
def test_malicious_metadata_runs_nothing(small, tmp_path, payload):
    path, _ = small
    marker = tmp_path / "pwned"
    if payload == "nested":  # a real Metadata with code hidden in a field zoo never reads
        metadata = _metadata(path)
        metadata.planner_data = {"x": Shell(f"touch {marker}")}
        _write_metadata(path, metadata)
    else:
        evil = Shell(f"touch {marker}") if payload == "system" else OpenFile(str(marker))
        (path / ".metadata").write_bytes(pickle.dumps(evil))
    with pytest.raises(CheckpointError, match="never runs a pickle's code"):
        open_source(str(path))
    assert not marker.exists()


def test_malicious_chunk_pickle_runs_nothing(tmp_path):
    path = save({"t": torch.ones(2)}, tmp_path / "small")
    marker = tmp_path / "pwned"
    data = next(f for f in os.listdir(path) if f.endswith(".distcp"))
    torch.save(Shell(f"touch {marker}"), path / data)  # the chunk's archive: a pickle that runs a shell
    metadata = _metadata(path)
    for info in metadata.storage_data.values():
        info.offset, info.length = 0, os.path.getsize(path / data)
    _write_metadata(path, metadata)
    with DcpSource(path) as source, pytest.raises(CheckpointError, match="weights-only"):
        read(source, "t")
    assert not marker.exists()


def test_truncated_data_file(small):
    path, _ = small
    data = path / next(f for f in os.listdir(path) if f.endswith(".distcp"))
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=f"{data.name}.*truncated"):
        open_source(str(path))


def test_metadata_points_past_the_end(small):
    path, _ = small
    metadata = _metadata(path)
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == "2.weight")
    info.offset += os.path.getsize(path / info.relative_path)
    _write_metadata(path, metadata)
    with pytest.raises(CheckpointError, match=f"{info.relative_path}: the chunk of 2.weight"):
        DcpSource(path)


def test_corrupt_chunk_bytes(small):
    path, _ = small
    metadata = _metadata(path)
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == "0.weight")
    data = path / info.relative_path
    raw = bytearray(data.read_bytes())
    raw[info.offset + info.length - 22 : info.offset + info.length] = bytes(22)  # the zip's end record
    data.write_bytes(raw)
    with DcpSource(path) as source:
        assert same(read(source, "0.bias"), small[1]["0.bias"])
        with pytest.raises(CheckpointError, match=f"{data.name}: the chunk of 0.weight"):
            read(source, "0.weight")


def test_missing_data_file(small):
    path, _ = small
    for f in os.listdir(path):
        if f.endswith(".distcp"):
            os.remove(path / f)
    with pytest.raises(CheckpointError, match="no such DCP data file"):
        open_source(str(path))


def test_chunks_that_do_not_tile(small):
    path, _ = small
    metadata = _metadata(path)
    chunk = metadata.state_dict_metadata["0.weight"].chunks[0]
    chunk.sizes = torch.Size([4, 6])
    _write_metadata(path, metadata)
    with pytest.raises(CheckpointError, match="do not add up"):
        DcpSource(path)


def test_data_file_outside_the_directory(small):
    path, _ = small
    metadata = _metadata(path)
    next(iter(metadata.storage_data.values())).relative_path = "../elsewhere.distcp"
    _write_metadata(path, metadata)
    with pytest.raises(CheckpointError, match="not a plain file name"):
        DcpSource(path)


def test_metadata_not_a_file(tmp_path):
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "d" / ".metadata")
    with pytest.raises(CheckpointError, match="FIFO"):
        open_source(str(tmp_path / "d"))


# --- end to end -------------------------------------------------------------------------------


def test_materialize_from_dcp(resnet):
    import timm

    from zoo.materialize import materialize

    eager, _, path = resnet
    with torch.device("meta"):
        module = timm.create_model("resnet18")
    materialize(module, weights=str(path))
    expected = eager.state_dict()
    expected["fc.bias"] = expected["fc.bias"].to(torch.bfloat16).float()  # saved in bf16, cast back on load
    for name, value in module.state_dict().items():
        assert same(value, expected[name]), name
