"""zoo db copy between SQLite and PostgreSQL, zoo db compact on each, length limits, and passwords masked."""

import resource
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, select

import zoo
from tests.conftest import ROOT, run_cli
from tests.pg import PASSWORD
from zoo.errors import InvalidArgument, RegistryError
from zoo.registry import db
from zoo.registry.transfer import TABLES


def _dump(url: str) -> dict[str, list[tuple]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        dump = {t.name: [tuple(r) for r in conn.execute(select(t).order_by(*t.primary_key.columns))] for t in TABLES}
    engine.dispose()
    return dump


@pytest.fixture
def with_weights(small_registry, tmp_path) -> str:
    """A SQLite copy of the small registry with a weights tag, made through zoo db copy itself."""
    import torch
    from safetensors.torch import save_file

    url = f"sqlite:///{tmp_path / 'source.db'}"
    zoo.connect(small_registry).copy_to(url)
    module = zoo.connect(url).get("user/tied")
    path = tmp_path / "tied.safetensors"
    save_file(
        {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in module.state_dict().items() if k != "head.weight"},
        str(path),
    )
    zoo.connect(url).add_weights("user/tied", path, tag="v1")
    return url


def test_sqlite_to_postgresql_to_sqlite_is_equal_row_for_row(with_weights, pg_server, tmp_path):
    pg = pg_server.fresh()
    back = f"sqlite:///{tmp_path / 'back.db'}"
    counts = zoo.connect(with_weights).copy_to(pg)
    assert counts == {"models": 8, "model_tensors": 8, "weights": 1, "measurements": 0}  # runs: test_bench_cmd.py
    zoo.connect(pg).copy_to(back)
    source = _dump(with_weights)
    assert source["weights"] and _dump(pg) == source and _dump(back) == source
    assert zoo.connect(pg).search("params<1e7", order_by="-params") == zoo.connect(with_weights).search(
        "params<1e7", order_by="-params"
    )


def test_an_insert_after_the_copy_gets_a_new_id(with_weights, pg_server, tmp_path):
    pg = pg_server.fresh()
    zoo.connect(with_weights).copy_to(pg)
    registry = zoo.connect(pg)
    registry.index_builder("tests.builders:tied_net", "another", {"dim": 4})  # the sequence is past the copied ids
    registry.add_weights("user/tied", registry.weights_path("user/tied", "v1"), tag="v2")
    assert {i.name for i in registry.search("family=user")} == {"user/another", "user/tied"}
    assert [w["tag"] for w in registry.info("user/tied").weights] == ["v1", "v2"]


def test_a_target_with_models_is_refused_without_replace(with_weights, pg_server):
    pg = pg_server.fresh()
    zoo.connect(with_weights).copy_to(pg)
    zoo.connect(pg).remove("timm/resnet18")
    with pytest.raises(RegistryError, match="already holds 7 models.*--replace") as err:
        zoo.connect(with_weights).copy_to(pg)
    assert PASSWORD not in str(err.value) and "***" in str(err.value)
    proc = run_cli("db", "copy", with_weights, pg, check=False)
    assert proc.returncode == 1 and "--replace" in proc.stderr and "Traceback" not in proc.stderr
    assert PASSWORD not in proc.stderr
    proc = run_cli("db", "copy", with_weights, pg, "--replace")
    assert "copied 8 models, 8 tensor tables and 1 weights tags" in proc.stdout and PASSWORD not in proc.stdout
    assert _dump(pg) == _dump(with_weights)


def test_compact_does_what_fits_the_backend(with_weights, pg_server):
    pg = pg_server.fresh()
    zoo.connect(with_weights).copy_to(pg)
    assert run_cli("db", "compact", "--registry", pg).stdout.strip().endswith("vacuumed and analysed")
    zoo.cache_clear()  # leaving WAL needs the SQLite file to itself: this process's engines are disposed
    assert run_cli("db", "compact", "--registry", with_weights).stdout.strip().endswith("compacted")


def test_passwords_are_masked_in_reprs_messages_and_output(pg_server):
    pg = pg_server.fresh()
    assert PASSWORD not in repr(zoo.connect(pg)) and PASSWORD not in str(zoo.connect(pg))
    out = run_cli("db", "upgrade", "--registry", pg).stdout
    assert "schema at" in out and PASSWORD not in out and "***" in out
    unreachable = pg.replace(f":{pg_server.port}/", ":1/")
    with pytest.raises(RegistryError, match="cannot be reached") as err:
        zoo.connect(unreachable).search("params<1")
    assert PASSWORD not in str(err.value)
    proc = run_cli("db", "copy", pg, unreachable, check=False)
    assert proc.returncode == 1 and PASSWORD not in proc.stderr and "Traceback" not in proc.stderr


def test_too_long_a_value_is_a_typed_error_naming_the_field_on_postgresql(pg_server, tmp_path):
    import torch
    from safetensors.torch import save_file

    pg = pg_server.fresh()
    path = tmp_path / ("x" * 240 + ".safetensors")  # an absolute path longer than the builder column's 255
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(InvalidArgument, match="builder is .* at most 255"):
        zoo.connect(pg).index_checkpoint(path, name="ckpt/long")
    assert zoo.connect(pg).search("params>=0") == []
    assert zoo.connect(f"sqlite:///{tmp_path / 'r.db'}").index_checkpoint(path, name="ckpt/long")["status"] == "ok"


def test_a_held_lock_times_out_with_a_registry_error_and_idle_sessions_end(pg_server, monkeypatch):
    """A writer waits ZOO_LOCK_TIMEOUT for a lock another session holds, then gets a RegistryError; the
    server ends a session left idle inside a transaction (a dead client's) after db.IDLE_IN_TRANSACTION_S."""
    import time

    import psycopg

    monkeypatch.setenv("ZOO_LOCK_TIMEOUT", "1")
    url = pg_server.fresh()
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (db._SCHEMA_LOCK,))  # held until it ends
        start = time.monotonic()
        with pytest.raises(RegistryError, match="locked by another writer") as err:
            db.upgrade(url)
        assert time.monotonic() - start < 20 and PASSWORD not in str(err.value)
    db.upgrade(url)  # and once it has gone, it goes through
    with db.engine(url).connect() as conn:
        assert (
            conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
            == f"{db.IDLE_IN_TRANSACTION_S // 60}min"
        )


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs: a disk that fills up (mounting needs root; skipped elsewhere)."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # Python ignores SIGXFSZ: writes fail with EFBIG


@pytest.mark.parametrize("full", ["full disk", "file size limit"])
def test_a_copy_that_cannot_be_written_blames_the_target(tmp_path, request, full):
    # the shipped registry (18 MB): the target's schema fits in 1 MiB, its rows do not
    source = str(ROOT / "registry.db")
    folder = request.getfixturevalue("small_tmpfs") if full == "full disk" else tmp_path
    target = folder / "target.db"
    if full == "full disk":
        proc = run_cli("db", "copy", source, str(target), check=False)
    else:  # a limit of its own process
        proc = subprocess.run(
            [sys.executable, "-m", "zoo.cli", "db", "copy", source, str(target)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
            preexec_fn=_limit_file_size,
        )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert str(target) in proc.stderr and source not in proc.stderr, proc.stderr
    if full == "full disk":
        assert "full" in proc.stderr, proc.stderr
