"""`zoo bench`: a model measured here at its row's own input size, recorded with its hardware, mode and versions,
searchable by both search paths (bench_cpu, ...), listed by `zoo show`; a search resumes after a stop; bad input
is a typed error and records nothing. Real timm models at a few steps: nothing here is timed."""

import os
import sqlite3

import pytest
import timm
import torch

import zoo
from tests.conftest import cli_json, index_conv, run_cli, sqlite_copy
from zoo.registry import db, store
from zoo.throughput import benchmark

FEW = dict(steps=2, warmup=1)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> str:
    from zoo.indexing import indexer

    url = f"sqlite:///{tmp_path_factory.mktemp('bench') / 'bench.db'}"
    indexer.index_family(url, "timm", ["resnet18", "vit_tiny_patch16_224", "vit_tiny_patch16_384"])
    index_conv(url)
    db.compact(url)  # one self-contained file (no WAL beside it), as a test's copy starts
    return url


@pytest.fixture
def registry(indexed, tmp_path) -> str:
    """A writable copy of the indexed registry per test."""
    return sqlite_copy(indexed, tmp_path / "r.db")


def _runs(url: str) -> list[tuple]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
        return con.execute(
            "SELECT models.name, mode FROM measurements JOIN models ON models.id = model_id ORDER BY measurements.id"
        ).fetchall()


def _cpu_model_name() -> str:
    with open("/proc/cpuinfo") as f:
        return next(" ".join(line.split(":", 1)[1].split()) for line in f if line.startswith("model name"))


def test_a_bench_is_recorded_at_the_rows_input_size_with_its_hardware_and_versions(registry):
    threads = torch.get_num_threads()  # torch's default, as a fresh process has it
    # a process of its own: its peak RSS is the run's (in a long-lived process the allocator reuses pages that are
    # resident already, and the high-water mark does not move)
    (result,) = cli_json(
        "bench",
        "timm/vit_tiny_patch16_384",
        "--batch",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        registry=registry,
        process=True,
    )
    # independent sources: timm's pretrained config, the kernel's CPU name, the installed libraries
    assert result["inputs"] == [
        {"name": None, "shape": [2, *timm.get_pretrained_cfg("vit_tiny_patch16_384").input_size], "dtype": "float32"}
    ]
    assert (result["hardware"], result["device"], result["mode"], result["dtype"]) == (
        _cpu_model_name(),
        "cpu",
        "infer",
        "fp32",
    )
    assert result["versions"]["torch"] == torch.__version__ and result["versions"]["timm"] == timm.__version__
    assert result["threads"] == threads == torch.get_num_threads()  # the CLI runs at torch's default and leaves it
    params = sum(p.numel() for p in timm.create_model("vit_tiny_patch16_384").parameters())
    assert result["peak_bytes"] >= 4 * params  # the fp32 weights were allocated during the run
    # the timed loop's wall time holds every step's time: samples/s is at most batch / mean step time
    assert 0 < result["samples_per_s"] <= 2 * 1000 / result["step_ms"] * 1.0001
    assert _runs(registry) == [("timm/vit_tiny_patch16_384", "infer")]
    # searchable through sqlite3 (the CLI's path) and SQLAlchemy alike; the number is the recorded one
    speed = result["samples_per_s"]
    for search, expected in (
        (f"bench_cpu>{speed / 2}", 1),
        (f"bench_cpu>={speed} and name~*384", 1),
        (f"not bench_cpu<{speed}", 4),
    ):  # `not`: also every model without a run
        names = [r["name"] for r in cli_json("search", search, registry=registry)]
        with db.session(registry) as s:
            assert [r["name"] for r in store.search(s, search, fields=("name",))] == names
        assert "timm/vit_tiny_patch16_384" in names and len(names) == expected
    for search in (f"bench_cpu>{speed * 2}", "bench_cuda>0", "bench_train_cpu>0"):
        with db.session(registry) as s:
            assert cli_json("search", search, registry=registry) == [] == store.search(s, search)
    assert "timm/resnet18" in [r["name"] for r in cli_json("search", "not bench_cpu>0", registry=registry)]
    header, row = run_cli("search", "bench_cpu>0", registry=registry).stdout.splitlines()
    assert header.split()[-1] == "bench_cpu" and row.split()[-1] == f"{speed:.2f}"  # the table shows the number
    shown = run_cli("show", "timm/vit_tiny_patch16_384", registry=registry).stdout
    assert _cpu_model_name() in shown and "cpu infer fp32 batch 2" in shown and f"torch {torch.__version__}" in shown
    (run,) = cli_json("show", "timm/vit_tiny_patch16_384", registry=registry)["measurements"]
    assert run["samples_per_s"] == speed and run["who"] == benchmark.who() and run["versions"] == result["versions"]


