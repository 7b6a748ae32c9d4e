"""materialize: exact round trips, every weight format, key maps, dtype, strictness, atomic failure, init."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import zoo
from tests.conftest import ROOT
from zoo.errors import CheckpointError, InvalidArgument, WeightsMismatch

ROUND_TRIP = [
    "timm/resnet18",
    "timm/swin_tiny_patch4_window7_224",
    "timm/vit_tiny_patch16_224",
    "torchvision/mobilenet_v3_small",
    "torchvision/resnet18",
    "user/tied",
]


def eager_model(name: str, seed: int = 0):
    """The model as its library builds it, for real, under a seed."""
    family, builder = name.split("/", 1)
    torch.manual_seed(seed)
    if family == "timm":
        import timm

        return timm.create_model(builder)
    if family == "torchvision":
        from tests.test_whole_zoo import eager_build

        return eager_build(family, builder)  # no weights, no backbone weights
    from tests.builders import tied_net

    return tied_net()


def example_input(name: str):
    if name == "user/tied":
        return torch.randint(0, 32, (2, 5))
    info = zoo.info(name)
    return torch.randn(2, *(info.input_size or (3, 224, 224)))


def save(tmp_path, model, name="w.safetensors") -> str:
    """The model's state dict in a safetensors file whose data starts 64-byte aligned: a default load maps
    each tensor that lies at a multiple of 64 (save_file itself aligns to 8 only)."""
    path = tmp_path / name
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if (
        "head.weight" in state
        and state["head.weight"].data_ptr() == state.get("embed.weight", torch.empty(0)).data_ptr()
    ):
        del state["head.weight"]  # safetensors stores a shared tensor once, as save_pretrained does
    save_file(state, str(path))
    return pad_header(path)


def pad_header(path, data_at: int = 0) -> str:
    """Pad a safetensors file's header with spaces (JSON allows them; safetensors pads so itself) until its
    tensor data starts `data_at` bytes past a multiple of 64."""
    with open(path, "r+b") as f:
        header = f.read(int.from_bytes(f.read(8), "little")).rstrip(b" ")
        data = f.read()
        size = len(header) + (data_at - 8 - len(header)) % 64
        f.seek(0)
        f.write(size.to_bytes(8, "little") + header.ljust(size) + data)
        f.truncate()
    return str(path)


def file_offsets(path) -> dict[str, int]:
    """Where each tensor starts in a safetensors file, in bytes from the file's start."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return {k: 8 + size + v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}


def assert_same_model(got, eager, name):
    got_state, eager_state = got.state_dict(), eager.state_dict()
    assert got_state.keys() == eager_state.keys()
    for k in eager_state:
        assert got_state[k].dtype == eager_state[k].dtype and torch.equal(got_state[k], eager_state[k]), k
    for (k, a), (_, b) in zip(eager.named_buffers(), got.named_buffers()):
        assert torch.equal(a, b), f"buffer {k}"
    eager.eval(), got.eval()
    x = example_input(name)
    with torch.no_grad():
        assert torch.equal(got(x), eager(x))


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip_is_bit_exact(zoo_at, tmp_path, name):
    eager = eager_model(name)
    path = save(tmp_path, eager)
    m = zoo_at.get(name)
    params_before = [id(p) for p in m.parameters()]
    assert m.materialize(device="cpu", weights=path) is m
    assert [id(p) for p in m.parameters()] == params_before  # identity kept: hooks and optimizers hold them
    assert all(not t.is_meta for t in [*m.parameters(), *m.buffers()])
    assert_same_model(m, eager, name)


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_no_weights_initializes_as_the_constructor_does(zoo_at, name):
    eager = eager_model(name, seed=7)
    torch.manual_seed(7)
    m = zoo_at.get(name).materialize()
    assert_same_model(m, eager, name)


def test_ties_stay_one_parameter_loaded_once(zoo_at, tmp_path):
    eager = eager_model("user/tied")
    m = zoo_at.get("user/tied").materialize(weights=save(tmp_path, eager))
    assert m.head.weight is m.embed.weight
    assert torch.equal(m.head.weight, eager.embed.weight)
    assert len(list(m.parameters())) == len(list(eager.parameters()))


def untied(zoo_at, **options):
    """The tied net with its head given a parameter of its own on meta, as tensor parallelism does when it
    distributes a tied embedding and head apart (tests/test_dropin.py)."""
    m = zoo_at.get("user/tied", **options)
    m.head.weight = nn.Parameter(torch.empty_like(m.head.weight))
    return m


