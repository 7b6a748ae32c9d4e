"""A newcomer's first hour: what the README says works as written, an
unreachable hub is told once and quickly, estimate's notes and errors speak of the model and the flags the
user gave, and the help says what each argument is."""

import pytest

import zoo
from tests.conftest import cli_json, run_cli
from zoo.errors import AnalysisError

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("first-hour")
    transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        max_position_embeddings=64,
    ).save_pretrained(root / "c")
    registry = zoo.connect(f"sqlite:///{root / 'tiny.db'}")
    assert registry.index("hf", [str(root / "c")], name="hf/test-org/tiny-llama").failed == {}
    return registry


# --- 17. estimate: notes, warnings, flags --------------------------------------------------------


def test_17_a_llama_estimate_notes_no_multi_latent_attention(tiny_llama):
    got = tiny_llama.estimate("hf/test-org/tiny-llama", seq_len=8)
    assert got.kv_cache and any("kv_cache" in n for n in got.notes)
    assert not any("latent" in n for n in got.notes), got.notes


def test_17_no_transformers_deprecation_warning_leaks_from_an_estimate(tiny_llama):
    proc = run_cli("estimate", "hf/test-org/tiny-llama", "--seq-len", "8", registry=tiny_llama.url)
    assert "deprecated" not in proc.stderr and "past_key_values" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args, flag",
    [
        (("--weights-dtype", "int8", "--training"), "--weights-dtype"),
        (("--checkpointing",), "--training"),
        (("--kv-dtype", "fp4"), "--kv-dtype"),
    ],
)
def test_17_cli_errors_name_the_flags_not_python_arguments(tiny_llama, args, flag):
    proc = run_cli("estimate", "hf/test-org/tiny-llama", *args, registry=tiny_llama.url, check=False)
    assert proc.returncode == 1 and flag in proc.stderr, proc.stderr
    assert not any(word in proc.stderr for word in ("weights_dtype", "kv_dtype", "training=True", "seq_len")), (
        proc.stderr
    )


def test_17_seq_len_and_kv_dtype_are_refused_for_a_vision_model(zoo_at):
    with pytest.raises(AnalysisError, match="seq_len"):
        zoo_at.estimate("timm/resnet18", seq_len=16)
    with pytest.raises(AnalysisError, match="kv_dtype"):
        zoo_at.estimate("timm/resnet18", kv_dtype="fp8")
    proc = run_cli("estimate", "timm/resnet18", "--seq-len", "16", check=False)
    assert proc.returncode == 1 and "--seq-len" in proc.stderr, proc.stderr
    assert zoo_at.estimate("timm/resnet18").seq_len is None  # without them it runs as before


# --- 18. commands and names the user can use ------------------------------------------------------


def test_18_tokenizer_not_cached_names_the_installed_download_command(tiny_llama, tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    from huggingface_hub import constants

    from zoo.errors import TokenizerNotCached

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerNotCached) as e:
        tiny_llama.scan("hf/test-org/tiny-llama", "hello world")
    assert "huggingface-cli" not in str(e.value) and "`hf download test-org/tiny-llama" in str(e.value)
    assert (Path(sys.executable).parent / "hf").exists()  # the command the message names is installed