def test_a_training_step_is_recorded_as_train_and_searched_apart_from_inference(registry):
    result = zoo.bench("timm/resnet18", registry=zoo.connect(registry), batch=2, train=True, **FEW)
    assert result["mode"] == "train" and result["inputs"][0]["shape"] == [2, 3, 224, 224]
    with db.session(registry) as s:
        assert [r["name"] for r in store.search(s, "bench_train_cpu>0", fields=("name",))] == ["timm/resnet18"]
        assert store.search(s, "bench_cpu>0") == []
    assert [r["name"] for r in zoo.connect(registry).search("bench_train_cpu>0", fields=("name",))] == ["timm/resnet18"]


def test_a_search_bench_resumes_after_a_stop_and_skips_what_it_measured(registry):
    z = zoo.connect(registry)
    search = "name~timm/resnet18 or name~timm/vit_tiny_patch16_224 or name=user/conv"
    expected = [r["name"] for r in z.search(search, fields=("name",))]
    assert len(expected) == 3

    def stop_after_two(name, done, total, result):
        if done == 2:
            raise KeyboardInterrupt  # a Ctrl-C (or a crash) after the second model was recorded

    with pytest.raises(KeyboardInterrupt):
        benchmark.run_search(z, search, report=stop_after_two, **FEW)
    assert _runs(registry) == [(n, "infer") for n in expected[:2]]
    again = benchmark.run_search(z, search, **FEW)
    assert [(r["name"], r["skipped"]) for r in again] == [
        (expected[0], True),
        (expected[1], True),
        (expected[2], False),
    ]
    assert _runs(registry) == [(n, "infer") for n in expected]
    # another mode is another measurement: nothing is skipped
    assert not any(r["skipped"] for r in benchmark.run_search(z, "name=user/conv", batch=3, **FEW))
    # the CLI: a search with a progress bar, everything measured before is skipped
    proc = run_cli("bench", search, "--steps", "2", "--warmup", "1", registry=registry)
    assert proc.stdout.count("skipped (measured before)") == 3, proc.stdout


def test_a_dtype_is_one_kind_of_run_whatever_its_spelling(registry):
    """zoo.dtypes' names: "half" and "float16" are one dtype, recorded as fp16, so a search bench skips it."""
    z = zoo.connect(registry)
    first = zoo.bench("timm/resnet18", registry=z, dtype="half", **FEW)
    assert (first["dtype"], first["skipped"]) == ("fp16", False)
    from zoo.throughput.benchmark import run_search

    [again] = run_search(z, "name=timm/resnet18", dtype="torch.float16", **FEW)
    assert again["skipped"], again


