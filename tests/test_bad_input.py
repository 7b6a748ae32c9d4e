"""What bad input gets, registry and CLI side: a typed error that says what to do,
exit 1 or 2 from the CLI and never a traceback, nothing written, nothing lost. Weight files and
materialize have their own catalogue (tests/test_bad_input_weights.py)."""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import zoo
from tests.conftest import ROOT, run_cli
from zoo.errors import (
    CheckpointError,
    InvalidArgument,
    InvalidRecipe,
    ModelExists,
    RegistryError,
    RegistryNotFound,
    SchemaOutdated,
    UntrustedBuilder,
)
from zoo.registry import db, store

ZOO_SCRIPT = Path(sys.executable).parent / "zoo"  # the console script: unlike `python -m`, no cwd on sys.path


@pytest.fixture
def writable(small_registry, tmp_path) -> str:
    """A copy of the small registry, compacted (rollback journal, as shipped), that a test may change."""
    path = tmp_path / "copy.db"
    source, copy = sqlite3.connect(small_registry.removeprefix("sqlite:///")), sqlite3.connect(path)
    source.backup(copy)  # the write-ahead log's pages too
    copy.execute("PRAGMA journal_mode=DELETE")
    source.close(), copy.close()
    return f"sqlite:///{path}"


def _path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("zoo: error:") or "usage:" in proc.stderr, proc.stderr


def _tied_weights(tmp_path) -> str:
    from tests.builders import tied_net

    state = {k: v for k, v in tied_net().state_dict().items() if k != "head.weight"}  # stored once, as tied
    path = tmp_path / "tied.safetensors"
    save_file(state, str(path))
    return str(path)


# --- 9. re-indexing keeps what was recorded -----------------------------------------------------


def test_9_reindexing_a_model_keeps_its_weights_tags(writable, tmp_path):
    registry = zoo.connect(writable)
    registry.add_weights("user/tied", _tied_weights(tmp_path), tag="default")
    before = registry.info("user/tied")
    registry.index_builder("tests.builders:tied_net", "tied", force=True)  # the same recipe, rebuilt
    registry.index_builder("tests.builders:tied_net", "tied", {"dim": 8})  # a changed recipe, same builder
    after = registry.info("user/tied")
    assert after.kwargs == {"dim": 8} and after.indexed_at > before.indexed_at
    assert [w["tag"] for w in after.weights] == ["default"]
    assert zoo.connect(writable).get("user/tied").materialize(weights="default") is not None
    failed = registry.index_builder("tests.builders:tied_net", "tied", {"dim": -1})  # a re-index that fails
    assert failed["status"] == "error"
    stale = registry.info("user/tied")
    assert stale.status == "error" and stale.params is None and stale.flops is None  # no figures of the old build
    assert [w["tag"] for w in stale.weights] == ["default"]


def test_9_replacing_a_model_with_another_builder_drops_its_weights_tags(writable, tmp_path):
    registry = zoo.connect(writable)
    registry.add_weights("user/tied", _tied_weights(tmp_path), tag="default")
    shipped = tmp_path / "shipped.pt"
    torch.save({"weight": torch.randn(2, 4), "bias": torch.randn(2)}, shipped)
    registry.index_builder("tests.builders:shipped_weights_net", "tied", {"path": str(shipped)}, force=True)
    assert [w["tag"] for w in registry.info("user/tied").weights] == ["constructor"]  # "default" was tied_net's
    registry.index_builder("tests.builders:tied_net", "tied", force=True)
    assert registry.info("user/tied").weights == []  # and "constructor" was shipped_weights_net's