def assert_apart_and_equal(m, want: torch.Tensor) -> None:
    """Both tensors hold `want`, each in memory of its own: a step on one leaves the other as it was."""
    assert m.head.weight is not m.embed.weight
    assert torch.equal(m.head.weight, want) and torch.equal(m.embed.weight, want)
    with torch.no_grad():
        m.head.weight.add_(1)
    assert torch.equal(m.embed.weight, want)


@pytest.mark.parametrize("copy", [None, True, False])
def test_a_tie_broken_on_meta_fills_both_tensors_from_its_one_key_each_with_its_own_memory(zoo_at, tmp_path, copy):
    """The file keeps the tie's one key; both are read from it (copy=False: two private mappings)."""
    eager = eager_model("user/tied")
    m = untied(zoo_at)
    m.materialize(weights=save(tmp_path, eager), copy=copy)
    assert_apart_and_equal(m, eager.embed.weight)


def test_a_tie_broken_on_meta_initializes_both_as_the_constructor_does(zoo_at):
    eager = eager_model("user/tied", seed=5)
    torch.manual_seed(5)
    assert_apart_and_equal(untied(zoo_at).materialize(), eager.embed.weight)


def test_a_lazy_load_fills_the_untied_head_from_the_key_of_an_embedding_set_since(zoo_at, tmp_path):
    eager = eager_model("user/tied")
    m = untied(zoo_at, weights=save(tmp_path, eager), dispatch="lazy")
    mine = torch.zeros(32, 8)
    m.embed.weight = nn.Parameter(mine)  # the user's: the lazy load leaves it as it is
    m(example_input("user/tied"))
    assert m.embed.weight.data_ptr() == mine.data_ptr() and torch.equal(m.head.weight, eager.embed.weight)


def test_a_head_of_another_shape_is_missing_not_filled_from_the_tie(zoo_at, tmp_path):
    m = zoo_at.get("user/tied")
    m.head = nn.Linear(8, 5, bias=False, device="meta")
    with pytest.raises(zoo.WeightsMismatch, match=r"missing: head\.weight"):
        m.materialize(weights=save(tmp_path, eager_model("user/tied")))


def test_formats_pickles_shards_and_state_dicts(zoo_at, tmp_path):
    from huggingface_hub import split_torch_state_dict_into_shards

    eager = eager_model("timm/resnet18")
    state = {k: v.contiguous() for k, v in eager.state_dict().items()}
    for suffix in (".pt", ".pth", ".bin"):
        torch.save(state, tmp_path / f"w{suffix}")
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "trainer.ckpt")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    split = split_torch_state_dict_into_shards(state, max_shard_size="5MB")
    for filename, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in keys}, str(sharded / filename))
    index = sharded / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": split.tensor_to_filename}))
    assert len(split.filename_to_tensors) > 2
    for weights in [
        *(tmp_path / f"w{s}" for s in (".pt", ".pth", ".bin")),
        tmp_path / "trainer.ckpt",
        sharded,
        index,
        state,
    ]:
        m = zoo_at.get("timm/resnet18").materialize(weights=weights)
        assert_same_model(m, eager, "timm/resnet18")


def test_wrapper_prefixes_and_key_maps(zoo_at, tmp_path):
    eager = eager_model("timm/resnet18")
    state = eager.state_dict()
    for prefix in ("module.", "model."):
        m = zoo_at.get("timm/resnet18").materialize(weights={prefix + k: v for k, v in state.items()})
        assert_same_model(m, eager, "timm/resnet18")
    renamed = {k.replace("fc.", "classifier."): v for k, v in state.items()}
    with pytest.raises(WeightsMismatch):
        zoo_at.get("timm/resnet18").materialize(weights=renamed)
    as_dict = {k: k.replace("classifier.", "fc.") for k in renamed}
    m = zoo_at.get("timm/resnet18").materialize(weights=renamed, key_map=as_dict)
    assert_same_model(m, eager, "timm/resnet18")
    m = zoo_at.get("timm/resnet18").materialize(weights=renamed, key_map=lambda k: k.replace("classifier.", "fc."))
    assert_same_model(m, eager, "timm/resnet18")


