"""The indexer and the CLI: idempotent, crash-safe, concurrent, failures recorded; checkpoints and builders.
The tests taking backend_url run on SQLite and PostgreSQL; tests/test_concurrency.py kills and races
indexers on both."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import ROOT, cli_json, run_cli
from zoo.indexing import indexer


def _rows(url: str) -> list[tuple]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
        return con.execute("SELECT name, status FROM models ORDER BY name").fetchall()


def _count_so_far(url: str) -> int:
    try:
        return len(_rows(url))
    except sqlite3.OperationalError:  # the indexer has not created the schema yet
        return 0


def _consistent(url: str) -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        orphans = con.execute(
            "SELECT count(*) FROM models m LEFT JOIN model_tensors t ON t.model_id = m.id "
            "WHERE m.status = 'ok' AND t.model_id IS NULL"
        ).fetchone()[0]
        assert orphans == 0  # no model without its tensors: each one is written in one transaction
        names = [r[0] for r in con.execute("SELECT name FROM models")]
        assert len(names) == len(set(names))


def test_index_is_idempotent(backend_url):
    fresh_url = backend_url
    first = indexer.index_family(fresh_url, "timm", ["resnet1*"])
    assert first.indexed and not first.unchanged and not first.failed
    second = indexer.index_family(fresh_url, "timm", ["resnet1*"])
    assert second.indexed == [] and sorted(second.unchanged) == sorted(first.indexed)
    forced = indexer.index_family(fresh_url, "timm", ["resnet18"], force=True)
    assert forced.indexed == ["timm/resnet18"]


def test_workers_leave_the_callers_garbage_collector_as_it_was(tmp_path):
    """An index run with workers freezes the libraries' objects out of garbage collection while it runs
    (zoo.indexing.indexer) and gives them back after: the caller's process collects as before."""
    import gc

    outcome = indexer.index_family(f"sqlite:///{tmp_path}/r.db", "timm", ["resnet1*"], jobs=2)
    assert outcome.indexed and not outcome.failed
    assert gc.get_freeze_count() == 0


def test_a_failing_build_is_recorded_not_raised(backend_url):
    fresh_url = backend_url
    from zoo.recipe import Recipe

    record = indexer.index_one(fresh_url, "user/broken", Recipe("user", "tests.builders:broken"), trusted={"tests"})
    assert record["status"] == "error" and "this builder always fails" in record["error"]
    proc = run_cli("show", "user/broken", "--json", registry=fresh_url)
    assert '"status": "error"' in proc.stdout
    import zoo

    with pytest.raises(zoo.BuildFailed, match="always fails"):
        zoo.connect(fresh_url).get("user/broken")