def test_a_tag_file_swapped_after_its_check_is_refused_not_loaded(writable, tmp_path, monkeypatch):
    """The race the sha256 check must not lose: the file is checked, then replaced (os.replace, as a save
    does) before the load opens it. The open file is checked again, so the swapped-in values never load."""
    from tests.builders import tied_net
    from zoo.weights import digest

    registry = zoo.connect(writable)
    path = _tied_weights(tmp_path)
    registry.add_weights("user/tied", path, tag="v1")
    other = tmp_path / "other.safetensors"
    save_file({k: v + 1 for k, v in tied_net().state_dict().items() if k != "head.weight"}, str(other))
    check = digest.verify

    def check_then_swap(*args):
        check(*args)
        if other.exists():
            os.replace(other, path)

    monkeypatch.setattr(digest, "verify", check_then_swap)
    m = registry.get("user/tied")
    with pytest.raises(CheckpointError, match="differs from the recorded"):
        m.materialize(weights="v1")
    assert all(t.is_meta for t in m.state_dict().values())


# --- 10. a name is never replaced silently; the standard library is no builder ------------------


def test_10_another_familys_model_is_not_replaced_without_force(writable, tmp_path):
    registry = zoo.connect(writable)
    registry.add_weights("user/tied", _tied_weights(tmp_path), tag="mine")
    with pytest.raises(ModelExists, match=r"already a timm model .*--force"):
        registry.index_builder("tests.builders:tied_net", "timm/resnet18")
    assert registry.info("timm/resnet18").family == "timm"
    with pytest.raises(ModelExists, match=r"builder tests.builders:tied_net.* weights tags mine"):
        registry.index_builder("tests.builders:shipped_weights_net", "tied", {"path": "x"})
    assert registry.info("user/tied").builder == "tests.builders:tied_net"
    proc = run_cli(
        "index", "builder", "tests.builders:tied_net", "--name", "timm/resnet18", registry=writable, check=False
    )
    assert proc.returncode == 1 and "would replace it" in proc.stderr
    _no_traceback(proc)
    replaced = registry.index_builder("tests.builders:tied_net", "timm/resnet18", force=True)
    assert replaced["status"] == "ok" and registry.info("timm/resnet18").family == "user"


@pytest.mark.parametrize("builder", ["os:system", "subprocess:run", "builtins:exec", "shutil:rmtree"])
def test_10_standard_library_callables_are_no_builders(tmp_path, builder):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    with pytest.raises(UntrustedBuilder, match="standard library"):
        zoo.connect(url).index_builder(builder, "x")
    proc = run_cli("index", "builder", builder, "--name", "x", registry=url, check=False)
    assert proc.returncode == 1 and "standard library" in proc.stderr
    _no_traceback(proc)
    assert not _path(url).exists()  # nothing written, not even an empty registry


# --- 11. tags ---------------------------------------------------------------------------------------


def test_11_a_tag_with_a_dot_is_a_tag_before_it_is_a_path(writable, tmp_path):
    registry = zoo.connect(writable)
    path = _tied_weights(tmp_path)
    registry.add_weights("user/tied", path, tag="v1.0")
    loaded = registry.get("user/tied", weights="v1.0")
    expected = zoo.connect(writable).get("user/tied").materialize(weights=path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), expected.state_dict().values()))
    for tag in ("", "   ", "x" * 65):
        with pytest.raises(InvalidArgument, match="weights tag"):
            registry.add_weights("user/tied", path, tag=tag)
    proc = run_cli("weights", "add", "user/tied", path, "--tag", "", registry=writable, check=False)
    assert proc.returncode == 1 and "weights tag" in proc.stderr


