"""Writers that cannot collide, on SQLite and PostgreSQL: overlapping indexers started together on an empty
database, one of them killed with SIGKILL mid-run; then a run that must complete."""

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, func, select

from tests.conftest import ROOT
from zoo.registry.tables import Model, ModelTensors

# Overlapping patterns of small timm models (resnet18*, resnet2*, resnet10*: 14 models in all).
PATTERNS = [["resnet2*", "resnet18*"], ["resnet18*", "resnet10*"], ["resnet10*", "resnet2*"]]


def _names(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.scalars(select(Model.name)))
    except Exception:  # the schema is not there yet
        return []
    finally:
        engine.dispose()


def _check_consistent(url: str) -> list[str]:
    """No duplicate, no model that built without its tensor table; the names, sorted."""
    engine = create_engine(url)
    with engine.connect() as conn:
        names = list(conn.scalars(select(Model.name)))
        orphans = conn.scalar(
            select(func.count())
            .select_from(Model)
            .outerjoin(ModelTensors, ModelTensors.model_id == Model.id)
            .where(Model.status == "ok", ModelTensors.model_id.is_(None))
        )
    engine.dispose()
    assert len(names) == len(set(names)), "duplicate rows"
    assert orphans == 0, "a model without its tensors"
    return sorted(names)


def _indexer(url: str, patterns: list[str], *options: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "zoo.cli", "--registry", url, "index", "timm", *patterns, "-q", "--json", *options]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow  # indexer processes, one killed: a minute
def test_overlapping_indexers_and_a_killed_one(backend_url):
    import timm

    url = backend_url
    # the victim indexes with forked workers; SIGKILL its main process only: the workers must go with it
    # (PR_SET_PDEATHSIG) and leave no inherited connection behind holding a transaction or a lock
    victim = _indexer(url, ["resnet3*"], "-j", "2")
    writers = [_indexer(url, p, "--force", *(("-j", "2") if i == 0 else ())) for i, p in enumerate(PATTERNS)]
    deadline = time.time() + 300
    while time.time() < deadline and not any(n.startswith("timm/resnet3") for n in _names(url)):
        time.sleep(0.1)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    for w in writers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err
        assert '"failed": {}' in out, out
    expected = {f"timm/{n}" for n in timm.list_models([p for ps in PATTERNS for p in ps])}
    names = _check_consistent(url)
    assert expected <= set(names)
    assert set(names) - expected <= {f"timm/{n}" for n in timm.list_models("resnet3*")}
    # the next run completes: nothing the killed indexer held blocks it
    rerun = _indexer(url, ["resnet3*", "resnet2*"])
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    everything = expected | {f"timm/{n}" for n in timm.list_models("resnet3*")}
    assert _check_consistent(url) == sorted(everything)


@pytest.mark.slow  # reader and writer processes: 17 s
def test_readers_never_see_a_half_written_model(backend_url, tmp_path):
    """Readers (search, info with its tensor table, get) in their own processes while a writer re-indexes a
    model over and over with another size each time: no reader errs, none sees a row with another version's
    tensor table. bench/readers_writer.py times the same with 16 readers."""
    import json

    import zoo

    zoo.connect(backend_url).index_builder("tests.builders:tied_net", "flip", {"dim": 8})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def start(*args):
        return subprocess.Popen(
            [sys.executable, "-m", "tests.readers", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    done = str(tmp_path / "done")
    readers = [start("reader", backend_url, done, *(["get"] if i == 0 else [])) for i in range(3)]
    writer = start("writer", backend_url, "6", done)
    results = []
    for p in [writer, *readers]:  # the writer first: the readers stop when it is done
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert results[0]["writes"] == 6
    for r in results[1:]:
        assert r["error_count"] == 0, r["errors"]
        assert r["torn_count"] == 0, r["torn"]
        assert all(n > 0 for n in r["calls"].values())
