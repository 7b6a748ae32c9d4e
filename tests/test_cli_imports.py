"""A `zoo` process imports what its command needs: `zoo search` took 150-230 ms as a process, 5-8x a bare
interpreter, most of it importing what a search never runs (the load layer, build, analysis). The process's own
imports are the point, so each command runs in a fresh interpreter, on the shipped registry (read only)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SHIPPED = ROOT / "registry.db"
# Never for these commands: torch and SQLAlchemy (seconds), and zoo's load, build and analysis modules with what
# they bring in (the families import timm, torchvision or transformers).
HEAVY = (
    "torch",
    "sqlalchemy",
    "alembic",
    "numpy",
    "timm",
    "torchvision",
    "transformers",
    "zoo.load",
    "zoo.build",
    "zoo.meta",
    "zoo.model_cache",
    "zoo.materialize",
    "zoo.analysis",
    "zoo.families",
    "zoo.weights",
    "zoo.pretrained",
    "zoo.indexing",
    "zoo.state",
    "zoo.recipe",
    "zoo.web",
)
CODE = """
import json, sys
import zoo.cli
try:
    code = zoo.cli.main(json.loads(sys.argv[1]))
except SystemExit as e:  # --help and --version exit from argparse
    code = e.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "name~'timm/vit_*' and kind=architecture"],
        ["search", "params<1e8 and family=timm", "--sort", "-params", "--json"],
        ["show", "timm/resnet18"],
        ["show", "vit_tiny_patch16_224", "--tensors", "--json"],
        ["--help"],
        ["search", "--help"],
        ["--version"],
    ],
)
def test_search_show_help_and_version_import_nothing_heavy(argv):
    env = {"ZOO_REGISTRY": str(SHIPPED), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", CODE, json.dumps(argv)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr[-2000:]
    assert done.stdout.strip()  # the command did its work: a table, JSON, the help or the version
    heavy = [m for m in report["modules"] if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]
    assert heavy == []


def test_version_reads_the_package_metadata():
    from importlib.metadata import version

    done = subprocess.run(
        [sys.executable, "-m", "zoo.cli", "--version"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout == f"zoo {version('zoo')}\n"


def test_a_search_process_imports_neither_dataclasses_nor_typing_nor_shutil():
    """What a `zoo search` process spent most of its own time on, beyond building every command's parser: dataclasses
    (with inspect, ast, dis and tokenize), typing, and shutil (argparse's terminal width). bench/search_process.py
    times the process; this keeps those imports off its path."""
    argv = ["search", "name~'timm/vit_*' and kind=architecture"]
    env = {"ZOO_REGISTRY": str(SHIPPED), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", CODE, json.dumps(argv)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0 and "timm/vit_base_patch16_224" in done.stdout, done.stderr[-2000:]
    assert [m for m in ("dataclasses", "inspect", "typing", "shutil") if m in report["modules"]] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "params<1e8", "--sort=-params", "--limit", "5", "--json"],
        ["--registry", "r.db", "show", "timm/resnet18", "--tensors"],
        ["--registry=r.db", "estimate", "x", "--batch", "4", "--training", "--registry", "s.db"],
        ["index", "timm", "-j", "2", "vit_*", "--pretrained"],
        ["bench", "x", "--steps", "3"],
        ["plan", "x", "--hardware", "H100", "--fsdp", "2"],
        ["check", "x", "w.safetensors"],
        ["weights", "list", "x"],
        ["rm", "x"],
        ["serve", "--port", "9000"],
        ["catalog", "--out", "site"],
        ["db", "copy", "a.db", "b.db"],
    ],
)
def test_the_parser_of_the_command_run_parses_as_the_whole_parser_does(argv):
    """main builds only the subparser of the command argv names: the same arguments, usage and help."""
    from zoo.cli import _named_command, parser

    command = _named_command(argv)
    assert command == next(a for a in argv if not a.startswith("-") and a != "r.db")
    whole, alone = parser(), parser(command)
    assert alone.format_usage() == whole.format_usage()  # every command named, as argparse spells the choices

    def parsed(p):
        return {k: v for k, v in vars(p.parse_args(argv)).items() if k != "run"}  # run: a function made per parser

    assert parsed(alone) == parsed(whole)
    subparsers = [next(a for a in p._actions if a.dest == "command").choices for p in (whole, alone)]
    assert list(subparsers[1]) == [command]
    assert subparsers[1][command].format_help() == subparsers[0][command].format_help()


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h", "search"], ["--reg", "r.db", "search"], ["searc", "x"]])
def test_argv_that_names_no_command_first_gets_the_whole_parser(argv):
    from zoo.cli import _named_command

    assert _named_command(argv) is None
