"""Where a registry may live and who may change it: a registry read from a read-only place or by a user who
does not own it, a path that is no regular file, and the shipped registry.db, which zoo
writes only when it is named."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import zoo
from tests.conftest import ROOT, run_cli
from zoo.errors import RegistryError
from zoo.registry import db, lite, store

TIED = "tests.builders:tied_net"
EXPECTED = {"lite": ["user/tied"], "lite_info": True, "sqlalchemy": ["user/tied"], "info": True}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A registry holding user/tied, as the indexer leaves it: in WAL mode, its -wal folded in on close."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.db"
    run_cli(
        "--registry", str(path), "index", "builder", TIED, "--name", "tied", env_extra={"ZOO_TRUSTED_MODULES": "tests"}
    )
    assert _reads(path) == EXPECTED  # and every module the readers need is imported before a child drops root
    return path


def _journal(path: Path) -> str:
    """The journal mode a file's header records: bytes 18-19 are 2 for WAL, 1 for a rollback journal."""
    with open(path, "rb") as f:
        return {1: "rollback", 2: "wal"}[f.read(100)[18]]


def _rollback_journal(path: Path) -> None:
    """What `make registry` ends with: `zoo db compact` folds the WAL in and goes back to a rollback journal."""
    assert zoo.connect(str(path)).compact() == "compacted"
    db.engine(f"sqlite:///{path}").dispose()


def _reads(path: Path, name: str = "user/tied", expression: str = "params>0") -> dict:
    """Search and info through both readers: zoo.registry.lite (zoo search, zoo.info) and SQLAlchemy."""
    url = f"sqlite:///{path}"
    found = lite.search(url, expression, limit=None)
    with db.session(url) as s:
        through_sqlalchemy = [i.name for i in store.search(s, expression)]
    return {
        "lite": None if found is None else [i.name for i in found],
        "lite_info": lite.info(url, name) is not None,
        "sqlalchemy": through_sqlalchemy,
        "info": zoo.connect(str(path)).info(name).params > 0,
    }


def _reads_in_child(path: Path, uid: int | None = None, *args) -> dict:
    """_reads in a forked child, as another user when uid is given (a subprocess would need a Python that user
    can run: this one lives under /root). Every module it needs is imported here first."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(reader)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            answer = _reads(path, *args)
        except BaseException as e:  # noqa: B036 - reported to the parent, whatever it is
            answer, code = {"error": f"{type(e).__name__}: {e}"}, 1
        os.write(writer, json.dumps(answer).encode())
        os._exit(code)
    os.close(writer)
    with os.fdopen(reader) as f:
        answer = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    return answer


def _nobody() -> int:
    import pwd

    if os.geteuid() != 0:
        pytest.skip("reading as another user needs root to drop to `nobody`")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user `nobody` here")


@pytest.fixture
def shared_dir():
    """A folder anyone may read and only root may write (pytest's own temp folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="zoo-access-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _read_only_view(source: Path, target: Path) -> str:
    """`target` shows `source` read-only: a read-only bind mount as root (the real thing), else the folder
    chmod'ed 0555 (enough for a user other than root). Returns which one, for the test's record."""
    target.mkdir()
    if os.geteuid() == 0 and shutil.which("mount"):
        made = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)], capture_output=True)
        if made.returncode == 0:
            return "mount"
    target.rmdir()
    source.chmod(0o555)
    target.symlink_to(source)
    if os.geteuid() == 0:
        pytest.skip("neither a read-only bind mount nor a chmod'ed folder keeps root from writing here")
    return "chmod"


def _undo_view(kind: str, source: Path, target: Path) -> None:
    if kind == "mount":
        subprocess.run(["umount", "-l", str(target)], check=True)
        target.rmdir()
    else:
        source.chmod(0o755)
        target.unlink()


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_28_1_a_registry_in_a_read_only_place_reads_through_both_readers(tiny, shared_dir, journal):
    """A registry in WAL mode (as a team's writers leave it) or with a rollback journal (as zoo ships it), on a
    read-only bind mount (root) or in a chmod'ed folder (another user): search and info through both readers,
    and nothing appears beside the file."""
    source = shared_dir / "src"
    source.mkdir()
    shutil.copy(tiny, source / "r.db")
    if journal == "delete":
        _rollback_journal(source / "r.db")
    assert _journal(source / "r.db") == ("wal" if journal == "wal" else "rollback")
    view = shared_dir / "view"
    kind = _read_only_view(source, view)
    try:
        with pytest.raises(OSError):
            (view / "probe").write_text("")  # the place is read-only indeed
        assert _reads_in_child(view / "r.db") == EXPECTED
    finally:
        _undo_view(kind, source, view)
    assert sorted(p.name for p in source.iterdir()) == ["r.db"]


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_28_1_a_registry_another_user_owns_reads_through_both_readers(tiny, shared_dir, journal):
    """A system-wide install: root owns the folder and the file (0644); `nobody` searches it."""
    uid = _nobody()
    shutil.copy(tiny, shared_dir / "r.db")
    (shared_dir / "r.db").chmod(0o644)
    if journal == "delete":
        _rollback_journal(shared_dir / "r.db")
    assert _reads_in_child(shared_dir / "r.db", uid) == EXPECTED
    assert sorted(p.name for p in shared_dir.iterdir()) == ["r.db"]


