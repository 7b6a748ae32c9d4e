"""Fixtures: fresh registries made by zoo's own indexer, and a runner for the `zoo` CLI."""

import hashlib
import io
import json
import locale
import os
import sqlite3
import subprocess
import sys
import threading
import traceback
import warnings
from pathlib import Path

import pytest

# OpenMP threads that wait for work sleep instead of spinning. The machines these tests run on are shared and small
# (2 cores, other jobs beside): torch's idle intra-op threads spun on a core another process needed, and the heavy
# modules took three times as long (tests/test_timm_checks.py, 2 threads either way). Set before torch is imported
# (libgomp reads it once, at load); the CLI processes and ranks the tests start inherit it. Same threads, same results.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
# A few real models of each family; cheap to build, yet they cover the interesting cases.
SMALL_TIMM = ["resnet18", "vit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "efficientnet_b0"]
SMALL_TORCHVISION = ["resnet18", "mobilenet_v3_small", "fasterrcnn_mobilenet_v3_large_fpn"]


@pytest.fixture(autouse=True)
def _trust_test_builders(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("ZOO_TRUSTED_MODULES", "tests")
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path_factory.getbasetemp() / "zoo_cache"))  # not ~/.cache


@pytest.fixture(scope="session")
def small_registry(tmp_path_factory):
    """A registry holding SMALL_TIMM, SMALL_TORCHVISION and the tied test builder: its URL. Read-only (checked at
    the end): a test that writes works on a copy (sqlite_copy)."""
    from zoo.indexing import indexer
    from zoo.recipe import Recipe

    url = f"sqlite:///{tmp_path_factory.mktemp('registry') / 'small.db'}"
    indexer.index_family(url, "timm", SMALL_TIMM)
    indexer.index_family(url, "torchvision", SMALL_TORCHVISION)
    indexer.index_one(url, "user/tied", Recipe("user", "tests.builders:tied_net"), trusted={"tests"})
    before = _contents(url)
    yield url
    assert _contents(url) == before, "a test wrote to the shared small registry: copy it with sqlite_copy"


@pytest.fixture(scope="session")
def hf_catalog(tmp_path_factory):
    """The shipped catalog/hf configs indexed with the CLI, as `make registry` does (with analysis, without the plan
    fits): its URL.
    Shared by test_hf and test_llm (indexing it takes about a minute here), which only read it: checked at the end."""
    url = f"sqlite:///{tmp_path_factory.mktemp('catalog') / 'catalog.db'}"
    files = sorted(str(p) for p in (ROOT / "catalog" / "hf").glob("*__*.json"))
    # without the plan's activation fits (eight meta steps in each of three modes, a model): these tests read the
    # LLM fields, counts and analysis; tests/test_plan_fits.py checks the fits, and the shipped registry has them
    out = cli_json("index", "hf", *files, registry=url, env_extra={"ZOO_PLAN_FITS": "0"})
    assert out == {"indexed": len(files), "unchanged": 0, "failed": {}}
    before = _contents(url)
    yield url
    assert _contents(url) == before, "a test wrote to the shared catalog registry"


@pytest.fixture(scope="session")
def conv_and_tied(tmp_path_factory):
    """A compacted registry (one file, a rollback journal) holding user/conv with its input spec (so it has FLOPs
    and can be benched) and user/tied: its URL. Shared by test_nonfinite and test_search_fields, which read it or
    copy it with sqlite_copy; checked unchanged at the end."""
    from zoo.indexing import indexer
    from zoo.recipe import Recipe
    from zoo.registry import db

    url = f"sqlite:///{tmp_path_factory.mktemp('conv_and_tied') / 'r.db'}"
    index_conv(url)
    indexer.index_one(url, "user/tied", Recipe("user", "tests.builders:tied_net"), trusted={"tests"})
    db.compact(url)
    before = _contents(url)
    yield url
    assert _contents(url) == before, "a test wrote to the shared conv_and_tied registry"


def index_conv(url: str) -> None:
    """Index user/conv (tests.builders.conv_net) with its input, so that it has FLOPs and can be benched."""
    from zoo.indexing import indexer
    from zoo.recipe import Recipe

    conv = Recipe("user", "tests.builders:conv_net")
    indexer.index_one(url, "user/conv", conv, trusted={"tests"}, inputs=[{"shape": [1, 3, 32, 32]}])