def test_bad_input_is_a_typed_error_and_records_nothing(registry, indexed):
    z = zoo.connect(registry)
    with pytest.raises(zoo.ModelNotFound, match="resnet18"):
        zoo.bench("timm/resnet81", registry=z, **FEW)
    for options, message in (
        (dict(dtype="int8"), "dtype must be a floating"),
        (dict(batch=0), "batch"),
        (dict(device="tpu"), "^device is one of"),  # the API names its argument, not the flag
        (dict(steps=0), "steps"),
    ):
        with pytest.raises(zoo.InvalidArgument, match=message):
            zoo.bench("timm/resnet18", registry=z, **{**FEW, **options})
    if not torch.cuda.is_available():
        with pytest.raises(zoo.InvalidArgument, match="no usable CUDA GPU"):
            zoo.bench("timm/resnet18", registry=z, device="cuda", **FEW)
        proc = run_cli("bench", "timm/resnet18", "--device", "cuda", registry=registry, check=False)
        assert proc.returncode == 1 and "no usable CUDA GPU" in proc.stderr
    with pytest.raises(zoo.SearchSyntaxError):
        benchmark.run_search(z, "bench_cpu>>1", **FEW)
    with pytest.raises(zoo.SearchSyntaxError, match="cannot sort by 'bench_gpu'"):
        z.search("bench_cpu>0", order_by="bench_gpu")
    # the shipped registry is written only when named: refused before anything is measured
    with pytest.raises(zoo.RegistryError, match="read-only"):
        zoo.bench("timm/resnet18", registry=zoo.Zoo(), **FEW)
    with pytest.raises(zoo.RegistryError, match="read-only"):
        benchmark.run_search(zoo.Zoo(), "name~timm/resnet1*", **FEW)
    assert _runs(registry) == []


