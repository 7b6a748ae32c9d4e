"""Hostile input at the edges: names that carry terminal escapes are refused on
write and printed escaped, and arguments of the wrong type or size at the Python API get zoo's typed errors,
never a TypeError from difflib, pathlib or torch."""

import sqlite3

import pytest

import zoo
from tests.conftest import run_cli
from zoo.errors import AnalysisError, InvalidArgument, ZooError

HOSTILE = "user/\x1b]2;pwned\x07\x1b[2J"


@pytest.fixture
def writable(small_registry, tmp_path) -> str:
    """A copy of the small registry that a test may change."""
    path = tmp_path / "copy.db"
    source, copy = sqlite3.connect(small_registry.removeprefix("sqlite:///")), sqlite3.connect(path)
    source.backup(copy)
    copy.execute("PRAGMA journal_mode=DELETE")
    source.close(), copy.close()
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("boundary")
    transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32).save_pretrained(root / "c")
    registry = zoo.connect(f"sqlite:///{root / 'tiny.db'}")
    assert registry.index("hf", [str(root / "c")], name="hf/test-org/tiny").failed == {}
    return registry


# --- 9. terminal escapes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        HOSTILE,
        "user/tab\there",
        "user/new\nline",
        "user/a b",
        "user/ü",
        "user//x",
        "user/",
        "/x",
        "user/" + "x" * 300,
        "user/..",
        "user/.",
        "hf/org/..",
        "../x",
        "user/.../x",
    ],
)
def test_9_a_name_outside_the_documented_set_is_refused_on_write(writable, name):
    registry = zoo.connect(writable)
    before = len(registry.search(None))
    with pytest.raises(InvalidArgument, match="a model name is"):
        registry.index_builder("tests.builders:tied_net", name)
    assert len(registry.search(None)) == before


def test_9_the_cli_refuses_a_hostile_checkpoint_name_and_writes_nothing(writable, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    proc = run_cli(
        "index", "checkpoint", str(tmp_path / "w.safetensors"), "--name", HOSTILE, registry=writable, check=False
    )
    assert proc.returncode == 1 and "\x1b" not in proc.stderr + proc.stdout, proc.stderr
    assert "a model name is" in proc.stderr
    assert not zoo.connect(writable).search("family=checkpoint")


@pytest.mark.parametrize(
    "stem, name",
    [("model (1)", "checkpoint/model__1_"), ("ckpt@step100", "checkpoint/ckpt_step100"), ("bär", "checkpoint/b_r")],
)
def test_9_a_checkpoint_named_after_its_file_gets_the_stem_in_the_documented_set(writable, tmp_path, stem, name):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / f"{stem}.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    assert zoo.connect(writable).index_checkpoint(path)["name"] == name
    assert zoo.connect(writable).info(name).family == "checkpoint"


def test_9_escapes_recorded_by_an_older_zoo_print_escaped(writable):
    """A row written before names were checked: `zoo search` and `zoo show` print its escapes as text."""
    path = writable.removeprefix("sqlite:///")
    with sqlite3.connect(path) as c:
        c.execute(
            "UPDATE models SET name = ?, short = ?, error = ?, task = ? WHERE name = 'user/tied'",
            (HOSTILE, HOSTILE.split("/", 1)[1], "boom\x1b[31m red", "t\x9bask"),
        )
    c.close()
    found = run_cli("search", "family=user", registry=writable)
    assert "\x1b" not in found.stdout and "\x07" not in found.stdout and "\x9b" not in found.stdout
    assert "\\x1b]2;pwned\\x07" in found.stdout
    shown = run_cli("show", HOSTILE, registry=writable)
    assert "boom\\x1b[31m red" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout and "\x9b" not in shown.stdout
    missing = run_cli("show", HOSTILE + "x", registry=writable, check=False)
    assert missing.returncode == 1 and "\x1b" not in missing.stderr


# --- 11. types at the API boundary ---------------------------------------------------------------


@pytest.mark.parametrize("name", [None, 123, float("nan"), ["timm/resnet18"], b"timm/resnet18", ("a",)])
def test_11_a_name_that_is_not_a_string_is_invalid_argument(zoo_at, name):
    for call in (zoo_at.info, zoo_at.get, zoo_at.transform):
        with pytest.raises(InvalidArgument, match="a model name is a string"):
            call(name)
    with pytest.raises(InvalidArgument, match="a model name is a string"):
        zoo.connect().variants(name)


@pytest.mark.parametrize("weights", [123, b"r18.safetensors", ["r18.safetensors"], 1.5, object()])
def test_11_weights_of_the_wrong_type_are_invalid_argument(zoo_at, weights):
    m = zoo_at.get("timm/resnet18")
    with pytest.raises(InvalidArgument, match="weights"):
        m.materialize(weights=weights)
    assert all(p.is_meta for p in m.parameters())
    with pytest.raises(InvalidArgument, match="weights"):
        zoo_at.check("timm/resnet18", weights)


@pytest.mark.parametrize("options", [dict(batch=None), dict(batch=10**20), dict(batch=2.0), dict(batch=True)])
def test_11_estimate_batch_of_the_wrong_type_or_size_is_refused(zoo_at, options):
    with pytest.raises(AnalysisError, match="batch"):
        zoo_at.estimate("timm/resnet18", **options)


def test_11_estimate_seq_len_too_large_is_refused(tiny_gpt2):
    with pytest.raises(AnalysisError, match="seq_len"):
        tiny_gpt2.estimate("hf/test-org/tiny", seq_len=10**20)


@pytest.mark.parametrize("shape", [(1, 3, -1, 224), (1, 3, 10**20, 224), (1, 3, 2**40, 2**40)])
def test_11_scan_of_an_impossible_shape_is_an_analysis_error(zoo_at, shape):
    with pytest.raises(AnalysisError, match="shape"):
        zoo_at.scan("timm/resnet18", shape)


def test_11_every_refusal_is_a_zoo_error(zoo_at):
    for call in (
        lambda: zoo_at.get(None),
        lambda: zoo_at.estimate("timm/resnet18", batch=None),
        lambda: zoo_at.scan(None),
        lambda: zoo_at.estimate(123),
        lambda: zoo_at.scan([1, 2]),
        lambda: zoo_at.scan("timm/resnet18", (1, 3, -1, 224)),
    ):
        with pytest.raises(ZooError):
            call()
