"""What bad weight files and bad materialize arguments get (and a fuzz test).

Each test is named after the point it covers. Every bad input gets a zoo error (CheckpointError,
WeightsMismatch, MaterializeError, InvalidArgument: each also a ValueError or RuntimeError) with a
message that names the file and says what to do; nothing is recorded, and the module keeps every
original tensor, on meta. Files are real: torch.save, safetensors, zip rewrites, FIFOs, symlinks.
"""

import json
import os
import struct
import threading
import weakref
import zipfile

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import zoo
from zoo.errors import CheckpointError, InvalidArgument, MaterializeError, WeightsMismatch
from zoo.weights.sources import SafetensorsSource

NAME = "user/tied"


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    """A writable registry holding the tied test model (tests.builders:tied_net)."""
    from zoo.indexing import indexer
    from zoo.recipe import Recipe

    url = f"sqlite:///{tmp_path_factory.mktemp('bad_input') / 'reg.db'}"
    indexer.index_one(url, NAME, Recipe("user", "tests.builders:tied_net"), trusted={"tests"})
    return zoo.connect(url)


def state(seed: int = 0) -> dict:
    """The tied model's state dict with real values (embed.weight and head.weight are one tensor)."""
    from tests.builders import tied_net

    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in tied_net().state_dict().items() if k != "head.weight"}


def tensors_of(m) -> dict:
    return {**dict(m.named_parameters(remove_duplicate=False)), **dict(m.named_buffers(remove_duplicate=False))}


def assert_untouched(m, before: dict) -> None:
    """Every tensor is still the very object it was, on meta: nothing was swapped or assigned."""
    now = tensors_of(m)
    assert now.keys() == before.keys()
    for name, t in now.items():
        assert t is before[name] and t.is_meta, name


def bounded(fn, seconds: float = 30):
    """fn() in a thread: its exception or result; a call that blocks (open() on a FIFO) fails the test."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} still blocked after {seconds}s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def rewrite_zip(src, dst, change) -> None:
    """Copy a torch.save zip record by record, passing each record's bytes through change(name, data)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change(info.filename, zin.read(info.filename)))


def write_safetensors(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


# --- 1. a zip .pt whose storage record is shorter than the pickle says ------------------------


def test_1_a_zip_pt_with_a_short_storage_record_is_refused_by_load_check_add_and_index(reg, tmp_path):
    good, short = tmp_path / "good.pt", tmp_path / "short.pt"
    # a large storage after the cut one: a mapping of the cut record's size reads on into it
    torch.save({"state_dict": state(), "optimizer": torch.zeros(100_000)}, good)
    rewrite_zip(good, short, lambda name, data: data[:4] if name.endswith("/data/0") else data)
    silently = torch.load(short, weights_only=True, mmap=True)  # torch itself reads garbage here
    assert silently["state_dict"]["scale"].shape == (8,)  # data/0: the first tensor in the state dict

    m = reg.get(NAME)
    before = tensors_of(m)
    with pytest.raises(CheckpointError, match=r"short.pt: storage '0' needs 32 bytes but its record data/0 is 4 bytes"):
        m.materialize(weights=short)
    assert_untouched(m, before)
    with pytest.raises(CheckpointError, match="record data/0 is 4 bytes"):
        reg.check(NAME, short)
    with pytest.raises(CheckpointError, match="record data/0 is 4 bytes"):
        reg.add_weights(NAME, short, tag="short")
    assert "short" not in [w["tag"] for w in reg.info(NAME).weights]
    with pytest.raises(CheckpointError, match="record data/0 is 4 bytes"):
        reg.index_checkpoint(short, name="checkpoint/short")
    assert m.materialize(weights=good) is m  # the same file uncut loads


# --- 2. legacy (non-zip) torch.save files -----------------------------------------------------


def test_2_a_legacy_non_zip_pt_loads_and_check_add_index_agree(reg, tmp_path):
    legacy = tmp_path / "legacy.pth"
    want = state(seed=1)
    torch.save(want, legacy, _use_new_zipfile_serialization=False)
    m = reg.get(NAME).materialize(weights=legacy)
    for k, v in want.items():
        assert torch.equal(m.state_dict()[k], v), k
    assert reg.check(NAME, legacy).exact
    assert len(reg.add_weights(NAME, legacy, tag="legacy")) == 64
    assert reg.index_checkpoint(legacy, name="checkpoint/legacy")["params"] == sum(v.numel() for v in want.values())
    again = reg.get(NAME).materialize(weights="legacy")  # by its recorded tag
    assert torch.equal(again.proj.weight, want["proj.weight"])


def test_2_a_legacy_pickle_that_carries_code_says_so_not_mmap(reg, tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"embed.weight": Payload()}, evil, _use_new_zipfile_serialization=False)
    m = reg.get(NAME)
    before = tensors_of(m)
    for attempt in (lambda: m.materialize(weights=evil), lambda: reg.check(NAME, evil)):
        with pytest.raises(CheckpointError, match=r"evil.pt: its pickle would run code \(posix.system\)") as err:
            attempt()
        assert "mmap" not in str(err.value)
    assert not marker.exists()
    assert_untouched(m, before)