def test_dtype_casts_parameters_and_float_buffers_only(zoo_at, tmp_path):
    eager = eager_model("timm/swin_tiny_patch4_window7_224")
    path = save(tmp_path, eager)
    m = zoo_at.get("timm/swin_tiny_patch4_window7_224").materialize(weights=path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    for k, p in m.named_parameters():
        assert torch.equal(p, eager.get_parameter(k).to(torch.bfloat16))
    buffers = dict(m.named_buffers())
    assert buffers["layers.0.blocks.0.attn.relative_position_index"].dtype == torch.int64
    bn = zoo_at.get("timm/resnet18").materialize(
        weights=save(tmp_path, eager_model("timm/resnet18"), "r.safetensors"), dtype=torch.float16
    )
    assert bn.bn1.running_mean.dtype == torch.float16 and bn.bn1.num_batches_tracked.dtype == torch.int64


def test_float_non_persistent_buffers_are_cast_only_if_asked(zoo_at, tmp_path):
    from tests.builders import reads_values
    from zoo.materialize import materialize
    from zoo.meta import force_meta

    with force_meta():
        net = reads_values()
    state = {k: torch.randn(v.shape) for k, v in net.state_dict().items()}
    materialize(net, weights=state, dtype=torch.bfloat16)
    assert net.rates.dtype == torch.float32 and net[0].weight.dtype == torch.bfloat16
    assert torch.allclose(net.rates, torch.linspace(0, 0.1, 4))
    with force_meta():
        net = reads_values()
    materialize(net, weights=state, dtype=torch.bfloat16, cast_non_persistent=True)
    assert net.rates.dtype == torch.bfloat16


def _still_meta(m) -> bool:
    """Read without listing parameters(): on a lazy module that is a use, and loads."""
    return all(
        t is None or t.is_meta for mod in m.modules() for t in [*mod._parameters.values(), *mod._buffers.values()]
    )


def test_strict_errors_name_the_keys_and_change_nothing(zoo_at):
    state = eager_model("timm/resnet18").state_dict()
    m = zoo_at.get("timm/resnet18")
    missing = {k: v for k, v in state.items() if k != "fc.bias"}
    with pytest.raises(WeightsMismatch, match="1 missing: fc.bias") as err:
        m.materialize(weights=missing)
    assert isinstance(err.value, ValueError) and err.value.missing == ["fc.bias"]
    with pytest.raises(WeightsMismatch, match="unexpected: extra.weight"):
        m.materialize(weights={**state, "extra.weight": torch.zeros(1)})
    with pytest.raises(WeightsMismatch, match=r"misshaped: fc.weight \(file \[10, 512\], model \[1000, 512\]\)"):
        m.materialize(weights={**state, "fc.weight": torch.zeros(10, 512)}, strict=False)
    assert _still_meta(m)


def test_strict_false_gives_missing_keys_the_constructors_values(zoo_at):
    eager = eager_model("timm/resnet18", seed=3)
    state = eager.state_dict()
    torch.manual_seed(3)
    m = zoo_at.get("timm/resnet18").materialize(
        weights={k: v for k, v in state.items() if not k.startswith("fc.")} | {"stray": torch.zeros(2)}, strict=False
    )
    assert torch.equal(m.fc.weight, eager.fc.weight)  # the constructor under the same seed made both
    assert torch.equal(m.conv1.weight, eager.conv1.weight)


def test_a_truncated_file_leaves_the_module_on_meta(zoo_at, tmp_path):
    path = save(tmp_path, eager_model("timm/resnet18"))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    m = zoo_at.get("timm/resnet18")
    with pytest.raises(CheckpointError, match="outside the data"):
        m.materialize(weights=path)
    assert _still_meta(m)


def test_a_shard_that_shrinks_mid_load_leaves_the_module_on_meta(zoo_at, tmp_path):
    """The header was valid when opened; the data runs out while reading: nothing is swapped in."""
    from zoo.materialize import materialize
    from zoo.weights.sources import SafetensorsSource

    path = save(tmp_path, eager_model("timm/resnet18"))
    source = SafetensorsSource([tmp_path / "w.safetensors"])
    os.truncate(path, os.path.getsize(path) // 2)
    m = zoo_at.get("timm/resnet18")
    with pytest.raises(CheckpointError, match="early"):
        from zoo import materialize as mat
        from zoo.load_options import LoadOptions

        mat._load(mat.slots_of(m), source, LoadOptions.of("cpu", copy=True))
    assert _still_meta(m)
    with pytest.raises(CheckpointError):
        materialize(m, weights=path)
    assert _still_meta(m)


def test_the_default_load_maps_the_file_and_copy_true_owns_its_memory(zoo_at, tmp_path):
    """Same dtype on CPU: every tensor the file holds 64-byte aligned is a view of a private mapping of the
    file, each with a storage of its own, and the others are copies; copy=True: none is a view. Each load keeps no
    descriptor open (a process that loads many models would run out), and writing to a mapped tensor never reaches the
    file."""
    path = save(tmp_path, eager_model("timm/resnet18"))
    models = [zoo_at.get("timm/resnet18").materialize(weights=path)]  # the registry's connection opened
    before = os.listdir("/proc/self/fd")
    models += [zoo_at.get("timm/resnet18").materialize(weights=path) for _ in range(2)]
    assert len(os.listdir("/proc/self/fd")) == len(before)
    for m in models:
        state = m.state_dict()
        assert_views_where_aligned(state, path)
        assert len({t.untyped_storage().data_ptr() for t in state.values()}) == len(state)
    with open(path, "rb") as f:
        on_disk = f.read()
    with torch.no_grad():
        models[0].fc.weight.add_(1)
    with open(path, "rb") as f:
        assert f.read() == on_disk
    owned = zoo_at.get("timm/resnet18").materialize(weights=path, copy=True)
    ranges = _mappings_of(path)
    assert not any(lo <= t.data_ptr() < hi for t in owned.state_dict().values() for lo, hi in ranges)
    del models, m, state
    import gc

    gc.collect()
    assert _mappings_of(path) == []  # unmapped with the last tensor over it


def test_a_file_rewritten_after_it_was_opened_is_refused_before_it_is_mapped(zoo_at, tmp_path):
    """The same size, other bytes (a save over the same path, in place): the views would show the new
    values under the old header's check. Refused, and the module stays on meta."""
    import time

    from zoo.weights.sources import SafetensorsSource

    path = save(tmp_path, eager_model("timm/resnet18"))
    for copy in (None, True):
        source = SafetensorsSource([tmp_path / "w.safetensors"])
        time.sleep(0.02)  # past the file system's timestamp granularity
        with open(path, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"\x01\x02\x03\x04")
        m = zoo_at.get("timm/resnet18")
        with pytest.raises(CheckpointError, match="written while it was being loaded"):
            m.materialize(weights=source, copy=copy)
        assert _still_meta(m)
        source.close()


def test_a_pickle_with_code_is_refused_and_never_runs(zoo_at, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"fc.weight": Payload()}, path)
    m = zoo_at.get("timm/resnet18")
    with pytest.raises(CheckpointError, match="weights-only"):
        m.materialize(weights=path)
    assert not marker.exists() and _still_meta(m)


@pytest.mark.parametrize(
    "lie, message",
    [
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 20]}}, "outside the data"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, "8 bytes for shape"),
        (
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
            },
            "overlap",
        ),
        ({"w": {"dtype": "F99", "shape": [4], "data_offsets": [0, 16]}}, "malformed"),
        ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, "non-negative"),
    ],
)
def test_a_lying_safetensors_header_is_a_clear_error(tmp_path, lie, message):
    import struct

    from zoo.materialize import materialize
    from zoo.meta import force_meta

    header = json.dumps(lie).encode()
    path = tmp_path / "lie.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(32))
    with force_meta():
        net = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointError, match=message):
        materialize(net, weights=path)
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(CheckpointError, match="exceeds the file"):
        materialize(net, weights=path)
    assert _still_meta(net)