# --- 12. registry files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, meaning",
    [
        ("text file", "not a SQLite database"),
        ("directory", "cannot be opened"),
        ("unknown dialect", "not a registry URL"),
        ("unreachable server", "cannot be reached"),
    ],
)
def test_12_a_registry_that_cannot_be_opened_is_a_registry_error(tmp_path, kind, meaning):
    if kind == "text file":
        (tmp_path / "notes.db").write_text("not a database at all, but long enough to have a header" * 20)
        url = str(tmp_path / "notes.db")
    elif kind == "directory":
        url = str(tmp_path)
    elif kind == "unknown dialect":
        url = "nosuchdb://host/zoo"
    else:  # port 9 (discard) on loopback: nothing listens
        url = "postgresql+psycopg://zoo:s3cret@127.0.0.1:9/zoo"
    with pytest.raises(RegistryError, match=meaning) as caught:
        zoo.connect(url).search("params<1e8")
    assert "s3cret" not in str(caught.value) and "s3cret" not in repr(zoo.connect(url))
    proc = run_cli("search", "params<1e8", "--registry", url, check=False)
    assert proc.returncode == 1 and meaning in proc.stderr and "s3cret" not in proc.stderr
    _no_traceback(proc)


def test_12_a_read_only_registry_refuses_writes_and_stays_as_it_was(writable):
    path = _path(writable)
    before = path.read_bytes()
    # root writes through file modes; an immutable file (chattr +i) is read-only to root as well
    protect, unprotect = (["chattr", "+i", path], ["chattr", "-i", path]) if os.geteuid() == 0 else (None, None)
    if protect:
        if subprocess.run(protect, capture_output=True).returncode != 0:
            pytest.skip("running as root where chattr +i is not allowed: no way to make a file read-only to root")
    else:
        path.chmod(0o444)
    try:
        proc = run_cli("rm", "timm/resnet18", "--registry", str(path), check=False)
    finally:
        if unprotect:
            subprocess.run(unprotect, check=True)
    assert proc.returncode == 1 and "read-only" in proc.stderr, proc.stderr
    _no_traceback(proc)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_12_a_registry_from_a_newer_zoo_says_so_and_is_not_touched(writable):
    path = _path(writable)
    con = sqlite3.connect(path)
    con.execute("UPDATE alembic_version SET version_num = '9999'")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(SchemaOutdated, match="made by a newer zoo"):
        zoo.connect(writable).info("timm/resnet18")
    for args in (("db", "upgrade"), ("rm", "timm/resnet18"), ("show", "timm/resnet18")):
        proc = run_cli(*args, "--registry", str(path), check=False)
        assert proc.returncode == 1 and "newer zoo" in proc.stderr, (args, proc.stderr)
        _no_traceback(proc)
    assert path.read_bytes() == before


def test_12_an_older_registry_refuses_writes_without_switching_its_journal(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    run_cli("db", "upgrade", "--revision", "0002", "--registry", url)
    con = sqlite3.connect(_path(url))
    con.execute("PRAGMA journal_mode=DELETE")  # as shipped registries are
    con.close()
    before = _path(url).read_bytes()
    proc = run_cli("index", "builder", "tests.builders:tied_net", "--name", "tied", "--registry", url, check=False)
    assert proc.returncode == 1 and "zoo db upgrade" in proc.stderr
    assert _path(url).read_bytes() == before and not Path(str(_path(url)) + "-wal").exists()


def test_12_write_commands_never_create_a_registry_only_index_and_upgrade_do(tmp_path, small_registry):
    missing = tmp_path / "missing.db"
    for args in (
        ("rm", "timm/resnet18"),
        ("weights", "add", "timm/resnet18", "w.safetensors"),
        ("db", "compact"),
        ("search", "params<1"),
    ):
        proc = run_cli(*args, "--registry", str(missing), check=False)
        assert proc.returncode == 1 and "no registry at" in proc.stderr, (args, proc.stderr)
        _no_traceback(proc)
        assert not missing.exists()
    with pytest.raises(RegistryNotFound):
        zoo.connect(str(missing)).remove("timm/resnet18")
    made = run_cli("index", "builder", "tests.builders:tied_net", "--name", "tied", "--registry", str(missing))
    assert "created a new registry at" in made.stderr and str(missing) in made.stderr
    upgraded = run_cli("db", "upgrade", "--registry", str(tmp_path / "other.db"))
    assert "created" in upgraded.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("rm", "timm/no_such_model"), "no model named"),
        (("index", "builder", "tests.builders:tied_net", "--name", "timm/resnet18"), "would replace it"),
        (("index", "checkpoint", "/no/such/file.safetensors"), "no such"),
        (("db", "upgrade", "--revision", "nosuch"), "no schema revision"),
        (("weights", "add", "user/tied", "/no/such/file.safetensors", "--tag", "constructor"), "weights tag"),
    ],
)
def test_12_a_refused_write_leaves_the_file_byte_for_byte(writable, args, message):
    path = _path(writable)
    before = path.read_bytes()
    proc = run_cli(*args, "--registry", str(path), check=False)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    _no_traceback(proc)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]