# --- 3. the safetensors overlap check and empty tensors ---------------------------------------


def test_3_an_empty_tensor_between_two_overlapping_ones_does_not_hide_the_overlap(reg, tmp_path):
    path = tmp_path / "overlap.safetensors"
    write_safetensors(
        path,
        {
            "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "z": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
        },
        bytes(24),
    )
    with pytest.raises(CheckpointError, match="tensors 'a' and 'b' overlap"):
        reg.check(NAME, path)
    from zoo.materialize import materialize

    net = nn.Module()
    net.register_parameter("a", nn.Parameter(torch.empty(4, device="meta")))
    net.register_parameter("b", nn.Parameter(torch.empty(4, device="meta")))
    net.register_parameter("z", nn.Parameter(torch.empty(0, device="meta")))
    before = tensors_of(net)
    with pytest.raises(CheckpointError, match="overlap"):
        materialize(net, weights=path)
    assert_untouched(net, before)


# --- 4. paths that are not regular files --------------------------------------------------------


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe.safetensors")
    return tmp_path / "pipe.safetensors"


def _fifo_shard(tmp_path):
    os.mkfifo(tmp_path / "pipe.safetensors")
    return _index(tmp_path, {"embed.weight": "pipe.safetensors"})


def _directory_in_a_checkpoint_directory(tmp_path):
    (tmp_path / "ckpt" / "x.safetensors").mkdir(parents=True)
    return tmp_path / "ckpt"


def _directory_named_safetensors(tmp_path):
    (tmp_path / "x.safetensors").mkdir()
    return tmp_path / "x.safetensors"


def _symlink_loop(tmp_path):
    os.symlink("loop.safetensors", tmp_path / "loop.safetensors")
    return tmp_path / "loop.safetensors"


