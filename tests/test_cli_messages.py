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


@pytest.mark.slow  # a fresh process: 10 s
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


def _tied_state(**changed):
    state = {k: v.contiguous() for k, v in tied_net().state_dict().items() if k != "head.weight"}  # tied to embed
    return {**state, **changed}


@pytest.mark.parametrize(
    ("changed", "status", "first_line"),
    [
        ({}, 0, "fits user/tied exactly (4 tensors)"),
        (
            {"proj.weight": torch.zeros(3, 3)},
            1,
            "does not fit user/tied (3 fit, 1 misshaped, 0 missing, 0 unexpected)",
        ),
        (
            {"extra.bias": torch.zeros(2)},
            1,
            "does not fit user/tied (4 fit, 0 misshaped, 0 missing, 1 unexpected)",
        ),
    ],
)
def test_check_says_whether_the_file_fits_before_what_matched(
    small_registry, tmp_path, capsys, changed, status, first_line
):
    """A file with a misshaped tensor read as '1 tensors match user/tied' before: a success to a reader."""
    path = tmp_path / "w.safetensors"
    save_file(_tied_state(**changed), path)
    assert main(["check", "user/tied", str(path), "--registry", small_registry]) == status
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: {first_line}"
    assert "tensors match" not in "\n".join(out)


def test_check_of_a_file_that_only_needs_a_cast_loads_it(small_registry, tmp_path, capsys):
    path, state = tmp_path / "w.safetensors", _tied_state()
    save_file({k: v.half() for k, v in state.items()}, path)
    assert main(["check", "user/tied", str(path), "--registry", small_registry]) == 0
    summary = capsys.readouterr().out.splitlines()[0]
    assert summary.endswith(
        "fits user/tied with 4 tensors cast to the model's dtype (4 fit, 0 misshaped, 0 missing, 0 unexpected)"
    )
    m = zoo.connect(small_registry).get("user/tied", weights=path)
    assert m.proj.weight.dtype == torch.float32
    assert torch.equal(m.proj.weight, state["proj.weight"].half().float())


def test_show_of_a_model_indexed_with_its_input_shows_that_input(tmp_path, capsys, monkeypatch):
    """`zoo index builder --input 1,3,32,32` recorded the input (FLOPs are at it) while `zoo show` said '-'."""
    monkeypatch.setenv("ZOO_TRUSTED_MODULES", "tests")
    registry = str(tmp_path / "r.db")
    argv = ["index", "builder", "tests.builders:conv_net", "--name", "conv", "--input", "1,3,32,32"]
    assert main([*argv, "--registry", registry]) == 0
    capsys.readouterr()
    assert main(["show", "user/conv", "--registry", registry]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("input size"))
    assert line.split(None, 2)[2] == "1x3x32x32 float32 (given when indexed)"


@pytest.mark.parametrize(
    ("builder", "reason"),
    [
        (
            "tests.no_such_module:build",
            "ModuleNotFoundError: No module named 'tests.no_such_module'",
        ),
        ("tests.builders:no_such_function", "module tests.builders has no function no_such_function"),
    ],
)
def test_a_builder_that_cannot_be_imported_records_nothing(tmp_path, capsys, builder, reason):
    """Both were recorded as failed rows (a typo left a model named user/net that can never build)."""
    registry = tmp_path / "r.db"
    assert main(["index", "builder", builder, "--name", "net", "--registry", str(registry)]) == 1
    assert capsys.readouterr().err == f"zoo: error: builder {builder!r} cannot be imported: {reason}\n"
    assert not registry.exists()
    assert main(["index", "builder", "tests.builders:conv_net", "--name", "conv", "--registry", str(registry)]) == 0
    with pytest.raises(zoo.InvalidRecipe, match="cannot be imported"):
        zoo.connect(str(registry)).index_builder(builder, "net")
    assert [m.name for m in zoo.connect(str(registry)).search()] == ["user/conv"]
