"""Hostile config.json files and hub caches: forced-meta builds that never allocate for
real, bounded configs, one bad input that fails alone while the run goes on, and hub-cache symlinks that lead
out of the cache refused. Memory is bounded with RLIMIT_AS in a child process, never measured by timing."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402 - after importorskip
from tests.conftest import ROOT  # noqa: E402 - after importorskip
from zoo.errors import CheckpointError  # noqa: E402 - after importorskip

GIB = 1 << 30
TINY_LLAMA = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
    max_position_embeddings=64,
)

# The child imports what a build needs and builds once (transformers loads its modules lazily), then holds its
# address space to what it has plus `extra` bytes: a real allocation past that fails at once, on any machine.
_HEAD = """
import re, resource, sys
import torch, transformers, zoo, zoo.indexing.indexer, zoo.meta
from zoo.families import hf
hf.build("AutoModelForCausalLM", {"config": %r})
vm = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + %d, vm + %d))
"""


def bounded(code: str, extra: int = GIB, timeout: int = 60, env=None) -> subprocess.CompletedProcess:
    """Run `code` in a child process with `extra` bytes of address space beyond its imports, for `timeout` s."""
    script = _HEAD % (TINY_LLAMA, extra, extra) + textwrap.dedent(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def index_hf_bounded(tmp_path: Path, sources: list[str], timeout: int = 60) -> tuple[subprocess.CompletedProcess, dict]:
    """`zoo index hf SOURCE... --json` in one bounded child: its exit code and the outcome it printed."""
    proc = bounded(
        f"""
        from zoo.cli import main
        sys.exit(main(["index", "hf", *{sources!r}, "--json", "-q"]))
        """,
        timeout=timeout,
        env={"ZOO_REGISTRY": str(tmp_path / "r.db")},
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"no outcome printed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
        ) from None


def write_config(folder: Path, name: str, config) -> str:
    path = folder / f"{name}.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


# --- 3. forced meta checks a result's size before computing its shadow ----------------------------------------


@pytest.mark.slow  # a bounded process: 9 s
def test_3_a_large_result_of_small_shadows_is_not_computed():
    """arange(2**20) has a shadow (it is at the limit); its product with ones(1024) would be 4 GiB of float32."""
    proc = bounded("""
        with zoo.meta.force_meta():
            x = torch.arange(2**20).float()[:, None] * torch.ones(1024)
            y = torch.arange(6).float()[:, None] * torch.ones(2)  # small: still shadowed
        assert x.is_meta and x.shape == (2**20, 1024) and zoo.meta.value_of(x) is None
        assert zoo.meta.value_of(y).tolist() == [[float(i)] * 2 for i in range(6)]
        print("ok")
        """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.parametrize("rotary_dim", [64, 2048])
@pytest.mark.slow  # a bounded process each: 10 s
def test_3_gptj_with_a_million_positions_indexes_within_a_gib(tmp_path, rotary_dim):
    """GPT-J computes its sinusoidal position table (n_positions x rotary_dim) in its constructor."""
    config = dict(
        model_type="gptj",
        architectures=["GPTJForCausalLM"],
        n_layer=1,
        n_positions=2**20,
        n_embd=4096,
        n_head=16,
        rotary_dim=rotary_dim,
        vocab_size=1000,
    )
    proc, outcome = index_hf_bounded(tmp_path, [write_config(tmp_path, "gptj", config)])
    assert outcome["indexed"] == 1 and not outcome["failed"], outcome
    info = zoo.connect(f"sqlite:///{tmp_path / 'r.db'}").info("hf/gptj")
    assert info.status == "ok" and info.params > 0


# --- 4. configs are bounded: size, nesting, modules, recorded integers ------------------------------------------


@pytest.mark.slow  # a bounded process: 10 s
def test_4_configs_without_bounds_fail_alone_naming_the_key(tmp_path):
    """Each hostile config fails with a typed error that names what is out of bounds, within 60 s and a GiB
    for the whole run, and the good config after them is indexed."""
    vit = dict(
        model_type="vit",
        architectures=["ViTModel"],
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        patch_size=16,
    )
    cases = {
        "layers_1e5": ({**TINY_LLAMA, "num_hidden_layers": 10**5}, "num_hidden_layers"),
        "layers_1e9": ({**TINY_LLAMA, "num_hidden_layers": 10**9}, "num_hidden_layers"),
        "gpt2_layers": (dict(model_type="gpt2", n_layer=10**6, n_embd=32, n_head=4, vocab_size=64), "n_layer"),
        "nested": (json.dumps(TINY_LLAMA)[:-1] + ', "rope_scaling": ' + "[" * 990 + "]" * 990 + "}", "nest"),
        "vocab": ({**TINY_LLAMA, "vocab_size": 10**15, "hidden_size": 1024}, "vocab_size"),
        "image": ({**vit, "image_size": 10**6}, "image_size"),
        "big": ({**TINY_LLAMA, "padding": "x" * 40_000_000}, "MiB"),
    }
    sources = [write_config(tmp_path, name, config) for name, (config, _) in cases.items()]
    good = write_config(tmp_path, "good", TINY_LLAMA)
    try:
        proc, outcome = index_hf_bounded(tmp_path, [*sources, good])
    finally:
        (tmp_path / "big.json").unlink()
    assert proc.returncode == 1 and outcome["indexed"] == 1, outcome
    failed = outcome["failed"]
    for name, (_, key) in cases.items():
        error = failed.get(f"hf/{name}") or failed.get(str(tmp_path / f"{name}.json"))
        assert error and key in error and error.startswith("InvalidRecipe"), (name, error)
    assert zoo.connect(f"sqlite:///{tmp_path / 'r.db'}").info("hf/good").status == "ok"


# --- 5. one bad input fails alone -------------------------------------------------------------------------------


def test_5_configs_of_the_wrong_types_fail_alone(tmp_path):
    from tests.conftest import run_cli

    sources = [
        write_config(tmp_path, "a", {"model_type": ["llama"]}),
        write_config(tmp_path, "b", {**TINY_LLAMA, "architectures": 5}),
        write_config(tmp_path, "c", {**TINY_LLAMA, "architectures": [5]}),
        write_config(tmp_path, "d", {**TINY_LLAMA, "model_type": {"llama": 1}}),
        write_config(tmp_path, "good", TINY_LLAMA),
    ]
    proc = run_cli("index", "hf", *sources, "--json", "-q", registry=str(tmp_path / "r.db"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    outcome = json.loads(proc.stdout)
    assert outcome["indexed"] == 1 and len(outcome["failed"]) == 4, outcome
    for source, key in zip(sources, ["model_type", "architectures", "architectures", "model_type"]):
        assert outcome["failed"][source].startswith("InvalidRecipe") and key in outcome["failed"][source], source


def test_5_local_cache_goes_on_past_corrupt_weights(tmp_path, monkeypatch):
    """A repo whose cached safetensors header is corrupt, one whose shard index is malformed, and a good one: all
    three indexed from their config.json, the two unreadable checkpoints noted, not counted."""
    from huggingface_hub import constants

    from tests.test_hf import populate_cache

    cache = tmp_path / "hub"
    for repo, files in {
        "corrupt-header": {"model.safetensors": b"\xff" * 8 + b"{not json"},
        "bad-map": {"model.safetensors.index.json": b'{"weight_map": [1, 2]}'},
        "bad-map-values": {"model.safetensors.index.json": b'{"weight_map": {"a": [1]}}'},
        "good": {},
    }.items():
        folder = tmp_path / repo
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
        for name, data in files.items():
            (folder / name).write_bytes(data)
        populate_cache(cache, f"cached-org/{repo}", folder)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = zoo.connect(url).index_hub(local_cache=True)
    assert len(outcome.indexed) == 4 and not outcome.failed, outcome
    for repo in ("corrupt-header", "bad-map", "bad-map-values"):
        info = zoo.connect(url).info(f"hf/cached-org/{repo}")
        assert info.hub_params is None and any("not readable" in n for n in info.card["notes"]), info.card


def test_5_local_cache_goes_on_past_a_repo_with_a_bad_name(tmp_path, monkeypatch):
    """A cache folder models--org--bad name gives the repo id org/bad name, outside the names zoo writes: that
    repo is recorded as failed (InvalidArgument) and the run goes on to the next one."""
    from huggingface_hub import constants

    from tests.test_hf import populate_cache

    cache = tmp_path / "hub"
    for repo in ("bad name", "good"):
        folder = tmp_path / repo
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
        populate_cache(cache, f"cached-org/{repo}", folder)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = zoo.connect(url).index_hub(local_cache=True)
    assert outcome.indexed == ["hf/cached-org/good"], outcome
    assert list(outcome.failed) == ["hf/cached-org/bad name"], outcome
    assert outcome.failed["hf/cached-org/bad name"].startswith("InvalidArgument"), outcome
    assert zoo.connect(url).info("hf/cached-org/good").status == "ok"
    assert [m.name for m in zoo.connect(url).search("")] == ["hf/cached-org/good"]


def test_5_an_unreadable_cached_config_is_recorded_as_the_documented_kind_config(tmp_path, monkeypatch):
    """A cached config.json that is not a JSON object is recorded with the failure kind "config", and the docs of
    the kinds (zoo.indexing.hub_listing, zoo.errors.HubUnavailable) name it, not "no-config" (a repo without one)."""
    from huggingface_hub import constants

    from tests.test_hf import populate_cache
    from zoo.errors import HubUnavailable
    from zoo.indexing import hub_listing

    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "config.json").write_text("[1, 2]")
    populate_cache(tmp_path / "hub", "cached-org/listed", folder)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    outcome = zoo.connect(url).index_hub(local_cache=True)
    assert outcome.failed["hf/cached-org/listed"].startswith("InvalidRecipe"), outcome
    assert zoo.connect(url).info("hf/cached-org/listed").card["failure"] == "config"
    for doc in (hub_listing.__doc__, HubUnavailable.__doc__):
        assert '"config" (a config.json' in " ".join(doc.split()), doc


def test_4_a_build_of_too_many_tensors_is_refused(tmp_path, monkeypatch):
    """The bound behind the layer counts, for whatever else a config multiplies (experts, blocks under a key zoo
    does not know): past the tensors any real model has, the build ends with a typed error. The bound is lowered
    here so that the test builds little: 200 layers of 9 tensors against 1,000."""
    import zoo.meta

    monkeypatch.setattr(zoo.meta, "MAX_TENSORS", 1000, raising=False)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    source = write_config(tmp_path, "deep", {**TINY_LLAMA, "num_hidden_layers": 200})
    failed = zoo.connect(url).index("hf", [source]).failed
    assert "more than 1,000 tensors" in failed["hf/deep"] and failed["hf/deep"].startswith("InvalidRecipe"), failed
    monkeypatch.setattr(zoo.meta, "MAX_TENSORS", 10**6)
    assert zoo.connect(url).index("hf", [source]).indexed == ["hf/deep"]


# --- 6. a cached snapshot entry is its repo's own blob, or refused -------------------------------------------------


def _weights_cache(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """An offline huggingface_hub cache holding test-org/w: a model.safetensors linked to its blob, as the hub
    lays it out. Returns (the repo's folder, the snapshot's model.safetensors)."""
    import torch
    from huggingface_hub import constants
    from safetensors.torch import save_file

    from tests.test_hf import COMMIT, populate_cache

    source = tmp_path / "source"
    source.mkdir()
    save_file({"w": torch.arange(4.0)}, str(source / "model.safetensors"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    folder = populate_cache(tmp_path / "hub", "test-org/w", source)
    return folder, folder / "snapshots" / COMMIT / "model.safetensors"


def _other_weights(folder: Path) -> bytes:
    import torch
    from safetensors.torch import save

    return save({"w": torch.full((4,), 666.0)})


@pytest.mark.parametrize(
    "target", ["outside", "outside, named by its hash", "in the snapshot, named by its hash", "another repo's blob"]
)
def test_6_a_snapshot_link_out_of_its_repos_blobs_is_refused(tmp_path, monkeypatch, target):
    from zoo.weights.hub import resolve_hub_weights

    folder, link = _weights_cache(tmp_path, monkeypatch)
    assert Path(resolve_hub_weights("hf://test-org/w")) == link  # the cache as the hub lays it out serves
    data = _other_weights(folder)
    digest = hashlib.sha256(data).hexdigest()
    places = {
        "outside": tmp_path / "evil.safetensors",
        "outside, named by its hash": tmp_path / digest,
        "in the snapshot, named by its hash": link.parent / digest,
        "another repo's blob": folder.parent / "models--other--repo" / "blobs" / digest,
    }
    evil = places[target]
    evil.parent.mkdir(parents=True, exist_ok=True)
    evil.write_bytes(data)
    link.unlink()
    link.symlink_to(evil)
    with pytest.raises(CheckpointError, match="outside"):
        resolve_hub_weights("hf://test-org/w")


# --- the acceptance fuzz: hostile config.json files, one run ------------------------------------------------------


def _hostile_configs():
    """Strategy: the text of a config.json, from a tiny Llama with some keys given wrong types, huge or negative
    numbers, non-finite floats, deep nesting or megabytes of padding."""
    from hypothesis import strategies as st

    keys = st.sampled_from(
        [
            *TINY_LLAMA,
            "rope_scaling",
            "id2label",
            "head_dim",
            "tie_word_embeddings",
            "torch_dtype",
            "rms_norm_eps",
            "n_layer",
            "text_config",
        ]
    )
    values = st.one_of(
        st.none(),
        st.booleans(),
        st.text(max_size=12),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**3), 10**3),
        st.integers(10**6, 10**30),
        st.integers(-(10**30), -1),
        st.lists(st.one_of(st.integers(), st.text(max_size=4)), max_size=4),
        st.dictionaries(st.text(max_size=6), st.one_of(st.integers(), st.none(), st.text(max_size=4)), max_size=3),
    )

    @st.composite
    def config(draw) -> str:
        data = {**TINY_LLAMA, **draw(st.dictionaries(keys, values, min_size=1, max_size=4))}
        text = json.dumps(data)
        depth = draw(st.sampled_from([0, 0, 20, 990, 5000]))
        padding = draw(st.sampled_from([0, 0, 1 << 20, 5 << 20]))
        extra = ([f'"deep": {"[" * depth}{"]" * depth}'] if depth else []) + (
            [f'"pad": "{"x" * padding}"'] if padding else []
        )
        return text[:-1] + "".join(", " + e for e in extra) + "}"

    return config()


def typed_failure(error: str) -> bool:
    """A recorded failure "Kind: message" whose Kind is one of zoo's typed errors (zoo.errors), with a message."""
    import zoo.errors

    kind, _, message = error.partition(":")
    found = getattr(zoo.errors, kind, None)
    return isinstance(found, type) and issubclass(found, zoo.errors.ZooError) and bool(message.strip())