def _index(tmp_path, weight_map) -> str:
    save_file(state(), str(tmp_path / "real.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp_path / "model.safetensors.index.json"


NOT_REGULAR = {
    "fifo": (_fifo, "FIFO"),
    "fifo shard": (_fifo_shard, "FIFO"),
    "directory named x.safetensors": (_directory_named_safetensors, "directory"),
    "directory among shards": (_directory_in_a_checkpoint_directory, "directory"),
    "symlink loop": (_symlink_loop, "symlink loop"),
    "shard named ..": (lambda p: _index(p, {"embed.weight": ".."}), "not a plain file name"),
    "shard named ''": (lambda p: _index(p, {"embed.weight": ""}), "not a plain file name"),
}


@pytest.mark.parametrize("case", NOT_REGULAR)
def test_4_a_path_that_is_not_a_regular_file_is_refused_before_it_is_opened(reg, tmp_path, case):
    make, message = NOT_REGULAR[case]
    path = make(tmp_path)
    m = reg.get(NAME)
    before = tensors_of(m)
    attempts = [
        lambda: m.materialize(weights=path),
        lambda: reg.check(NAME, path),
        lambda: reg.add_weights(NAME, path, tag="odd"),
    ]
    if path.name.endswith(".safetensors"):
        attempts.append(lambda: reg.index_checkpoint(path, name="checkpoint/odd"))
    try:
        for attempt in attempts:
            with pytest.raises(CheckpointError, match=message):
                bounded(attempt)
    finally:
        if (tmp_path / "pipe.safetensors").exists():  # had a reader blocked in open(), this frees it
            try:
                os.close(os.open(tmp_path / "pipe.safetensors", os.O_WRONLY | os.O_NONBLOCK))
                opened_by_someone = True
            except OSError:  # ENXIO: nobody has the FIFO open for reading, as it must be
                opened_by_someone = False
            assert not opened_by_someone, "the FIFO was opened"
    assert_untouched(m, before)
    assert "odd" not in [w["tag"] for w in reg.info(NAME).weights]


# --- 5. malformed indexes and pickles: CheckpointError, never a bare built-in ---------------------


def _deep_header(tmp_path):
    path = tmp_path / "deep.safetensors"
    raw = b"[" * 200_000 + b"]" * 200_000
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


def _deep_index(tmp_path):
    path = tmp_path / "model.safetensors.index.json"
    path.write_text('{"weight_map": ' + "[" * 200_000 + "]" * 200_000 + "}")
    return path


def _garbled_pickle(tmp_path):
    torch.save(state(), tmp_path / "good.pt")
    rewrite_zip(
        tmp_path / "good.pt",
        tmp_path / "garbled.pt",
        lambda name, data: data[: len(data) // 2] if name.endswith("/data.pkl") else data,
    )
    return tmp_path / "garbled.pt"


def _empty_pickle(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    return tmp_path / "empty.pt"


MALFORMED = {
    "missing shard": (lambda p: _index(p, {"embed.weight": "gone.safetensors"}), "gone.safetensors: no such shard"),
    "weight_map values are numbers": (lambda p: _index(p, {"embed.weight": 1}), "not a safetensors index"),
    "weight_map values are lists": (
        lambda p: _index(p, {"embed.weight": ["real.safetensors"]}),
        "not a safetensors index",
    ),
    "weight_map is a list": (lambda p: _index(p, ["real.safetensors"]), "not a safetensors index"),
    "200k-deep JSON header": (_deep_header, "deep.safetensors: header is JSON nested too deeply"),
    "200k-deep JSON index": (_deep_index, "shard index is JSON nested too deeply"),
    "garbled data.pkl in a zip .pt": (_garbled_pickle, "garbled.pt: not a loadable weights-only torch checkpoint"),
    "empty .pt": (_empty_pickle, "empty.pt: not a loadable .* the file ends early"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_5_a_malformed_index_or_pickle_is_a_checkpoint_error_naming_the_file(reg, tmp_path, case):
    make, message = MALFORMED[case]
    path = make(tmp_path)
    m = reg.get(NAME)
    before = tensors_of(m)
    for attempt in (lambda: m.materialize(weights=path), lambda: reg.check(NAME, path)):
        with pytest.raises(CheckpointError, match=message):
            attempt()
    assert_untouched(m, before)


def test_5_zoo_check_of_an_empty_pt_exits_1_with_one_line(reg, tmp_path):
    from tests.conftest import run_cli

    proc = run_cli("check", NAME, str(_empty_pickle(tmp_path)), registry=reg.url, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("zoo: error: ") and "empty.pt" in proc.stderr


# --- 6. nothing half-loaded: arguments, keys and devices checked before allocating ---------------


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, "int8", "bfloat17", 3, torch.complex64])
def test_6_a_dtype_that_is_not_floating_is_refused_before_anything_is_allocated(reg, dtype):
    m = reg.get(NAME)
    before = tensors_of(m)
    with pytest.raises(InvalidArgument, match="dtype must be a floating torch dtype"):
        m.materialize(weights=state(), dtype=dtype)
    assert_untouched(m, before)
    with pytest.raises(InvalidArgument, match="dtype must be a floating torch dtype"):
        reg.get(NAME, weights=state(), dtype=dtype, dispatch="lazy")  # at once, not at the first forward


@pytest.mark.parametrize(
    "name, dtype",
    [("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16), ("fp16", torch.float16), ("torch.float64", torch.float64)],
)
def test_6_a_dtype_by_name_is_accepted(reg, name, dtype):
    m = reg.get(NAME).materialize(weights=state(), dtype=name)
    assert m.proj.weight.dtype == dtype and m.scale.dtype == dtype and m.positions.dtype == torch.int64


@pytest.mark.parametrize("device", ["nope", "cuda:99", "meta"])
def test_6_a_device_that_cannot_be_used_is_refused_before_anything_is_allocated(reg, device):
    m = reg.get(NAME)
    before = tensors_of(m)
    with pytest.raises(InvalidArgument, match="device"):
        m.materialize(weights=state(), device=device)
    assert_untouched(m, before)


def test_6_a_submodule_added_on_meta_is_a_materialize_error_not_a_key_error(reg):
    m = reg.get(NAME)
    m.extra = nn.Linear(3, 3, device="meta")
    before = tensors_of(m)
    for attempt in (lambda: m.materialize(), lambda: m.materialize(weights=state(), strict=False)):
        with pytest.raises(MaterializeError, match="extra.weight, extra.bias: the model's constructor does not"):
            attempt()
        assert_untouched(m, before)
    loaded = m.materialize(weights={**state(), "extra.weight": torch.ones(3, 3), "extra.bias": torch.ones(3)})
    assert torch.equal(loaded.extra.weight, torch.ones(3, 3))


def test_6_a_swap_that_torch_refuses_is_rolled_back(reg):
    m = reg.get(NAME)
    before = tensors_of(m)
    holder = weakref.ref(m.proj.bias)  # torch.utils.swap_tensors refuses a tensor with a weakref
    with pytest.raises(MaterializeError, match="cannot swap proj.bias in place"):
        m.materialize(weights=state())
    assert_untouched(m, before)  # embed.weight and proj.weight were swapped first, and swapped back
    assert holder() is m.proj.bias


# --- 7. a read that fails after tensors were allocated and filled ---------------------------------


class FailsAfter(SafetensorsSource):
    """A real safetensors reader whose reads fail after the first n succeed (a disk that goes away)."""

    def __init__(self, files, n: int):
        super().__init__(files)
        self.left, self.done, self.lock = n, 0, threading.Lock()

    def read_into(self, name, dest, box=None) -> None:
        with self.lock:
            self.left -= 1
            if self.left < 0:
                raise CheckpointError(f"{name}: the disk went away")
        super().read_into(name, dest, box)
        with self.lock:
            self.done += 1


@pytest.mark.parametrize("n", [0, 2, 3])
def test_7_a_read_failing_after_n_tensors_leaves_every_original_meta_tensor(reg, tmp_path, n):
    save_file(state(), str(tmp_path / "w.safetensors"))
    source = FailsAfter([tmp_path / "w.safetensors"], n)
    m = reg.get(NAME)
    before = tensors_of(m)
    with pytest.raises(CheckpointError, match="the disk went away"):
        m.materialize(weights=source, copy=True)  # read, not mapped
    assert source.done == n  # n tensors were read into new memory before the failure
    assert_untouched(m, before)
    assert not source.fds  # and the file was closed


# --- 8. silences that hid a mistake ------------------------------------------------------------


def test_8_strict_false_with_not_one_matching_key_raises(reg, tmp_path):
    unrelated = {"encoder.layer.0.weight": torch.zeros(3), "decoder.bias": torch.zeros(2)}
    m = reg.get(NAME)
    before = tensors_of(m)
    with pytest.raises(WeightsMismatch, match="not one key matches"):
        m.materialize(weights=unrelated, strict=False)
    assert_untouched(m, before)
    save_file(unrelated, str(tmp_path / "unrelated.safetensors"))
    with pytest.raises(WeightsMismatch, match="not one key matches"):
        reg.add_weights(NAME, tmp_path / "unrelated.safetensors", tag="unrelated", strict=False)
    assert "unrelated" not in [w["tag"] for w in reg.info(NAME).weights]


def test_8_materialize_without_weights_on_a_loaded_module_needs_reinit(reg):
    want = state(seed=5)
    m = reg.get(NAME).materialize(weights=want)
    with pytest.raises(MaterializeError, match="already holds values .* pass reinit=True"):
        m.materialize()
    assert torch.equal(m.proj.weight, want["proj.weight"])  # kept, not silently re-initialized
    with pytest.raises(InvalidArgument, match="reinit"):
        m.materialize(weights=want, reinit=True)
    torch.manual_seed(9)
    m.materialize(reinit=True)
    assert torch.equal(m.proj.weight, state(seed=9)["proj.weight"])  # the constructor, under the caller's seed


# --- fuzz: mutated safetensors headers and shard indexes ---------------------------------------

from hypothesis import HealthCheck, event, given, settings  # noqa: E402 - the fuzz section's imports, kept with it
from hypothesis import strategies as hs  # noqa: E402 - the fuzz section's imports, kept with it

FILE_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def fuzz_net() -> nn.Module:
    """Float parameters, float and int64 persistent buffers, all on meta."""
    return nn.Sequential(nn.Linear(4, 3, device="meta"), nn.BatchNorm1d(3, device="meta"))


def fuzz_state() -> dict:
    g = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=g) for k, v in fuzz_net().state_dict().items()}
    state["0.weight"] = state["0.weight"].half()  # stored in another dtype: cast on load
    state["1.num_batches_tracked"] = torch.tensor(7)
    return state


def valid_file(state: dict) -> tuple[dict, bytes]:
    """A safetensors header (as a dict) and its data, laid out as the reference writer does."""
    from safetensors.torch import save

    raw = save(state)
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


JSON = hs.recursive(
    hs.none()
    | hs.booleans()
    | hs.integers(-(2**70), 2**70)
    | hs.floats()
    | hs.text(max_size=8)
    | hs.sampled_from([*FILE_DTYPES, "F8_E4M3", "..", "", "0.weight"]),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def mutate_file(draw, header: dict, data: bytes) -> bytes:
    """One valid safetensors file, broken in one of the ways a corrupt or hostile file is."""
    header = json.loads(json.dumps(header))
    names = sorted(k for k in header if k != "__metadata__")
    kind = draw(
        hs.sampled_from(
            [
                "field",
                "offsets",
                "drop",
                "rename",
                "metadata",
                "flip",
                "length",
                "cut json",
                "cut file",
                "deep",
                "long number",
            ]
        )
    )
    if kind == "field":
        header[draw(hs.sampled_from(names))][draw(hs.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(JSON)
    elif kind == "offsets":  # near the true ones: overlaps, gaps, swaps, empty tensors, past the end
        for name in draw(hs.lists(hs.sampled_from(names), min_size=1, max_size=3)):
            spec = header[name]
            spec["data_offsets"] = [o + draw(hs.integers(-40, 40)) for o in spec["data_offsets"]]
            if draw(hs.booleans()):
                spec["shape"] = [draw(hs.integers(0, 12)) for _ in range(draw(hs.integers(0, 3)))]
            if draw(hs.booleans()):
                spec["dtype"] = draw(hs.sampled_from(list(FILE_DTYPES)))
    elif kind == "drop":
        target = header[draw(hs.sampled_from(names))]
        target.pop(draw(hs.sampled_from(["dtype", "shape", "data_offsets"])))
    elif kind == "rename":
        header[draw(hs.text(max_size=10))] = header.pop(draw(hs.sampled_from(names)))
    elif kind == "metadata":
        header["__metadata__"] = draw(JSON)
    raw = json.dumps(header).encode()
    if kind == "cut json":
        raw = raw[: draw(hs.integers(0, len(raw) - 1))]
    elif kind in ("deep", "long number"):  # JSON that exhausts the parser's recursion, or Python's int limit
        depth = draw(hs.integers(1, 200_000))
        value = b"[" * depth + b"]" * depth if kind == "deep" else b"1" * draw(hs.integers(1, 10_000))
        raw = raw.replace(b'"data_offsets": [', b'"data_offsets": [' + value + b", ", 1)
    out = bytearray(struct.pack("<Q", len(raw)) + raw + data)
    if kind == "flip":
        for _ in range(draw(hs.integers(1, 4))):
            out[draw(hs.integers(0, 8 + len(raw) - 1))] = draw(hs.integers(0, 255))
    elif kind == "length":
        out[:8] = struct.pack("<Q", draw(hs.integers(0, len(raw) + 64) | hs.integers(0, 2**64 - 1)))
    elif kind == "cut file":
        out = out[: draw(hs.integers(0, len(out) - 1))]
    return bytes(out)


def expected_from(raw: bytes, net: nn.Module) -> dict:
    """What a file zoo loaded says, read independently of zoo: each tensor's bytes at its header
    offsets, cast. The format forbids tensors that share bytes: a file with such is no correct load."""
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    spans = sorted(s["data_offsets"] for k, s in header.items() if k != "__metadata__")
    end = 0
    for begin, stop in (span for span in spans if span[1] > span[0]):
        assert begin >= end, f"zoo loaded a file whose tensors overlap: {spans}"
        end = max(end, stop)
    out = {}
    for name, t in net.state_dict().items():
        if name not in header:  # in another shard
            continue
        spec = header[name]
        begin, end = spec["data_offsets"]
        chunk = bytearray(data[begin:end]) or bytearray(1)
        value = torch.frombuffer(chunk, dtype=FILE_DTYPES[spec["dtype"]])[: end - begin and None]
        out[name] = value.reshape(spec["shape"]).to(t.dtype)
    return out


def load_or_refuse(weights, copy: bool | None = True):
    """materialize a fresh net, bounded in time: the net, or the zoo error with the net untouched."""
    from zoo.materialize import materialize
    from zoo.weights.opening import specs_of

    net = fuzz_net()
    before = tensors_of(net)
    try:
        bounded(lambda: specs_of(weights), 20)  # what zoo check reads
        bounded(lambda: materialize(net, weights=weights, copy=copy), 20)
    except (CheckpointError, WeightsMismatch) as e:
        assert_untouched(net, before)
        event(type(e).__name__)  # --hypothesis-show-statistics: how often each outcome came
        return e
    assert not any(t.is_meta for t in tensors_of(net).values())
    event("loaded")
    return net


def assert_loaded_as(net, expected: dict) -> None:
    for name, value in net.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, equal_nan=True, msg=name)


FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(hs.data())
def test_fuzz_a_mutated_safetensors_file_loads_as_its_header_says_or_is_a_checkpoint_error(data):
    import tempfile

    header, payload = valid_file(fuzz_state())
    raw = mutate_file(data.draw, header, payload)
    copy = data.draw(hs.sampled_from([True, None]))  # read into owned memory, or mapped where it can be
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "w.safetensors")
        with open(path, "wb") as f:
            f.write(raw)
        result = load_or_refuse(path, copy)
        if isinstance(result, nn.Module):
            assert_loaded_as(result, expected_from(raw, result))


@FUZZ
@given(hs.data())
def test_fuzz_a_mutated_shard_index_loads_the_shards_or_is_a_checkpoint_error(data):
    import tempfile

    state = fuzz_state()
    shards = {
        "a.safetensors": ["0.weight", "0.bias", "1.weight"],
        "b.safetensors": ["1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"],
    }
    weight_map = {k: shard for shard, keys in shards.items() for k in keys}
    kind = data.draw(hs.sampled_from(["value", "weight_map", "drop", "cut", "flip", "shard"]))
    if kind == "value":
        weight_map[data.draw(hs.sampled_from(sorted(weight_map)))] = data.draw(
            JSON
            | hs.sampled_from(
                [
                    "..",
                    ".",
                    "",
                    "missing.safetensors",
                    "../a.safetensors",
                    "/dev/zero",
                    "a\x00b",
                    "model.safetensors.index.json",
                    *shards,
                ]
            )
        )
    elif kind == "drop":
        del weight_map[data.draw(hs.sampled_from(sorted(weight_map)))]
    index = {"metadata": {}, "weight_map": data.draw(JSON) if kind == "weight_map" else weight_map}
    text = json.dumps(index).encode()
    if kind == "cut":
        text = text[: data.draw(hs.integers(0, len(text) - 1))]
    elif kind == "flip":
        text = bytearray(text)
        text[data.draw(hs.integers(0, len(text) - 1))] = data.draw(hs.integers(0, 255))
        text = bytes(text)
    with tempfile.TemporaryDirectory() as tmp:
        for shard, keys in shards.items():
            header, payload = valid_file({k: state[k] for k in keys})
            raw = mutate_file(data.draw, header, payload) if kind == "shard" and shard == "b.safetensors" else None
            with open(os.path.join(tmp, shard), "wb") as f:
                f.write(raw or struct.pack("<Q", len(json.dumps(header))) + json.dumps(header).encode() + payload)
        path = os.path.join(tmp, "model.safetensors.index.json")
        with open(path, "wb") as f:
            f.write(text)
        result = load_or_refuse(path)
        if isinstance(result, nn.Module):
            expected = {k: v.to(result.state_dict()[k].dtype) for k, v in state.items()}
            if raw:
                expected.update(expected_from(raw, result))
            assert_loaded_as(result, expected)