def _mappings_of(path) -> list[tuple[int, int]]:
    """The address ranges at which `path` is mapped into this process (Linux: /proc/self/maps)."""
    real, ranges = os.path.realpath(path), []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") == real:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def assert_views_where_aligned(state: dict, path) -> None:
    """Each tensor the file holds at a multiple of 64 bytes is a view of the mapped file; no other is."""
    ranges, offsets = _mappings_of(path), file_offsets(path)
    mapped = {k: any(lo <= t.data_ptr() < hi for lo, hi in ranges) for k, t in state.items()}
    assert mapped == {k: offsets[k] % 64 == 0 for k in state}
    assert any(mapped.values()) and not all(mapped.values())  # the file holds tensors of both kinds


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings from /proc")
def test_a_tensor_the_file_holds_unaligned_is_copied_so_it_computes_as_the_librarys(zoo_at, tmp_path):
    """PyTorch allocates tensors 64-byte aligned, and its one-thread kernels (MKL's) round by alignment: the
    default load copies the tensors a file holds elsewhere, so the model computes as the library's own, bit
    for bit; copy=False maps them all the same."""
    name = "torchvision/mobilenet_v3_small"
    eager = eager_model(name)
    path = pad_header(save(tmp_path, eager), data_at=8)
    loaded = zoo_at.get(name).materialize(weights=path)
    assert_views_where_aligned(loaded.state_dict(), path)
    views = zoo_at.get(name).materialize(weights=path, copy=False)
    ranges = _mappings_of(path)
    assert all(any(lo <= t.data_ptr() < hi for lo, hi in ranges) for t in views.state_dict().values())
    x, threads = example_input(name), torch.get_num_threads()

    def training_forward(model):
        torch.manual_seed(0)  # dropout draws alike
        return model.train()(x)

    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS for each rank
    try:
        assert torch.equal(training_forward(loaded), training_forward(eager))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings from /proc")
