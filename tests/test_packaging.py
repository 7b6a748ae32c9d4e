"""zoo as users get it: a wheel installed into a fresh virtual environment, run outside the checkout;
and alembic as contributors run it, from the repository root with the shipped alembic.ini."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ROOT
from zoo.registry import db

# What a checkout holds besides the sources: none of it goes into a wheel.
_NOT_SOURCES = shutil.ignore_patterns(
    ".venv",
    ".git",
    "build",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    "tests",
    "bench",
    "registry.db-*",
)


def _run(*args, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZOO_REGISTRY", "VIRTUAL_ENV")}
    return {**env, **extra}


@pytest.mark.slow
def test_a_wheel_in_a_fresh_venv_finds_its_registry_and_migrations_outside_the_checkout(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=_NOT_SOURCES)
    wheels = tmp_path / "wheels"
    # No build isolation: setuptools is already here, and the build must not need the network.
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        wheels,
        source,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("zoo-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    # torch, timm and the rest come from this environment's site-packages (a .pth line adds the folder
    # without running its .pth files, so the checkout's editable zoo stays out); zoo from the wheel.
    inner = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).stdout.strip()
    )
    (inner / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env()
    where = _run(
        python,
        "-c",
        "import zoo, zoo.constants as c; print(zoo.__file__); print(c.DEFAULT_REGISTRY)",
        cwd=elsewhere,
        env=env,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(inner), where  # the installed zoo, not the checkout's
    shipped = Path(where[1])
    assert shipped.is_relative_to(inner) and shipped.is_file() and not shipped.is_symlink()
    assert shipped.stat().st_size == (ROOT / "registry.db").stat().st_size

    found = _run(venv / "bin" / "zoo", "search", "params<1e8 and name~'resnet18'", cwd=elsewhere, env=env).stdout
    assert "timm/resnet18" in found and "torchvision/resnet18" in found
    # the predicted fields read the hardware table the wheel ships (the checkout's catalog/ is not there)
    found = _run(
        venv / "bin" / "zoo", "search", "name~'resnet18' and pred_infer_4090_amp>1", cwd=elsewhere, env=env
    ).stdout
    assert "torchvision/resnet18" in found and "(predicted)" in found
    # and a plan's step time the step correction table the wheel ships
    planned = _run(
        venv / "bin" / "zoo", "plan", "timm/resnet18", "--hardware", "RTX 4090", cwd=elsewhere, env=env
    ).stdout
    assert "(roofline / " in planned and "timm.models.resnet" in planned, planned

    new = elsewhere / "new.db"
    upgraded = _run(venv / "bin" / "zoo", "db", "upgrade", "--registry", new, cwd=elsewhere, env=env).stdout
    assert f"schema at {db.SCHEMA_REVISION}" in upgraded
    assert (
        _run(venv / "bin" / "zoo", "--registry", new, "db", "revision", cwd=elsewhere, env=env).stdout.strip()
        == db.SCHEMA_REVISION
    )
    # an installed zoo has no catalog/: indexing timm architectures works without timm's published throughput
    indexed = _run(
        venv / "bin" / "zoo", "--registry", new, "index", "timm", "resnet18", "--json", "-q", cwd=elsewhere, env=env
    ).stdout
    assert (json.loads(indexed)["indexed"], json.loads(indexed)["failed"]) == (1, {}), indexed


def test_alembic_runs_from_the_repository_root_with_the_shipped_ini(tmp_path):
    registry = tmp_path / "contributor.db"
    env = _clean_env(ZOO_REGISTRY=str(registry))
    alembic = [sys.executable, "-m", "alembic", "-c", ROOT / "alembic.ini"]
    _run(*alembic, "upgrade", "head", cwd=ROOT, env=env)
    assert db.SCHEMA_REVISION in _run(*alembic, "current", cwd=ROOT, env=env).stdout
    assert db.SCHEMA_REVISION in _run(*alembic, "heads", cwd=ROOT, env=env).stdout
    # autogenerate finds nothing to add: the migrations build exactly the tables zoo declares
    checked = _run(*alembic, "check", cwd=ROOT, env=env)
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr
