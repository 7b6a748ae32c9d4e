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
