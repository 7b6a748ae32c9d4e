"""Fixtures: fresh registries made by zoo's own indexer, and a runner for the `zoo` CLI."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A few real models of each family; cheap to build, yet they cover the interesting cases.
SMALL_TIMM = ["resnet18", "vit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "efficientnet_b0"]
SMALL_TORCHVISION = ["resnet18", "mobilenet_v3_small", "fasterrcnn_mobilenet_v3_large_fpn"]


@pytest.fixture(autouse=True)
def _trust_test_builders(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("ZOO_TRUSTED_MODULES", "tests")
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path_factory.getbasetemp() / "zoo_cache"))  # not ~/.cache


@pytest.fixture(scope="session")
def small_registry(tmp_path_factory) -> str:
    """A registry holding SMALL_TIMM, SMALL_TORCHVISION and the tied test builder; treat it as read-only."""
    from zoo.indexing import indexer
    from zoo.recipe import Recipe

    url = f"sqlite:///{tmp_path_factory.mktemp('registry') / 'small.db'}"
    indexer.index_family(url, "timm", SMALL_TIMM)
    indexer.index_family(url, "torchvision", SMALL_TORCHVISION)
    indexer.index_one(url, "user/tied", Recipe("user", "tests.builders:tied_net"), trusted={"tests"})
    return url


@pytest.fixture(scope="session")
def hf_catalog(tmp_path_factory):
    """The shipped catalog/hf configs indexed with the CLI, as `make registry` does (with analysis): its URL.
    Shared by test_hf and test_llm (indexing it takes about a minute here), which only read it: checked at the end."""
    url = f"sqlite:///{tmp_path_factory.mktemp('catalog') / 'catalog.db'}"
    files = sorted(str(p) for p in (ROOT / "catalog" / "hf").glob("*__*.json"))
    out = cli_json("index", "hf", *files, registry=url)
    assert out == {"indexed": len(files), "unchanged": 0, "failed": {}}
    before = _contents(url)
    yield url
    assert _contents(url) == before, "a test wrote to the shared catalog registry"


def _contents(url: str) -> str:
    """A digest of a SQLite registry's rows and schema (its file's bytes may change where its rows do not)."""
    import sqlite3

    con = sqlite3.connect(f"file:{url.removeprefix('sqlite:///')}?mode=ro", uri=True)
    try:
        return hashlib.sha256("\n".join(con.iterdump()).encode()).hexdigest()
    finally:
        con.close()


@pytest.fixture
def zoo_at(small_registry, monkeypatch):
    """The zoo module, pointed at the small registry."""
    import zoo

    monkeypatch.setenv("ZOO_REGISTRY", small_registry.removeprefix("sqlite:///"))
    return zoo


@pytest.fixture
def fresh_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'fresh.db'}"


_pg_skipped: list[str] = []


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium driven by Selenium (tests/web_support.py), one per test module."""
    from tests.web_support import chromium

    driver = chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server for the session (tests/pg.py). Where it cannot start, the PostgreSQL tests
    fail when CI is set (CI must run them) and are skipped, loudly, otherwise."""
    import psycopg

    from tests import pg

    try:
        server = pg.start()
    except (pg.Unavailable, psycopg.Error, OSError, subprocess.SubprocessError) as e:
        reason = f"PostgreSQL server could not be started: {e}"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI is set: the PostgreSQL tests must run here)", pytrace=False)
        _pg_skipped.append(reason)
        pytest.skip(reason)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request, tmp_path) -> str:
    """A fresh, empty registry on each backend: a SQLite file, or a new PostgreSQL database (ICU collation)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    return request.getfixturevalue("pg_server").fresh()


def pytest_terminal_summary(terminalreporter):
    if _pg_skipped:
        terminalreporter.write_sep("!", "PostgreSQL tests SKIPPED", red=True, bold=True)
        terminalreporter.write_line(_pg_skipped[0])


def run_cli(*args, registry: str | None = None, check: bool = True, timeout: int = 600, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if registry:
        env["ZOO_REGISTRY"] = registry.removeprefix("sqlite:///")
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"zoo {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def cli_json(*args, **kwargs):
    return json.loads(run_cli(*args, "--json", **kwargs).stdout)