def test_zero_copy_views_of_the_mapped_file(zoo_at, tmp_path):
    eager = eager_model("timm/resnet18")
    path = save(tmp_path, eager)
    before = open(path, "rb").read()
    m = zoo_at.get("timm/resnet18").materialize(weights=path, copy=False)
    assert_same_model(m, eager, "timm/resnet18")
    mapped = _mappings_of(path)
    assert mapped, "the weights file is not mapped"
    for name, t in m.state_dict().items():  # each value lies inside the file's mapping: not a copy
        assert any(start <= t.data_ptr() and t.data_ptr() + t.nbytes <= end for start, end in mapped), name
    with torch.no_grad():
        m.fc.weight.zero_()  # copy-on-write: the file never changes
    assert open(path, "rb").read() == before


def test_a_file_that_cannot_be_mapped_is_read_instead(tmp_path):
    """Under `ulimit -v` a 4 GiB file cannot be mapped whole, though the part a model loads fits: the default
    load reads those tensors instead (it raised OSError), and copy=False says why it cannot map them."""
    weight, bias = torch.randn(256, 256), torch.randn(256)
    header = {
        "weight": {"dtype": "F32", "shape": [256, 256], "data_offsets": [0, weight.nbytes]},
        "bias": {"dtype": "F32", "shape": [256], "data_offsets": [weight.nbytes, weight.nbytes + bias.nbytes]},
        "unused": {
            "dtype": "F32",
            "shape": [1 << 30],
            "data_offsets": [weight.nbytes + bias.nbytes, weight.nbytes + bias.nbytes + (4 << 30)],
        },
    }
    text = json.dumps(header).encode()
    text += b" " * ((56 - len(text)) % 64)  # the data 64-byte aligned: the default load would map it
    path = tmp_path / "big.safetensors"
    try:
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text + weight.numpy().tobytes() + bias.numpy().tobytes())
            f.truncate(8 + len(text) + weight.nbytes + bias.nbytes + (4 << 30))  # a hole: no disk
        torch.save({"weight": weight, "bias": bias}, tmp_path / "expected.pt")
        code = (
            "import resource, sys, torch\n"
            "from torch import nn\n"
            "from zoo.errors import MaterializeError\n"
            "from zoo.materialize import materialize\n"
            "size = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) << 10\n"
            "resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))\n"
            "expected = torch.load(sys.argv[2])\n"
            "with torch.device('meta'):\n"
            "    m, refused = nn.Linear(256, 256), nn.Linear(256, 256)\n"
            "materialize(m, weights=sys.argv[1], strict=False)\n"
            "assert all(torch.equal(m.state_dict()[k], v) for k, v in expected.items())\n"
            "try:\n"
            "    materialize(refused, weights=sys.argv[1], strict=False, copy=False)\n"
            "    raise SystemExit('copy=False loaded views it cannot map')\n"
            "except MaterializeError as e:\n"
            "    assert 'copy=False' in str(e) and 'cannot map' in str(e), e\n"
            "assert refused.weight.is_meta\n"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(path), str(tmp_path / "expected.pt")],
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    finally:
        path.unlink(missing_ok=True)


