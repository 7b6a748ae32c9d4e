"""Zoo.search(fields=...) takes every field the search takes: a column, a measured field (bench_cpu: the model's
best recorded run, as the search compares it) and a predicted one (pred_*: zoo.throughput.roofline, as `zoo show` prints
it); anything else for `fields` is zoo's InvalidArgument naming the argument. On both backends and both read paths."""

import pytest

import zoo
from tests.conftest import sqlite_copy
from zoo.throughput import benchmark
from zoo.throughput.roofline import PREDICTED, predicted

PRED = next(iter(PREDICTED))


@pytest.fixture
def template(conv_and_tied) -> str:
    """user/conv (with its input spec) and user/tied, compacted: tests/conftest.py's session registry, read-only."""
    return conv_and_tied


@pytest.fixture
def registry(template, backend_url) -> str:
    """The template's models on each backend, user/conv measured once (a real run)."""
    if backend_url.startswith("sqlite"):
        sqlite_copy(template, backend_url.removeprefix("sqlite:///"))
    else:
        zoo.connect(template).copy_to(backend_url)
    zoo.bench("user/conv", registry=zoo.connect(backend_url), steps=1, warmup=0)
    return backend_url


def test_measured_and_predicted_fields_are_fields(registry):
    z = zoo.connect(registry)
    [run] = benchmark.recorded_runs(z, "user/conv")
    conv, tied = z.info("user/conv"), z.info("user/tied")
    found = z.search("params<1e9", fields=("name", "bench_cpu", PRED, "params"))
    assert found == [
        {"name": "user/conv", "bench_cpu": run["samples_per_s"], PRED: predicted(conv, PRED), "params": conv.params},
        {"name": "user/tied", "bench_cpu": None, PRED: None, "params": tied.params},
    ]  # tied: no flops, no run
    assert found[0][PRED] > 0
    # just the fields asked for, in their order, without name; with a sort and a limit
    assert z.search("bench_cpu>0", fields=[PRED, "bench_train_cpu"]) == [
        {PRED: predicted(conv, PRED), "bench_train_cpu": None}
    ]
    assert z.search(None, order_by="-bench_cpu", limit=1, fields=("bench_cpu",)) == [
        {"bench_cpu": run["samples_per_s"]}
    ]
    assert z.search("name~user/*", order_by=f"-{PRED}", fields=(n for n in ("name",))) == [
        {"name": "user/conv"},
        {"name": "user/tied"},
    ]


def test_the_module_level_search_takes_them_too(registry, monkeypatch):
    monkeypatch.setenv("ZOO_REGISTRY", registry)
    [run] = benchmark.recorded_runs(zoo.connect(registry), "user/conv")
    assert zoo.search("bench_cpu>0", fields=("name", "bench_cpu")) == [
        {"name": "user/conv", "bench_cpu": run["samples_per_s"]}
    ]


@pytest.mark.parametrize("fields", [5, "name", b"name", ("name", 3), [["name"]], object()])
def test_fields_that_are_not_names_are_an_invalid_argument(template, monkeypatch, fields):
    monkeypatch.setenv("ZOO_REGISTRY", template.removeprefix("sqlite:///"))
    for search in (zoo.connect(template).search, zoo.search):
        with pytest.raises(zoo.InvalidArgument, match=r"^fields is a tuple of field names"):
            search("params<1e9", fields=fields)


def test_an_unknown_field_names_the_fields_there_are(template):
    with pytest.raises(zoo.InvalidArgument, match=r"unknown fields \['bench_gpu'\].* bench_cpu.*pred_"):
        zoo.connect(template).search("params<1e9", fields=("name", "bench_gpu"))