def test_18_a_missing_local_cache_says_where_it_looked_not_cache_dir(tmp_path):
    proc = run_cli(
        "index",
        "hf",
        "--local-cache",
        "-q",
        "--registry",
        str(tmp_path / "r.db"),
        check=False,
        env_extra={"HF_HUB_CACHE": str(tmp_path / "nowhere")},
        process=True,  # huggingface_hub reads HF_HUB_CACHE once, at import
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cache_dir" not in proc.stderr and "HF_HUB_CACHE" in proc.stderr and "nowhere" in proc.stderr


# --- 13 and 15. the README as a newcomer reads it --------------------------------------------------


def _readme() -> str:
    from tests.conftest import ROOT

    return (ROOT / "README.md").read_text()


def test_13_the_readme_says_how_to_reach_the_zoo_command_after_make_run():
    import subprocess
    import sys
    from pathlib import Path

    setup = _readme().split("## Set-up", 1)[1].split("## Use", 1)[0]
    assert ".venv/bin/zoo" in setup and "source .venv/bin/activate" in setup, setup
    script = Path(sys.executable).parent / "zoo"  # what .venv/bin/zoo is in this environment
    assert subprocess.run([script, "--help"], capture_output=True, timeout=60).returncode == 0


def test_15_every_bare_name_the_readme_shows_resolves_on_the_shipped_registry(monkeypatch):
    import re

    monkeypatch.delenv("ZOO_REGISTRY", raising=False)
    names = re.findall(r'zoo\.info\("([^"/]+)"\)', _readme())
    assert names  # the README shows bare names
    for name in names:
        assert zoo.info(name).name.endswith("/" + name)  # AmbiguousName or ModelNotFound fail here


def test_15_the_readme_records_a_weights_tag_before_loading_it_and_installs_extras_from_the_checkout():
    text = _readme()
    first_use = text.index('weights="default"')
    assert "zoo weights add" in text[: text.index("\n", first_use)], "weights='default' before any zoo weights add"
    assert "pip install 'zoo[" not in text and "pip install -e '.[web]'" in text


# --- 19. help, usage and what the CLI records --------------------------------------------------------


@pytest.mark.parametrize(
    "command, argument",
    [
        ("search", "expression"),
        ("search", "--json"),
        ("search", "--limit"),
        ("show", "name"),
        ("check", "weights"),
        ("estimate", "--batch"),
        ("estimate", "--dtype"),
        ("weights", "--tag"),
        ("index timm", "-j"),
        ("index hf", "--limit"),
        ("index builder", "--kwargs"),
        ("rm", "name"),
    ],
)
def test_19_every_argument_has_help_and_shows_its_default(command, argument):
    from zoo.cli import parser

    sub = parser()
    for word in command.split():  # `zoo index SOURCE`: a subcommand of a subcommand
        sub = next(a for a in sub._actions if a.dest in ("command", "source")).choices[word]
    action = next(a for a in sub._actions if argument in a.option_strings or a.dest == argument)
    assert action.help, f"zoo {command} {argument} has no help"
    text = sub.format_help()
    if action.default not in (None, False) and action.option_strings:
        assert f"(default: {action.default})" in text, text


def test_19_db_usage_takes_at_most_src_and_dst():
    usage = run_cli("db", "--help").stdout.split("\n\n")[0]
    assert "[SRC] [DST]" in usage and "SRC DST ..." not in usage, usage


def test_19_a_checkpoint_name_without_a_family_gets_checkpoint_prefix(fresh_url, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    out = cli_json("index", "checkpoint", str(tmp_path / "w.safetensors"), "--name", "r50ckpt", registry=fresh_url)
    assert out["name"] == "checkpoint/r50ckpt"


def test_19_weights_list_shows_a_recorded_file_under_file_not_dataset(zoo_at, fresh_url, tmp_path):
    from safetensors.torch import save_file

    from tests.builders import tied_net

    registry = zoo.connect(fresh_url)
    registry.index_builder("tests.builders:tied_net", "tied")
    path = tmp_path / "tied.safetensors"
    save_file({k: v for k, v in tied_net().state_dict().items() if k != "head.weight"}, str(path))
    registry.add_weights("user/tied", path, tag="v1")
    lines = run_cli("weights", "list", "user/tied", registry=fresh_url).stdout.splitlines()
    header, row = lines[0].split(), lines[1]
    assert "file" in header and str(path) in row
    dataset_at = lines[0].index("dataset")
    assert not row[dataset_at:].startswith(str(path)[:5]), lines


def test_19_reindexing_a_builder_without_input_keeps_the_recorded_input(fresh_url):
    cli_json(
        "index", "builder", "tests.builders:conv_net", "--name", "convy", "--input", "1,3,32,32", registry=fresh_url
    )
    before = zoo.connect(fresh_url).info("user/convy")
    cli_json("index", "builder", "tests.builders:conv_net", "--name", "convy", "--force", registry=fresh_url)
    after = zoo.connect(fresh_url).info("user/convy")
    assert after.inputs == before.inputs and after.flops == before.flops and after.flops