@pytest.mark.slow  # indexes every vit_*: 25 s and more
def test_killed_indexer_leaves_a_consistent_database_and_a_rerun_completes(fresh_url):
    cmd = [sys.executable, "-m", "zoo.cli", "--registry", fresh_url, "index", "timm", "vit_*", "-j", "2", "-q"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and _count_so_far(fresh_url) < 5:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the indexer and its workers, mid-run, without cleanup
    proc.wait()
    partial = _rows(fresh_url)
    assert 5 <= len(partial)
    _consistent(fresh_url)
    summary = cli_json("index", "timm", "vit_*", "-j", "2", registry=fresh_url)
    import timm

    everything = timm.list_models("vit_*")
    assert summary["unchanged"] >= len(partial) - 2  # those in flight at the kill may be redone
    assert summary["indexed"] + summary["unchanged"] + len(summary["failed"]) == len(everything)
    assert [r[0] for r in _rows(fresh_url)] == sorted(f"timm/{n}" for n in everything)
    _consistent(fresh_url)


@pytest.mark.slow  # two indexer processes: 25 s and more
def test_two_indexers_at_once_lose_and_duplicate_nothing(fresh_url):
    from zoo.registry import db

    db.upgrade(fresh_url)  # both then open an existing registry
    cmd = [sys.executable, "-m", "zoo.cli", "--registry", fresh_url, "index", "timm", "-q", "--json"]
    a = subprocess.Popen(cmd + ["resnet*", "--force"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    b = subprocess.Popen(
        cmd + ["resnet1*", "resnet2*", "efficientnet_b*", "--force"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    for p in (a, b):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()
    import timm

    expected = sorted({f"timm/{n}" for n in timm.list_models(["resnet*", "efficientnet_b*"])})
    assert [r[0] for r in _rows(fresh_url)] == expected
    _consistent(fresh_url)


def test_cli_indexes_a_safetensors_checkpoint_from_its_header(tmp_path, backend_url):
    fresh_url = backend_url
    path = tmp_path / "net.safetensors"
    save_file({"w": torch.zeros(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}, str(path))
    cli_json("index", "checkpoint", str(path), "--name", "ckpt/net", registry=fresh_url)
    info = cli_json("show", "ckpt/net", "--tensors", registry=fresh_url)
    assert info["params"] == 16 and info["bytes"] == 48 + 8 and info["family"] == "checkpoint"
    shapes = {t["name"]: (t["shape"], t["dtype"]) for t in info["tensor_table"]}
    assert shapes == {"w": ([3, 4], "float32"), "b": ([4], "bfloat16")}
    proc = run_cli("index", "checkpoint", str(tmp_path / "missing.safetensors"), registry=fresh_url, check=False)
    assert proc.returncode != 0


def test_cli_indexes_a_torch_pickle_on_meta_and_refuses_code(tmp_path, fresh_url):
    good = tmp_path / "net.pt"
    torch.save({"state_dict": {"fc.weight": torch.zeros(2, 5), "fc.bias": torch.zeros(2)}}, good)
    cli_json("index", "checkpoint", str(good), registry=fresh_url)
    info = cli_json("show", "checkpoint/net", "--tensors", registry=fresh_url)
    assert {t["name"] for t in info["tensor_table"]} == {"fc.weight", "fc.bias"}  # as materialize loads them

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "x": Evil()}, evil)
    proc = run_cli("index", "checkpoint", str(evil), registry=fresh_url, check=False)
    assert proc.returncode == 1 and "weights-only" in proc.stderr
    assert not marker.exists()


def test_cli_builder_search_show_rm(backend_url):
    fresh_url = backend_url
    out = cli_json(
        "index", "builder", "tests.builders:tied_net", "--name", "tied", "--kwargs", '{"dim": 4}', registry=fresh_url
    )
    assert out["name"] == "user/tied" and out["status"] == "ok"
    rows = cli_json("search", "family=user", "--sort", "-params", registry=fresh_url)
    assert [r["name"] for r in rows] == ["user/tied"] and rows[0]["kwargs"] == {"dim": 4}
    text = run_cli("show", "user/tied", "--tensors", registry=fresh_url).stdout
    assert "tied to embed.weight" in text and "non-persistent" in text
    bad = run_cli("search", "params<<3", registry=fresh_url, check=False)
    assert bad.returncode == 1 and "column" in bad.stderr
    assert run_cli("rm", "user/tied", registry=fresh_url).stdout.strip() == "removed user/tied"
    missing = run_cli("show", "user/tied", registry=fresh_url, check=False)
    assert missing.returncode == 1 and "no model named" in missing.stderr


def test_index_json_gives_each_built_models_seconds_per_stage(fresh_url):
    summary = cli_json("index", "timm", "resnet10t", "resnet14t", registry=fresh_url)
    assert set(summary["timings"]) == {"timm/resnet10t", "timm/resnet14t"}
    for stages in summary["timings"].values():
        assert set(stages) == {"build_s", "build_reused", "analysis_s", "save_s", "analysis_reused"}
        assert stages["analysis_reused"] is False  # two different models: each analysed
        assert all(stages[k] > 0 for k in ("build_s", "analysis_s", "save_s"))
    again = cli_json("index", "timm", "resnet10t", registry=fresh_url)  # unchanged: nothing built, no timings
    assert again["unchanged"] == 1 and "timings" not in again
