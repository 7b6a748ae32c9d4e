"""The CLI's and the API's messages read well: a close name instead of ninety, the device people mean, a path as
a shell reads it, a pattern that matches nothing said so, and no library's deprecation warnings in zoo's output."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import zoo
from tests.builders import tied_net
from tests.conftest import ROOT
from zoo.cli import main


def test_an_unknown_field_names_the_close_ones_and_the_caret_has_its_line(small_registry, capsys):
    assert main(["search", "parms<1e9", "--registry", small_registry]) == 1
    err = capsys.readouterr().err
    assert "unknown field 'parms'; did you mean params" in err and "zoo search --fields" in err
    assert "infer_4090_amp" not in err  # not every field
    assert err.splitlines()[1:] == ["  parms<1e9", "  ^ (column 1)"]


def test_gpu_as_a_device_suggests_cuda(small_registry):
    with pytest.raises(zoo.InvalidArgument, match="device 'gpu' cannot be used; did you mean 'cuda'") as caught:
        zoo.connect(small_registry).get("user/tied", device="gpu")
    assert caught.value.argument == "device"


def test_a_weights_path_under_the_home_folder_is_read_as_a_shell_would(small_registry, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    state = {k: v.contiguous() for k, v in tied_net().state_dict().items() if k != "head.weight"}  # tied to embed
    save_file(state, tmp_path / "tied.safetensors")
    m = zoo.connect(small_registry).get("user/tied", weights="~/tied.safetensors")
    assert torch.equal(m.embed.weight, state["embed.weight"]) and torch.equal(m.proj.weight, state["proj.weight"])


def test_index_patterns_that_match_nothing_fail_and_name_the_close_ones(tmp_path, capsys):
    registry = str(tmp_path / "r.db")
    assert main(["index", "timm", "vti_*", "--registry", registry, "-q"]) == 1
    assert "'vti_*' match no timm model; did you mean vit_*" in capsys.readouterr().err
    assert not os.path.exists(registry)  # nothing created for nothing indexed


def test_indexing_a_config_says_nothing_of_transformers_deprecations(tmp_path):
    """GPT-2's published config names no dtype; the analysis asked its config for torch_dtype too, which
    transformers 5 answers with a deprecation warning, printed in the middle of `zoo index`'s output."""
    config = ROOT / "catalog" / "hf" / "openai-community__gpt2.json"
    assert "dtype" not in config.read_text()
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "index", "hf", str(config), "--registry", str(tmp_path / "r.db"), "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "deprecated" not in proc.stderr and "torch_dtype" not in proc.stderr, proc.stderr
    assert zoo.connect(str(tmp_path / "r.db")).info("hf/openai-community/gpt2").dtype == "float32"