@pytest.mark.parametrize(
    "error, typed",
    [
        ("InvalidRecipe: num_hidden_layers is 10^9", True),
        ("HubUnavailable: gone", True),
        ("ValueError: bad", False),
        ("RecursionError: deep", False),
        ("reason: x", False),
        ("InvalidRecipe:", False),
    ],
)
def test_fuzz_counts_only_zoos_typed_errors_as_typed_failures(error, typed):
    assert typed_failure(error) is typed


@pytest.mark.slow  # six bounded `zoo index hf` processes: a minute
def test_fuzz_hostile_configs_each_fail_alone_or_index(tmp_path):
    """Every hostile config.json ends in a recorded failure naming a typed error, or in a row, in one `zoo index hf`
    run held to a GiB beyond its imports and 60 s per config; the good config after them is always indexed."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_hostile_configs_batch())
    def run(batch):
        folder = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        sources = [write_config(folder, f"c{i}", text) for i, text in enumerate(batch)]
        good = write_config(folder, "good", TINY_LLAMA)
        try:
            proc, outcome = index_hf_bounded(folder, [*sources, good], timeout=60 * (len(batch) + 1))
        finally:
            for source in sources:
                Path(source).unlink()
        failed = outcome["failed"]
        assert outcome["indexed"] + len(failed) == len(batch) + 1, outcome
        assert "hf/good" not in failed and proc.returncode == (1 if failed else 0), outcome
        for name, error in failed.items():
            assert typed_failure(error), (name, error)

    run()


def _hostile_configs_batch():
    from hypothesis import strategies as st

    return st.lists(_hostile_configs(), min_size=3, max_size=3)