def test_copy_false_refuses_what_it_would_copy_before_allocating(zoo_at, tmp_path):
    """copy=False insists on views: a cast or a pickle would be copied, so it is refused and nothing loads."""
    eager = eager_model("timm/resnet18")
    pickled = tmp_path / "w.pt"
    torch.save(eager.state_dict(), pickled)
    for weights, dtype in ((save(tmp_path, eager), torch.bfloat16), (str(pickled), None)):
        m = zoo_at.get("timm/resnet18")
        with pytest.raises(InvalidArgument, match="copy=False: .*weight.* cannot be views of the file"):
            m.materialize(weights=weights, dtype=dtype, copy=False)
        assert _still_meta(m)


def test_lazy_dispatch_materializes_on_first_forward(zoo_at, tmp_path):
    eager = eager_model("timm/resnet18")
    m = zoo_at.get("timm/resnet18", weights=save(tmp_path, eager), dispatch="lazy")
    assert _still_meta(m)
    x = example_input("timm/resnet18")
    m.eval(), eager.eval()
    with torch.no_grad():
        assert torch.equal(m(x), eager(x))
    assert not _still_meta(m) and not m._forward_pre_hooks


def test_a_failed_lazy_load_keeps_the_hook_until_a_load_works(zoo_at, tmp_path):
    path = tmp_path / "later.safetensors"
    m = zoo_at.get("timm/resnet18", weights=str(path), dispatch="lazy")
    x = example_input("timm/resnet18")
    with pytest.raises(CheckpointError, match="no such weights file"):
        m(x)
    assert _still_meta(m) and m._forward_pre_hooks  # not a meta-tensor error on the next call
    eager = eager_model("timm/resnet18")
    save_file(dict(eager.state_dict()), str(path))
    m.eval(), eager.eval()
    with torch.no_grad():
        assert torch.equal(m(x), eager(x))
    assert not m._forward_pre_hooks


def test_a_gotten_module_pickles_and_materializes_after_loading(zoo_at, tmp_path):
    import pickle

    eager = eager_model("timm/resnet18")
    back = pickle.loads(pickle.dumps(zoo_at.get("timm/resnet18")))
    assert _still_meta(back)
    assert_same_model(back.materialize(weights=save(tmp_path, eager)), eager, "timm/resnet18")
    torch.manual_seed(0)
    initialized = pickle.loads(pickle.dumps(zoo_at.get("timm/resnet18"))).materialize()
    for k, v in eager_model("timm/resnet18", seed=0).state_dict().items():
        assert torch.equal(initialized.state_dict()[k], v), k


def test_a_pickled_module_loads_a_file_after_its_registry_is_gone(tmp_path):
    import pickle

    registry = zoo.connect(str(tmp_path / "r.db"))
    registry.index_builder("tests.builders:tied_net", "tied")
    eager = eager_model("user/tied")
    path = save(tmp_path, eager)
    frozen = pickle.dumps(registry.get("user/tied"))
    (tmp_path / "r.db").unlink()  # a file path needs no registry: only a tag does
    assert_same_model(pickle.loads(frozen).materialize(weights=path), eager, "user/tied")


def test_a_modules_zoo_state_is_one_typed_object(zoo_at, tmp_path):
    """What zoo.get knows about a module (recipe, row, tag, inputs) is one ZooState under one attribute, beside
    its .materialize; it survives deepcopy and pickle, and a lazy load waits on .materialize, not on a key."""
    import copy
    import pickle

    from zoo.load import Materializer
    from zoo.state import ZooState, state_of

    m = zoo_at.get("timm/resnet18")
    zoo_keys = [k for k in vars(m) if "zoo" in k]
    assert zoo_keys == ["_zoo"] and type(vars(m)["_zoo"]) is ZooState and state_of(m) is vars(m)["_zoo"]
    assert type(vars(m)["materialize"]) is Materializer and m.materialize.module is m
    state = state_of(m)
    assert (state.recipe.family, state.recipe.builder, state.name, state.url) == (
        "timm",
        "resnet18",
        "timm/resnet18",
        zoo_at.connect().url,
    )
    for twin in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert state_of(twin) == state and twin.materialize.module is twin
    assert state_of(torch.nn.Sequential(m)) is None  # a wrapper is not the module zoo.get returned
    lazy = zoo_at.get("timm/resnet18", weights=save(tmp_path, eager_model("timm/resnet18")), dispatch="lazy")
    assert lazy.materialize.pending is not None and [k for k in vars(lazy) if "zoo" in k] == ["_zoo"]
    lazy.state_dict()
    assert lazy.materialize.pending is None and not _still_meta(lazy)