# --- 13. a writer waits for another writer's lock, then says so ---------------------------------------


def _hold_write_lock(path: Path, seconds: float) -> threading.Thread:
    started = threading.Event()

    def hold():
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("BEGIN IMMEDIATE")
        started.set()
        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    thread = threading.Thread(target=hold)
    thread.start()
    started.wait()
    return thread


@pytest.mark.slow  # waits 8 s for a lock, by design
def test_13_a_locked_registry_is_waited_for(writable):
    path = _path(writable)
    holder = _hold_write_lock(path, 8.0)
    start = time.monotonic()
    proc = run_cli("rm", "user/tied", "--registry", str(path), check=False)
    holder.join()
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start >= 7.5  # it waited for the lock (far longer than start-up) instead of failing
    assert "user/tied" not in [m.name for m in zoo.connect(writable).search()]


@pytest.mark.slow  # waits 6 s for a lock holder, by design
def test_13_a_lock_held_past_the_timeout_is_a_clear_error(writable):
    path = _path(writable)
    holder = _hold_write_lock(path, 6.0)
    try:
        proc = run_cli("rm", "user/tied", "--registry", str(path), check=False, env_extra={"ZOO_LOCK_TIMEOUT": "1"})
    finally:
        holder.join()
    assert proc.returncode == 1 and "locked by another writer" in proc.stderr and "ZOO_LOCK_TIMEOUT" in proc.stderr
    _no_traceback(proc)


# --- 14. worker processes ---------------------------------------------------------------------------


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "99999999999999999999999"])
def test_14_bad_job_counts_are_refused(small_registry, jobs):
    proc = run_cli("index", "timm", "resnet18", "-j", jobs, registry=small_registry, check=False)
    assert proc.returncode == 2 and "number of workers" in proc.stderr
    with pytest.raises(InvalidArgument):
        zoo.connect(small_registry).index("timm", ["resnet18"], jobs=0)