def sqlite_copy(source: str, target) -> str:
    """A copy of the SQLite registry `source` (a URL or path) at the path `target`, in the source's journal mode:
    its URL. Made with SQLite's backup API (a write-ahead log's pages too), never by copying the file, which would
    drop this process's locks on it (DESIGN.md)."""
    src = sqlite3.connect(f"file:{source.removeprefix('sqlite:///')}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
        mode = src.execute("PRAGMA journal_mode").fetchone()[0]
        dst.execute(f"PRAGMA journal_mode={'DELETE' if mode.lower() != 'wal' else 'WAL'}")
    finally:
        src.close()
        dst.close()
    return f"sqlite:///{target}"


def _contents(url: str) -> str:
    """A digest of a SQLite registry's rows and schema (its file's bytes may change where its rows do not)."""
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


# Markers for the real components a test starts, from the fixtures it uses (pyproject.toml registers them), so
# that `-m "not browser"` and the like select by what a test needs; `make test-fast` leaves these out.
_COMPONENT_FIXTURES = {
    "browser": "browser",  # headless Chromium (tests/web_support.py)
    "pg_server": "postgres",  # a PostgreSQL server (tests/pg.py)
    "two_ranks": "distributed",  # gloo ranks started with torch.multiprocessing.spawn (test_dropin, test_dcp)
    "four_ranks": "distributed",
}


# Session fixtures that take a minute or more to build: the tests that use them are slow (make test-fast leaves
# them out, and so does not build them).
_SLOW_FIXTURES = {"hf_catalog"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker in sorted({m for f, m in _COMPONENT_FIXTURES.items() if f in used}):
            item.add_marker(marker)
        if used & _SLOW_FIXTURES:
            item.add_marker("slow")
        # a parametrized registry fixture (backend_url, registry_url, ...) asks for pg_server by getfixturevalue
        # under its "postgresql" param: the fixture closure does not show it
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(v, str) and v == "postgresql" for v in params.values()):
            item.add_marker("postgres")


def pytest_terminal_summary(terminalreporter):
    if _pg_skipped:
        terminalreporter.write_sep("!", "PostgreSQL tests SKIPPED", red=True, bold=True)
        terminalreporter.write_line(_pg_skipped[0])


def run_cli(
    *args,
    registry: str | None = None,
    check: bool = True,
    timeout: int = 600,
    env_extra=None,
    process: bool = False,
) -> subprocess.CompletedProcess:
    """`zoo ARGS`: its exit status, stdout and stderr, as a subprocess.CompletedProcess.

    By default the CLI runs in this process (zoo.cli.main), as a fresh process would see it: `registry` and
    `env_extra` in os.environ for the call only, the working directory at the repository root, zoo's caches
    emptied before and after (a fresh process starts without them; disposing of the engines at the end is what
    an exiting process does to its SQLite connections, so a WAL is checkpointed and deleted as it would be),
    Python's default warning filters, stdout and stderr captured. A SystemExit becomes its exit status and an
    uncaught exception status 1 with its traceback on stderr. `timeout` then applies only to process=True
    (pytest-timeout bounds every test).

    process=True runs `python -m zoo.cli` in a subprocess instead, where the process is the point: a signal,
    a kill, several processes at once, an environment variable read at import, what a fresh process imports."""
    if process:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if registry:
            env["ZOO_REGISTRY"] = registry.removeprefix("sqlite:///")
        env.update(env_extra or {})
        proc = subprocess.run(
            [sys.executable, "-m", "zoo.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=ROOT,
        )
    else:
        extra = {"ZOO_REGISTRY": registry.removeprefix("sqlite:///")} if registry else {}
        proc = _run_cli_here([str(a) for a in args], {**extra, **(env_extra or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"zoo {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


# A fresh interpreter's warning filters (python -W and PYTHONWARNINGS add to them; neither is used here).
_FRESH_WARNING_FILTERS = [
    ("default", None, DeprecationWarning, "__main__", 0),
    ("ignore", None, DeprecationWarning, None, 0),
    ("ignore", None, PendingDeprecationWarning, None, 0),
    ("ignore", None, ImportWarning, None, 0),
    ("ignore", None, ResourceWarning, None, 0),
]


def _decoded(stream: io.TextIOWrapper) -> str:
    """What subprocess.run(text=True) reads from a pipe: the locale's encoding, universal newlines."""
    stream.flush()
    data = stream.buffer.getvalue()
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _run_cli_here(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    from zoo import caching
    from zoo.cli import main

    if threading.current_thread() is not threading.main_thread():  # the environment and sys.stdout are the process's
        raise RuntimeError("run_cli from a thread: pass process=True (one process per concurrent CLI)")

    # a process's pipes: text over bytes (.buffer), the encodings and error handlers Python gives them
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    saved_env, saved_cwd, saved_streams = dict(os.environ), os.getcwd(), (sys.stdout, sys.stderr)

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    caching.cache_clear()
    try:
        os.environ.update(env)
        os.chdir(ROOT)
        sys.stdout, sys.stderr = out, err
        with warnings.catch_warnings():
            warnings.filters[:] = _FRESH_WARNING_FILTERS
            warnings.showwarning = show
            try:
                code = main(argv)
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:  # sys.exit("message"): the message on stderr, status 1
                    print(e.code, file=sys.stderr)
                    code = 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        for name in set(os.environ) - set(saved_env):
            del os.environ[name]
        for name, value in saved_env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        caching.cache_clear()
    # sys.exit(main()): None is 0, a status beyond a byte wraps as a process's does
    return subprocess.CompletedProcess(["zoo", *argv], (code or 0) & 0xFF, _decoded(out), _decoded(err))


def cli_json(*args, **kwargs):
    return json.loads(run_cli(*args, "--json", **kwargs).stdout)