@pytest.mark.parametrize("name", ["timm/resnet18", "timm/swin_tiny_patch4_window7_224"])
def test_dtype_alone_gives_the_meta_module_in_that_dtype_as_timm_builds_it(zoo_at, tmp_path, name):
    import timm

    m = zoo_at.get(name, dtype=torch.bfloat16)
    want = timm.create_model(name.removeprefix("timm/"), dtype=torch.bfloat16, device="meta")
    got = {n: (t.dtype, t.is_meta) for n, t in [*m.named_parameters(), *m.named_buffers()]}
    assert got == {n: (t.dtype, True) for n, t in [*want.named_parameters(), *want.named_buffers()]}
    eager = eager_model(name)
    m.materialize(weights=save(tmp_path, eager))  # an fp32 file into the bf16 module: cast on the way in
    assert all(torch.equal(t, eager.state_dict()[k].to(t.dtype)) for k, t in m.state_dict().items())
    m = zoo_at.get(name, device="cpu", dtype=torch.bfloat16)
    assert m.get_classifier().weight.dtype == torch.bfloat16


def test_get_with_weights_is_a_one_liner(zoo_at, tmp_path):
    eager = eager_model("timm/vit_tiny_patch16_224")
    m = zoo_at.get("timm/vit_tiny_patch16_224", weights=save(tmp_path, eager), device="cpu")
    assert_same_model(m, eager, "timm/vit_tiny_patch16_224")