def test_14_more_jobs_than_cpus_use_the_cpu_count(tmp_path):
    proc = run_cli("index", "timm", "test_resnet", "-j", "999999", "-q", registry=str(tmp_path / "r.db"))
    assert f"using {os.cpu_count()} worker processes" in proc.stderr and "1 indexed" in proc.stdout


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # an indexer process and its workers: 7 s
def test_14_workers_die_with_a_killed_indexer(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZOO_REGISTRY": str(tmp_path / "r.db")}
    parent = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "index", "timm", "resnet*", "-j", "2", "-q"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(workers := _children(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers) >= 2, "the indexer started no workers"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [w for w in workers if _alive(w)]
    for w in survivors:  # never leave 0.5 GB orphans behind, even when the test fails
        os.kill(w, signal.SIGKILL)
    assert not survivors, "workers outlived their killed parent"
    run_cli("index", "timm", "resnet18", "-q", registry=str(tmp_path / "r.db"))  # the next run completes
    assert zoo.connect(str(tmp_path / "r.db")).info("timm/resnet18").status == "ok"


def _pooled_connections_and_a_read(url):
    pooled = sum(e.pool.checkedin() for e in db._engines.values())
    return pooled, zoo.connect(url).info("timm/resnet18").name


def test_14_no_forked_child_inherits_the_parents_database_connections(small_registry):
    """Any fork (an indexer's worker, a DataLoader's): the child opens its own connections and leaves the
    parent's alone, which go on working."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with db.session(small_registry) as s:  # the parent now pools a connection
        store.resolve(s, "timm/resnet18")
    assert sum(e.pool.checkedin() for e in db._engines.values()) >= 1
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        assert pool.submit(_pooled_connections_and_a_read, small_registry).result() == (0, "timm/resnet18")
    with db.session(small_registry) as s:
        assert store.resolve(s, "timm/resnet18").name == "timm/resnet18"


# --- 15. search limits and the registry option ----------------------------------------------------------


@pytest.mark.parametrize("limit", ["99999999999999999999", "-1", "2.5", "x"])
def test_15_bad_cli_limits_are_refused(small_registry, limit):
    proc = run_cli("search", "params<1e9", "--limit", limit, registry=small_registry, check=False)
    assert proc.returncode == 2 and "a limit is a whole number" in proc.stderr


@pytest.mark.parametrize(
    "options", [{"limit": 10**30}, {"limit": -1}, {"limit": 2.5}, {"limit": "3"}, {"limit": True}, {"order_by": 123}]
)
def test_15_bad_python_limits_and_orders_are_refused(zoo_at, options):
    with pytest.raises(InvalidArgument):
        zoo_at.search("params<1e9", **options)


def test_15_the_registry_flag_wins_over_the_environment(small_registry, tmp_path):
    proc = run_cli(
        "search",
        "family=user",
        "--registry",
        small_registry,
        check=False,
        env_extra={"ZOO_REGISTRY": str(tmp_path / "elsewhere.db")},
    )
    assert proc.returncode == 0 and "user/tied" in proc.stdout


# --- 16. the Python API returns every match -------------------------------------------------------------


def test_16_python_search_returns_every_match_by_default():
    import timm

    shipped = zoo.connect(str(ROOT / "registry.db"))
    # every timm architecture is recorded (its pretrained variants are rows of kind variant)
    assert len(shipped.search("family=timm and kind=architecture")) == len(timm.list_models()) > 100
    assert len(shipped.search("family=timm", limit=7)) == 7


# --- 17. user models as third-party packages write them -------------------------------------------------


def test_17_a_falsy_weights_flag_is_no_weights(zoo_at):
    assert zoo_at.get("timm/resnet18", pretrained=False).fc.out_features == 1000
    assert zoo_at.get("torchvision/resnet18", weights=None, num_classes=10).fc.out_features == 10
    with pytest.raises(InvalidRecipe, match="pretrained=True"):
        zoo_at.get("timm/resnet18", pretrained=True)


def test_17_a_constructor_that_loads_its_shipped_weights_builds_and_loads_them(tmp_path):
    shipped = {"weight": torch.randn(2, 4), "bias": torch.randn(2)}
    path = tmp_path / "shipped.pt"
    torch.save(shipped, path)
    registry = zoo.connect(str(tmp_path / "r.db"))
    record = registry.index_builder("tests.builders:shipped_weights_net", "shipped", {"path": str(path)})
    assert record["status"] == "ok", record["error"]
    (tag,) = registry.info("user/shipped").weights
    assert tag["tag"] == "constructor" and tag["path"] == str(path)
    with pytest.raises(InvalidArgument, match="'constructor' and 'pretrained' are zoo's own"):
        registry.add_weights("user/shipped", path, tag="constructor")
    m = registry.get("user/shipped")
    m.materialize(weights="constructor")
    assert torch.equal(m[2].weight, shipped["weight"]) and torch.equal(m[2].bias, shipped["bias"])
    torch.save({"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}, path)  # the shipped file changes
    with pytest.raises(CheckpointError, match="sha256"):
        registry.get("user/shipped").materialize(weights="constructor")
    # re-indexed with a constructor that loads nothing: its old "constructor" tag goes, the row stays
    assert registry.index_builder("tests.builders:shipped_weights_net", "shipped", {"path": ""})["status"] == "ok"
    assert registry.info("user/shipped").weights == []


# --- 18. a user builder in the current directory ---------------------------------------------------------


@pytest.mark.slow  # processes: 10 s
def test_18_a_builder_in_the_current_directory_needs_no_pythonpath(tmp_path):
    package = tmp_path / "mymodels"
    package.mkdir()
    (package / "__init__.py").write_text("import torch\n\ndef build(width=4):\n    return torch.nn.Linear(3, width)\n")
    # PYTHONPATH: only the zoo under test (mymodels is not there); neither the console script nor
    # `python -P` puts the current directory on the path
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ZOO_REGISTRY": str(tmp_path / "r.db"),
        "ZOO_TRUSTED_MODULES": "mymodels",
    }
    made = subprocess.run(
        [ZOO_SCRIPT, "index", "builder", "mymodels:build", "--name", "mine"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0 and "indexed user/mine" in made.stdout, made.stderr
    got = subprocess.run(
        [sys.executable, "-P", "-c", "import zoo; print(zoo.get('user/mine').out_features)"],
        cwd=tmp_path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode != 0 and "mymodels" in got.stderr  # from another directory it is not importable
    here = subprocess.run(
        [sys.executable, "-P", "-c", "import zoo; print(zoo.get('user/mine').out_features)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert here.returncode == 0 and here.stdout.strip() == "4", here.stderr


@pytest.mark.parametrize(
    "name, want",
    [("half", torch.float16), ("BF16", torch.bfloat16), ("torch.float32", torch.float32), ("double", torch.float64)],
)
def test_get_materialize_and_estimate_take_the_same_dtype_names(small_registry, name, want):
    """One parser: "half" worked in estimate only, and a bad dtype was AnalysisError there, InvalidArgument
    elsewhere."""
    at = zoo.connect(small_registry)
    assert {p.dtype for p in at.get("timm/resnet18", dtype=name).parameters()} == {want}
    assert {p.dtype for p in at.get("timm/resnet18").materialize(dtype=name).parameters()} == {want}
    assert at.estimate("timm/resnet18", dtype=name).dtype == str(want).removeprefix("torch.")


@pytest.mark.parametrize("bad", ["int8", "fp8", "float33", torch.int64, 16])
def test_a_bad_dtype_is_the_same_invalid_argument_everywhere(small_registry, bad):
    at = zoo.connect(small_registry)
    for call in (
        lambda: at.get("timm/resnet18", dtype=bad),
        lambda: at.get("timm/resnet18").materialize(dtype=bad),
        lambda: at.estimate("timm/resnet18", dtype=bad),
    ):
        with pytest.raises(InvalidArgument, match="dtype must be a floating torch dtype"):
            call()


def test_a_recorded_weights_tag_is_hashed_once_per_state_of_its_file(writable, tmp_path):
    """Each load checked a tag's file by hashing all of it again; now the hash is remembered with the file's
    state (zoo.weights.verified), and any write, even one that puts size and mtime back, is hashed anew."""
    from zoo.weights import verified

    registry = zoo.connect(writable)
    path = Path(_tied_weights(tmp_path))
    registry.add_weights("user/tied", str(path), tag="default")
    recorded = registry.info("user/tied").weights[0]["sha256"]
    assert registry.get("user/tied").materialize(weights="default") is not None
    assert verified.recall(path) == recorded  # what the next load compares, without reading the file
    data, stat = bytearray(path.read_bytes()), path.stat()
    data[-1] ^= 0xFF  # the last byte of the last tensor: same size
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert verified.recall(path) is None  # the ctime moved
    with pytest.raises(CheckpointError, match="differs from the recorded"):
        registry.get("user/tied").materialize(weights="default")