def _best(url: str) -> dict[str, float]:
    """Each model's best recorded CPU inference run, read from the measurements table itself."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
        return dict(
            con.execute(
                "SELECT models.name, max(samples_per_s) FROM measurements JOIN models ON models.id = "
                "model_id WHERE device = 'cpu' AND mode = 'infer' GROUP BY models.name"
            )
        )


def test_a_search_sorts_by_a_measured_field_best_run_first_unmeasured_last(registry):
    z = zoo.connect(registry)
    for name in ("user/conv", "timm/resnet18"):
        zoo.bench(name, registry=z, **FEW)
    # resnet18 also measured on a machine 10x faster than conv's run here (a team registry holds both): its best
    # run sorts it first, its slowest would sort it last
    with sqlite3.connect(registry.removeprefix("sqlite:///")) as con:
        con.row_factory = sqlite3.Row
        run = con.execute(
            "SELECT measurements.* FROM measurements JOIN models ON models.id = model_id WHERE "
            "models.name = 'timm/resnet18'"
        ).fetchone()
        faster = {k: run[k] for k in run.keys() if k != "id"}
        faster.update(hardware="a faster CPU", samples_per_s=10 * _best(registry)["user/conv"])
        con.execute(
            f"INSERT INTO measurements ({', '.join(faster)}) VALUES ({', '.join('?' * len(faster))})",
            list(faster.values()),
        )
    best = _best(registry)
    fastest_first = ["timm/resnet18", "user/conv"]
    assert sorted(best, key=best.get, reverse=True) == fastest_first
    unmeasured = ["timm/vit_tiny_patch16_224", "timm/vit_tiny_patch16_384"]  # by name, after every measured one
    for order, expected in (
        ("-bench_cpu", fastest_first + unmeasured),
        ("bench_cpu", fastest_first[::-1] + unmeasured),
    ):
        through_sqlite3 = [
            r["name"] for r in cli_json("search", "name~*", "--sort", order, "--limit", "0", registry=registry)
        ]
        with db.session(registry) as s:
            through_sqlalchemy = [r["name"] for r in store.search(s, "name~*", order_by=order, fields=("name",))]
        assert through_sqlite3 == through_sqlalchemy == expected, order
    # a comparison reads the same best run on every path: resnet18's slow run here is below the threshold,
    # its best is above, so `<` leaves it out (the catalog's search in the browser compares the same numbers)
    threshold = best["user/conv"] * 2
    for expr, expected in (
        (f"bench_cpu>{threshold}", ["timm/resnet18"]),
        (f"bench_cpu<{threshold}", ["user/conv"]),
        (f"not bench_cpu<{threshold}", ["timm/resnet18", *unmeasured]),
    ):
        with db.session(registry) as s:
            through_sqlalchemy = [r["name"] for r in store.search(s, expr, fields=("name",))]
        assert [r["name"] for r in cli_json("search", expr, registry=registry)] == through_sqlalchemy == expected, expr
    for order in ("-bench_cpu", "-BENCH_CPU"):  # the field as the search reads it, in any case
        header, first, *_ = run_cli("search", "name~*", "--sort", order, registry=registry).stdout.splitlines()
        assert header.split()[-1] == "bench_cpu" and first.split()[-1] == f"{best[fastest_first[0]]:.2f}", order
    # the static catalog's rows carry the same numbers, and its grammar knows the field
    from zoo.web import views

    index = views.catalog_index(z)
    assert index["fields"]["bench_cpu"] == "number"
    assert {m["name"]: m["bench_cpu"] for m in index["models"]} == {**dict.fromkeys(unmeasured), **best}
    # the live search's table shows the field it sorts by: each model's best run
    page = views.search(z, {"q": "name~*", "sort": "-BENCH_CPU"})
    assert page["columns"][-1] == "bench_cpu"
    assert {r["name"]: r["bench_cpu"] for r in page["rows"]} == {**dict.fromkeys(unmeasured), **best}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_bench_records_the_gpu_and_its_peak_memory(registry):
    result = zoo.bench("timm/resnet18", registry=zoo.connect(registry), device="cuda", batch=4, dtype="bf16", **FEW)
    assert result["hardware"] == torch.cuda.get_device_name() and result["device"] == "cuda"
    params = sum(p.numel() for p in timm.create_model("resnet18").parameters())
    assert result["peak_bytes"] >= 2 * params
    with db.session(registry) as s:
        assert [r["name"] for r in store.search(s, "bench_cuda>0", fields=("name",))] == ["timm/resnet18"]


def test_a_team_registry_on_postgresql_collects_measurements(registry, pg_server):
    """Runs copied from one machine's registry and one measured straight into the team's PostgreSQL."""
    zoo.bench("user/conv", registry=zoo.connect(registry), **FEW)
    team = pg_server.fresh()
    zoo.connect(registry).copy_to(team)
    zoo.bench("timm/resnet18", registry=zoo.connect(team), **FEW)
    t = zoo.connect(team)
    assert [r["name"] for r in t.search("bench_cpu>0", fields=("name",))] == ["timm/resnet18", "user/conv"]
    assert [r["name"] for r in t.search("bench_cpu>0 and not name~user/*", fields=("name",))] == ["timm/resnet18"]
    best = {n: max(r["samples_per_s"] for r in benchmark.recorded_runs(t, n)) for n in ("user/conv", "timm/resnet18")}
    assert [r["name"] for r in t.search("name~*", order_by="-bench_cpu", fields=("name",))] == [
        *sorted(best, key=best.get, reverse=True),
        "timm/vit_tiny_patch16_224",
        "timm/vit_tiny_patch16_384",
    ]
    runs = {n: benchmark.recorded_runs(t, n) for n in ("user/conv", "timm/resnet18")}
    assert {r["who"] for n in runs for r in runs[n]} == {benchmark.who()}
    assert benchmark.fastest(t, [*runs, "timm/vit_tiny_patch16_224"], "bench_cpu") == {
        n: r["samples_per_s"] for n in runs for r in runs[n]
    }


@pytest.mark.slow  # a bench process, killed: 10 s
def test_a_killed_search_bench_resumes_with_the_models_it_had_recorded(registry):
    """SIGKILL (no cleanup runs) once the first model is recorded; the rerun skips exactly what was recorded."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    search = "name~timm/resnet18 or name~timm/vit_tiny_patch16_224 or name=user/conv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZOO_REGISTRY": registry.removeprefix("sqlite:///")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "bench", search, "-q", "--steps", "5", "--warmup", "1"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not _runs(registry) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = [name for name, _ in _runs(registry)]
    assert before  # at least the first model was recorded before the kill
    again = benchmark.run_search(zoo.connect(registry), search, steps=5, warmup=1)
    assert [r["name"] for r in again if r["skipped"]] == before
    assert sorted(name for name, _ in _runs(registry)) == sorted(r["name"] for r in again)  # one run each