def test_28_1_the_shipped_registry_has_a_rollback_journal_and_reads_read_only_and_as_another_user(tmp_path):
    """registry.db ships in a journal mode that needs nothing beside the file to read (`zoo db compact`, the
    last step of `make registry`, leaves it so); read through a read-only bind mount of the checkout, and as
    `nobody`."""
    shipped = ROOT / "registry.db"
    assert _journal(shipped) == "rollback", "run `zoo --registry registry.db db compact`"
    uid = _nobody()
    read = ("timm/resnet50", "name~'resnet5*' and family=timm and kind=architecture")
    expected = _reads(shipped, *read)  # as root, in place
    assert "timm/resnet50" in expected["lite"] and expected["lite"] == expected["sqlalchemy"]
    assert _reads_in_child(shipped, uid, *read) == expected
    view = tmp_path / "view"
    kind = _read_only_view(ROOT, view)
    try:
        answer = _reads_in_child(view / "registry.db", None, *read)
    finally:
        _undo_view(kind, ROOT, view)
    assert answer == expected


# --- 28.8: a path that is no regular file ------------------------------------------------------------------


@pytest.mark.parametrize("command", [["search", "params>0"], ["show", "user/tied"], ["catalog", "--out", "SITE"]])
def test_28_8_a_fifo_as_the_registry_is_refused_at_once(tmp_path, command):
    fifo = tmp_path / "registry.db"
    os.mkfifo(fifo)
    command = [str(tmp_path / "site") if a == "SITE" else a for a in command]
    proc = run_cli(
        *command, "--quiet" if command[0] == "catalog" else "--json", "--registry", str(fifo), check=False, timeout=20
    )
    assert proc.returncode == 1 and "not a regular file" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(RegistryError, match="not a regular file"):
        zoo.connect(str(fifo)).info("user/tied")
    assert not (tmp_path / "site").exists()


# --- 28.14: the shipped registry is written only when named ------------------------------------------------


@pytest.fixture
def installed(tiny, tmp_path) -> Path:
    """zoo installed elsewhere, as a wheel installs it: the package with its own registry.db (here the tiny
    one) and its migrations. Its shipped registry is this copy, so the real registry.db is never at risk."""
    site = tmp_path / "site-packages"
    shutil.copytree(
        ROOT / "zoo", site / "zoo", symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "registry.db")
    )
    shutil.copytree(ROOT / "migrations", site / "zoo" / "migrations")
    shutil.copy(tiny, site / "zoo" / "registry.db")
    _rollback_journal(site / "zoo" / "registry.db")  # as registry.db ships
    return site


def _zoo(site: Path, *args: str, env_extra=None, python: str | None = None) -> subprocess.CompletedProcess:
    """`zoo ARGS` (or `python -c PYTHON`) with that installation, no ZOO_REGISTRY unless env_extra sets it."""
    env = {k: v for k, v in os.environ.items() if k != "ZOO_REGISTRY"}
    env.update({"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "ZOO_TRUSTED_MODULES": "tests", **(env_extra or {})})
    argv = ["-c", python] if python else ["-m", "zoo.cli", *args]
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=site, timeout=600)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow  # processes of an installed copy: 8 s
def test_28_14_writes_to_the_shipped_registry_are_refused_unless_it_is_named(installed, tmp_path):
    from safetensors.torch import save_file

    from tests.builders import tied_net

    shipped = installed / "zoo" / "registry.db"
    before = _digest(shipped)
    weights = tmp_path / "tied.safetensors"
    save_file({k: v for k, v in tied_net().state_dict().items() if k != "head.weight"}, str(weights))  # tied: once
    writes = [
        ["weights", "add", "user/tied", str(weights)],
        ["index", "builder", TIED, "--name", "other"],
        ["rm", "user/tied"],
        ["db", "upgrade"],
        ["db", "compact"],
    ]
    for args in writes:
        proc = _zoo(installed, *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert "shipped registry" in proc.stderr and "--registry" in proc.stderr and "ZOO_REGISTRY" in proc.stderr
        assert "Traceback" not in proc.stderr
    api = _zoo(
        installed,
        python="import zoo\ntry:\n    zoo.connect().remove('user/tied')\nexcept zoo.RegistryError as e:\n    print(e)",
    )
    assert api.returncode == 0 and "shipped registry" in api.stdout, api.stderr
    read = _zoo(installed, "search", "params>0", "--json")  # reading it is as before
    assert read.returncode == 0 and "user/tied" in read.stdout
    assert _digest(shipped) == before and sorted(p.name for p in shipped.parent.glob("registry.db*")) == ["registry.db"]
    # named, it is written: --registry, or ZOO_REGISTRY
    assert _zoo(installed, "--registry", str(shipped), "weights", "add", "user/tied", str(weights)).returncode == 0
    assert _digest(shipped) != before
    assert _zoo(installed, "rm", "user/tied", env_extra={"ZOO_REGISTRY": str(shipped)}).returncode == 0
    # the way the refusal names: a user registry, a copy of the shipped one
    mine = tmp_path / "mine.db"
    assert _zoo(installed, "db", "copy", str(shipped), str(mine)).returncode == 0
    assert (
        _zoo(installed, "index", "builder", TIED, "--name", "other", env_extra={"ZOO_REGISTRY": str(mine)}).returncode
        == 0
    )


def test_28_14_a_copy_onto_the_shipped_registry_is_refused_unless_it_is_named(installed, tmp_path):
    shipped = installed / "zoo" / "registry.db"
    mine = tmp_path / "mine.db"
    assert _zoo(installed, "db", "copy", str(shipped), str(mine)).returncode == 0
    before = _digest(shipped)
    api = _zoo(
        installed,
        python=f"import zoo\ntry:\n    zoo.connect({str(mine)!r}).copy_to(None, replace=True)\n"
        f"except zoo.RegistryError as e:\n    print(e)",
    )
    assert api.returncode == 0 and "shipped registry" in api.stdout, (api.stdout, api.stderr)
    assert _digest(shipped) == before
    named = _zoo(installed, python=f"import zoo\nzoo.connect({str(mine)!r}).copy_to({str(shipped)!r}, replace=True)")
    assert named.returncode == 0, named.stderr