def test_module_hooks_survive_materialize(zoo_at, tmp_path):
    m = zoo_at.get("timm/resnet18")
    seen = []
    m.fc.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    m.materialize(weights=save(tmp_path, eager_model("timm/resnet18")))
    m(torch.randn(1, 3, 64, 64))
    assert seen == [(1, 1000)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_round_trip(zoo_at, tmp_path):
    eager = eager_model("timm/resnet18")
    m = zoo_at.get("timm/resnet18").materialize(device="cuda", weights=save(tmp_path, eager), dtype=torch.float16)
    assert all(t.is_cuda for t in [*m.parameters(), *m.buffers()])
    for k, v in eager.state_dict().items():
        want = v.to(torch.float16) if v.is_floating_point() else v
        assert torch.equal(m.state_dict()[k].cpu(), want), k


def test_check_reports_from_metadata_alone(zoo_at, tmp_path):
    eager = eager_model("timm/resnet18")
    state = {k: v.contiguous() for k, v in eager.state_dict().items()}
    good = save(tmp_path, eager)
    assert zoo_at.check("timm/resnet18", good).exact
    bad = {k: v for k, v in state.items() if k != "fc.bias"}
    bad["fc.weight"] = torch.zeros(10, 512)
    bad["extra"] = torch.zeros(1)
    bad["conv1.weight"] = state["conv1.weight"].half()
    save_file(bad, str(tmp_path / "bad.safetensors"))
    result = zoo_at.check("timm/resnet18", tmp_path / "bad.safetensors")
    assert result.missing == ["fc.bias"] and result.unexpected == ["extra"]
    assert result.misshaped == [("fc.weight", (10, 512), (1000, 512))]
    assert result.dtype_mismatched == [("conv1.weight", "float16", "float32")]
    torch.save(bad, tmp_path / "bad.pt")
    assert zoo_at.check("timm/resnet18", tmp_path / "bad.pt").as_dict() == result.as_dict()


def test_check_cli_needs_no_torch_for_safetensors(small_registry, tmp_path):
    path = save(tmp_path, eager_model("timm/resnet18"))
    code = f"import sys, zoo\nassert zoo.check('timm/resnet18', {path!r}).exact\nassert 'torch' not in sys.modules\n"
    env = {"ZOO_REGISTRY": small_registry.removeprefix("sqlite:///"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def test_weights_by_tag_are_sha256_checked(small_registry, tmp_path):
    from tests.conftest import cli_json, run_cli, sqlite_copy

    url = sqlite_copy(small_registry, tmp_path / "reg.db")  # timm/resnet18 among others, a copy this test writes
    registry = zoo.connect(url)
    eager = eager_model("timm/resnet18")
    path = save(tmp_path, eager)
    out = cli_json("weights", "add", "timm/resnet18", path, registry=url)
    assert out["tag"] == "default" and len(out["sha256"]) == 64
    assert registry.info("timm/resnet18").weights[0]["path"] == path
    assert_same_model(registry.get("timm/resnet18").materialize(weights="default"), eager, "timm/resnet18")
    assert "weights default" in run_cli("show", "timm/resnet18", registry=url).stdout
    with open(path, "r+b") as f:  # the file changes after it was recorded
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x00\x80\x7f")
    m = registry.get("timm/resnet18")
    with pytest.raises(CheckpointError, match="sha256"):
        m.materialize(weights="default")
    assert _still_meta(m)
    with pytest.raises(CheckpointError, match="tags: default"):
        m.materialize(weights="imagenet")
    bad = tmp_path / "bad.safetensors"
    save_file({"fc.weight": torch.zeros(3)}, str(bad))
    proc = run_cli("weights", "add", "timm/resnet18", str(bad), "--tag", "bad", registry=url, check=False)
    assert proc.returncode == 1 and "misshaped" in proc.stderr
    check = run_cli("check", "timm/resnet18", str(bad), "--json", registry=url, check=False)
    assert check.returncode == 1 and json.loads(check.stdout)["misshaped"] == [["fc.weight", [3], [1000, 512]]]


def test_plain_tensor_attributes_get_their_constructed_values(zoo_at):
    """torchvision's anchor generator keeps cell anchors as a plain list of tensors: in no state dict."""
    name = "torchvision/fasterrcnn_mobilenet_v3_large_fpn"
    eager = eager_model(name)
    m = zoo_at.get(name).materialize(weights=eager.state_dict())
    anchors = m.rpn.anchor_generator.cell_anchors
    assert all(torch.equal(a, b) for a, b in zip(anchors, eager.rpn.anchor_generator.cell_anchors))
    m.eval(), eager.eval()
    images = [torch.rand(3, 200, 240)]
    with torch.no_grad():
        got, want = m(images)[0], eager(images)[0]
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def _fsdp_rank(rank, world, init_file, weights, out_dir):
    """One rank: fully_shard the meta modules, materialize them, save what this rank sees."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        for name, path in weights.items():
            for tag, source in (("loaded", path), ("initialized", None)):
                model = zoo.get(name)
                for block in getattr(model, "blocks", []):
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
                before = dict(model.named_parameters())
                torch.manual_seed(0)
                model.materialize(weights=source)
                assert all(p is before[n] for n, p in model.named_parameters()), "parameter identity lost"
                local_rows = {n: p.to_local().shape[0] for n, p in model.named_parameters() if p.dim()}
                state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
                model.eval()
                torch.manual_seed(123)
                with torch.no_grad():
                    out = model(example_input(name))
                tied = name == "user/tied" and model.head.weight is model.embed.weight
                torch.save(
                    {"state": state, "out": out, "rows": local_rows, "tied": tied},
                    f"{out_dir}/{name.replace('/', '_')}-{tag}-{rank}.pt",
                )
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed  # ranks spawned as processes
def test_fsdp2_fully_shard_on_meta_then_materialize_loads_each_ranks_rows(zoo_at, tmp_path):
    """fully_shard applied to the meta module (2 CPU ranks, gloo): each rank allocates and reads only its
    rows, parameters keep their identity, and the gathered state and forward equal the eager model's."""
    import torch.multiprocessing as mp

    names = ["timm/vit_tiny_patch16_224", "user/tied"]
    weights = {name: save(tmp_path, eager_model(name), f"{name.replace('/', '_')}.safetensors") for name in names}
    mp.spawn(_fsdp_rank, args=(2, str(tmp_path / "init"), weights, str(tmp_path)), nprocs=2)
    for name in names:
        eager = eager_model(name)
        eager.eval()
        torch.manual_seed(123)
        with torch.no_grad():
            want = eager(example_input(name))
        for tag in ("loaded", "initialized"):
            ranks = [torch.load(tmp_path / f"{name.replace('/', '_')}-{tag}-{r}.pt") for r in range(2)]
            for k, v in eager.state_dict().items():
                assert all(torch.equal(r["state"][k], v) for r in ranks), f"{name} {tag}: {k}"
            for n, p in eager.named_parameters():
                if p.dim():
                    half = -(-p.shape[0] // 2)
                    assert [r["rows"][n] for r in ranks] == [half, p.shape[0] - half], n
            assert all(torch.equal(r["out"], want) for r in ranks), f"{name} {tag}: forward"
            assert name != "user/tied" or all(r["tied"] for r in ranks)
