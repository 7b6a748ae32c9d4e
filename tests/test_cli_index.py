"""`zoo index SOURCE`: each source's subparser takes its own flags only (another source's is argparse's usage
error, exit 2, with nothing written), and a rule argparse cannot say is Zoo.index's, the same typed error from
Python and from the CLI."""

import pytest

import zoo
from zoo.cli import main, parser
from zoo.errors import InvalidArgument

SHARED = {"-h", "--help", "--registry", "--force", "--json"}
FLAGS = {  # the options each source takes, beyond SHARED
    "timm": {"--quiet", "-q", "--jobs", "-j", "--pretrained", "--results"},
    "torchvision": {"--quiet", "-q", "--jobs", "-j", "--pretrained"},
    "installed": {"--quiet", "-q", "--jobs", "-j", "--results"},
    "builder": {"--name", "--kwargs", "--input"},
    "checkpoint": {"--name"},
    "hf": {"--quiet", "-q", "--name", "--revision", "--author", "--search", "--filter", "--limit", "--local-cache"},
}


def _sources() -> dict:
    index = next(a for a in parser()._actions if a.dest == "command").choices["index"]
    return next(a for a in index._actions if a.dest == "source").choices


def test_each_source_declares_exactly_its_own_flags():
    sources = _sources()
    assert set(sources) == set(FLAGS)
    for name, sub in sources.items():
        assert {o for a in sub._actions for o in a.option_strings} == SHARED | FLAGS[name], name


def test_index_help_lists_the_sources_and_each_source_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["index", "--help"])
    listed = capsys.readouterr().out
    assert done.value.code == 0 and all(f"\n    {name} " in listed for name in FLAGS), listed
    with pytest.raises(SystemExit) as done:
        main(["index", "hf", "--help"])
    hf = capsys.readouterr().out
    assert done.value.code == 0 and hf.startswith("usage: zoo index hf") and "--author" in hf and "--jobs" not in hf


def _checkpoint(tmp_path) -> str:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    return str(tmp_path / "w.safetensors")


# a command of each source with a flag of another source: refused for that flag alone
@pytest.mark.parametrize(
    "source, valid, foreign",
    [
        ("timm", ["resnet18"], ["--author", "org"]),
        ("timm", ["resnet18"], ["--name", "x"]),
        ("torchvision", ["resnet18"], ["--results", "catalog/timm-results"]),
        ("installed", ["resnet18"], ["--pretrained"]),
        ("installed", ["resnet18"], ["--input", "1,3,8,8"]),
        ("builder", ["tests.builders:tied_net", "--name", "tied"], ["-j", "2"]),
        ("builder", ["tests.builders:tied_net", "--name", "tied"], ["--pretrained"]),
        ("checkpoint", ["CHECKPOINT"], ["--kwargs", "{}"]),
        ("checkpoint", ["CHECKPOINT"], ["--revision", "main"]),
        ("hf", ["CHECKPOINT"], ["-j", "2"]),
        ("hf", ["CHECKPOINT"], ["--input", "1,3,8,8"]),
    ],
)
def test_a_source_refuses_another_sources_flag_and_writes_nothing(tmp_path, capsys, source, valid, foreign):
    registry = tmp_path / "r.db"
    valid = [_checkpoint(tmp_path) if a == "CHECKPOINT" else a for a in valid]
    with pytest.raises(SystemExit) as done:
        main(["index", source, *valid, *foreign, "--registry", str(registry)])
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert err.startswith(f"usage: zoo index {source} ") and f"unrecognized arguments: {' '.join(foreign)}" in err, err
    assert not registry.exists()


def test_patterns_may_follow_options():
    args = parser().parse_args(["index", "timm", "-j", "2", "vit_*", "--force", "resnet*"])
    assert (args.targets, args.jobs, args.force) == (["vit_*", "resnet*"], 2, True)


# hf takes config sources or the hub's listing: not both, and not neither (argparse cannot say so)
@pytest.mark.parametrize(
    "targets, options, flags",
    [
        (["some/repo"], {"author": "org"}, ["some/repo", "--author", "org"]),
        ([], {"local_cache": True, "revision": "main"}, ["--local-cache", "--revision", "main"]),
        ([], {}, []),
    ],
)
def test_hf_sources_or_listing_is_checked_once_in_the_api(tmp_path, capsys, monkeypatch, targets, options, flags):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # were the rule gone, the hub is not asked
    registry = tmp_path / "r.db"
    with pytest.raises(InvalidArgument, match="config sources .* or the hub's listing") as raised:
        zoo.connect(str(registry)).index("hf", targets, **options)
    assert main(["index", "hf", *flags, "-q", "--registry", str(registry)]) == 1
    assert capsys.readouterr().err == f"zoo: error: {raised.value}\n"
    assert not registry.exists()


def test_the_hub_listing_options_are_hf_only_in_the_api(tmp_path):
    with pytest.raises(InvalidArgument, match="apply to hf sources, not to timm"):
        zoo.connect(str(tmp_path / "r.db")).index("timm", ["resnet18"], author="org")
    assert not (tmp_path / "r.db").exists()
