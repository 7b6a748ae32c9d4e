"""`zoo bench` against models that fail when run and batches no machine holds: a search run records each
failure and measures the models after it; a single model's failure is zoo's typed error (BenchFailed, or
InvalidArgument for a batch whose inputs cannot fit), never a traceback. Real timm, torchvision and user models
(tests/bench_builders.py: forwards that raise AssertionError, IndexError, KeyError, or allocate 1 PiB)."""

import json
import sqlite3

import pytest

import zoo
from tests.conftest import index_conv, sqlite_copy
from zoo.cli import main
from zoo.registry import db
from zoo.throughput import benchmark

FAILURES = {
    "user/broken_assert": "AssertionError",
    "user/broken_index": "IndexError",
    "user/broken_key": "KeyError",
    "user/broken_memory": "ran out of memory",
}
WORKING = ["timm/resnet18", "torchvision/mobilenet_v3_small", "user/conv"]  # user/conv sorts after the broken ones


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> str:
    from zoo.indexing import indexer
    from zoo.recipe import Recipe

    url = f"sqlite:///{tmp_path_factory.mktemp('bench_robust') / 'r.db'}"
    indexer.index_family(url, "timm", ["resnet18"])
    indexer.index_family(url, "torchvision", ["mobilenet_v3_small"])
    for name in FAILURES:
        indexer.index_one(
            url,
            name,
            Recipe("user", "tests.bench_builders:failing", {"failure": name.split("_")[-1]}),
            trusted={"tests"},
            inputs=[{"shape": [1, 4]}],
        )
    index_conv(url)
    db.compact(url)  # one self-contained file, as a test's copy starts
    return url


@pytest.fixture
def registry(indexed, tmp_path) -> str:
    path = tmp_path / "r.db"
    sqlite_copy(indexed, path)
    return str(path)


def _measured(path: str) -> list[str]:
    with sqlite3.connect(path) as con:
        return [
            n
            for (n,) in con.execute(
                "SELECT models.name FROM measurements JOIN models ON models.id = model_id ORDER BY models.name"
            )
        ]


@pytest.mark.slow  # real benches: 8 s
def test_a_search_run_records_each_failure_and_measures_the_models_after_it(registry, capsys):
    rc = main(["bench", "name~*", "--steps", "1", "--warmup", "0", "-q", "--json", "--registry", registry])
    out, err = capsys.readouterr()
    results = {r["name"]: r for r in json.loads(out)}
    assert rc == 1  # some failed
    assert sorted(results) == sorted([*FAILURES, *WORKING])
    for name, what in FAILURES.items():
        assert what in results[name]["error"], results[name]
        assert f"zoo: {name}: " in err
    for name in WORKING:  # measured, the one after the failures too
        assert "error" not in results[name] and results[name]["samples_per_s"] > 0, results[name]
    assert _measured(registry) == sorted(WORKING)
    assert "Traceback" not in err
    # the Python API says the same, and a rerun skips what was measured and reports the failures again
    again = benchmark.run_search(zoo.connect(registry), "name~*", steps=1, warmup=0)
    assert {r["name"] for r in again if r.get("skipped")} == set(WORKING)
    assert {r["name"] for r in again if "error" in r} == set(FAILURES)


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_one_models_failure_is_a_typed_error_that_names_it(registry, capsys, name):
    with pytest.raises(zoo.BenchFailed, match=FAILURES[name]) as raised:
        zoo.bench(name, registry=zoo.connect(registry), steps=1, warmup=0)
    assert name in str(raised.value) and isinstance(raised.value, RuntimeError)
    assert main(["bench", name, "--steps", "1", "--warmup", "0", "--registry", registry]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zoo: error: ") and FAILURES[name] in err and "Traceback" not in err
    assert _measured(registry) == []


def test_a_batch_whose_inputs_no_memory_holds_is_refused_before_anything_is_allocated(registry, capsys):
    # resnet18's inputs at batch 1,000,000 take 560 GiB (3x224x224 fp32 each): refused with the size, before
    # torch tries to allocate them (DefaultCPUAllocator's traceback)
    assert main(["bench", "timm/resnet18", "--batch", "1000000", "--registry", registry]) == 1
    err = capsys.readouterr().err
    # the CLI says its flag; the API its argument (a Python caller has no --batch)
    assert "zoo: error: --batch 1000000" in err and "GiB" in err and "smaller batch" in err, err
    with pytest.raises(zoo.InvalidArgument, match="^batch 1000000: .* smaller batch") as caught:
        zoo.bench("timm/resnet18", registry=zoo.connect(registry), batch=1_000_000)
    assert caught.value.argument == "batch" and "--" not in str(caught.value)
    [result] = benchmark.run_search(zoo.connect(registry), "name=timm/resnet18", batch=1_000_000)
    assert "smaller batch" in result["error"]
    assert _measured(registry) == []
