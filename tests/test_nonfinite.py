"""Numbers that are not finite numbers: refused where they enter (a bench's record, `zoo db copy`, a model row, the
published results and the hardware table read at index time), and where one is in a registry all the same (put in
by hand: SQLite keeps text and infinity in a REAL column, PostgreSQL keeps NaN, which compares above every number)
it reads as missing: searches and sorts go by the other runs, every page answers, every JSON output is JSON."""

import csv
import json
import math
import sqlite3

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import zoo
from tests.conftest import sqlite_copy
from tests.web_support import serving_app
from zoo.cli import main
from zoo.columns import BY_NAME
from zoo.registry import db, measurements, store
from zoo.throughput import benchmark, roofline
from zoo.web import views
from zoo.web.app import create_app
from zoo.web.export import export_catalog

# What a hand-made row can hold on each backend: SQLite binds NaN as NULL, so its not-a-number is text
BAD = {
    "sqlite": {"infinity": math.inf, "not_a_number": "fast"},
    "postgresql": {"infinity": math.inf, "not_a_number": math.nan},
}
RUN = dict(
    hardware="a CPU",
    device="cpu",
    mode="infer",
    dtype="fp32",
    batch=1,
    compiled=False,
    channels_last=False,
    threads=1,
    inputs="[]",
    step_ms=10.0,
    steps=1,
    warmup=0,
    versions="{}",
    who="someone@elsewhere",
)


def strict(text: str):
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda constant: pytest.fail(f"{constant} in JSON output"))


@pytest.fixture
def template(conv_and_tied) -> str:
    """user/conv (with its input spec) and user/tied, compacted: tests/conftest.py's session registry, read-only."""
    return conv_and_tied


@pytest.fixture
def registry(template, backend_url) -> str:
    """The template's two models in a fresh registry on each backend."""
    if backend_url.startswith("sqlite"):
        sqlite_copy(template, backend_url.removeprefix("sqlite:///"))
    else:
        zoo.connect(template).copy_to(backend_url)
    return backend_url


def _backend(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def _execute(url: str, sql: str, **values) -> None:
    """SQL straight into the registry, as a hand (or another program) would."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as con:
            con.execute(text(sql), values)
    finally:
        engine.dispose()


def _plant_run(url: str, name: str, samples_per_s) -> None:
    columns = ", ".join([*RUN, "samples_per_s"])
    _execute(
        url,
        f"INSERT INTO measurements (model_id, measured_at, {columns}) SELECT id, CURRENT_TIMESTAMP, "
        f"{', '.join(':' + c for c in [*RUN, 'samples_per_s'])} FROM models WHERE name = :name",
        **RUN,
        samples_per_s=samples_per_s,
        name=name,
    )


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _get(base: str, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + path, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _page_data(html: str):
    """The JSON block a page embeds (zoo.web.app.page)."""
    start = html.index('type="application/json"')
    return strict(html[html.index(">", start) + 1 : html.index("</script>", start)])


@pytest.mark.parametrize("kind", ["infinity", "not_a_number"])
def test_a_bad_run_beside_real_ones_is_left_out_of_every_search_sort_and_answer(registry, kind, capsys):
    """user/conv has a real run of 5 samples/s and one of infinity / NaN (PostgreSQL) / text (SQLite): the search
    compares and sorts by its real run, as if the bad one were not there, and every answer is JSON."""
    bad = BAD[_backend(registry)][kind]
    _plant_run(registry, "user/conv", 5.0)
    _plant_run(registry, "user/conv", bad)
    _plant_run(registry, "user/tied", 50.0)
    z = zoo.connect(registry)
    assert z.search("bench_cpu>100", fields=("name",)) == []
    assert [r["name"] for r in z.search("bench_cpu>1 and bench_cpu<10", fields=("name",))] == ["user/conv"]
    assert [r["name"] for r in z.search("name~user/*", order_by="-bench_cpu", fields=("name",))] == [
        "user/tied",
        "user/conv",
    ]
    assert benchmark.fastest(z, ["user/conv", "user/tied"], "bench_cpu") == {"user/conv": 5.0, "user/tied": 50.0}
    with db.session(registry) as s:  # SQLAlchemy's path (the one PostgreSQL always takes)
        assert store.search(s, "bench_cpu>100", fields=("name",)) == []
        assert measurements.fastest(s, ["user/conv"], "cpu", "infer") == {"user/conv": 5.0}
    runs = benchmark.recorded_runs(z, "user/conv")
    assert [r["samples_per_s"] for r in runs] == [5.0, None]  # shown as missing
    json.dumps(runs, default=str, allow_nan=False)
    # the CLI: the table, the model with its runs, JSON
    rc, out, err = _cli(capsys, "search", "bench_cpu>0", "--sort", "-bench_cpu", "--registry", registry)
    assert rc == 0 and [line.split()[-1] for line in out.splitlines()[1:]] == ["50.00", "5.00"], out + err
    rc, out, err = _cli(capsys, "show", "user/conv", "--registry", registry)
    assert rc == 0 and "5.00" in out, err
    rc, out, _ = _cli(capsys, "show", "user/conv", "--json", "--registry", registry)
    assert rc == 0 and [r["samples_per_s"] for r in strict(out)["measurements"]] == [5.0, None]
    # the catalog: its search (the table shows each model's best real run), its static index, its server
    page = views.search(z, {"q": "bench_cpu>0", "sort": "-bench_cpu"})
    assert [(r["name"], r["bench_cpu"]) for r in page["rows"]] == [("user/tied", 50.0), ("user/conv", 5.0)]
    json.dumps(page, allow_nan=False)
    index = views.catalog_index(z)
    json.dumps(index, allow_nan=False)
    assert {m["name"]: m["bench_cpu"] for m in index["models"]} == {"user/conv": 5.0, "user/tied": 50.0}
    with serving_app(create_app(registry)) as base:
        status, body = _get(base, "/api/search?q=bench_cpu%3E0")
        assert status == 200 and strict(body)["total"] == 2, body
        status, body = _get(base, "/?q=bench_cpu%3E0")
        assert status == 200 and _page_data(body)["search"]["total"] == 2


@pytest.mark.parametrize("kind", ["infinity", "not_a_number"])
def test_a_bad_number_in_a_model_row_reads_as_missing(registry, kind, capsys, tmp_path):
    bad = BAD[_backend(registry)][kind]
    _execute(
        registry,
        "UPDATE models SET top1 = :bad, metrics = :metrics WHERE name = 'user/conv'",
        bad=bad,
        metrics='{"imagenet": {"top1": NaN, "top5": 90.5}}',
    )  # what Python's json.dumps writes by default
    if _backend(registry) == "sqlite":  # SQLite keeps anything in an integer column too
        _execute(registry, "UPDATE models SET flops = :bad WHERE name = 'user/conv'", bad=bad)
    z = zoo.connect(registry)
    info = z.info("user/conv")
    assert info.top1 is None and info.metrics == {"imagenet": {"top1": None, "top5": 90.5}}
    json.dumps(info.as_dict(), allow_nan=False)
    assert [r["top1"] for r in z.search("name~user/*", fields=("top1",))] == [None, None]
    rc, out, err = _cli(capsys, "show", "user/conv", "--registry", registry)
    assert rc == 0, err
    for args in (("show", "user/conv"), ("search", "name~*")):
        rc, out, err = _cli(capsys, *args, "--json", "--registry", registry)
        assert rc == 0, err
        strict(out)
    rc, out, err = _cli(capsys, "search", "name~*", "--sort", "-top1", "--registry", registry)
    assert rc == 0 and "user/conv" in out, err
    json.dumps(views.model(z, "user/conv"), allow_nan=False)
    json.dumps(views.search(z, {"q": "name~*", "sort": "-pred_infer_4090_amp"}), allow_nan=False)
    with serving_app(create_app(registry)) as base:
        for path in ("/", "/?q=top1%3E0", "/model/user/conv"):
            status, body = _get(base, path)
            assert status == 200, (path, body)
            _page_data(body)
        status, body = _get(base, "/api/models/user/conv")
        assert status == 200 and strict(body)["fields"]["top1"] is None, body
    export_catalog(tmp_path / "site", registry)
    index = strict((tmp_path / "site" / "data" / "index.json").read_text())
    assert {m["name"]: m["top1"] for m in index["models"]} == {"user/conv": None, "user/tied": None}


@pytest.mark.parametrize("table", ["models", "measurements"])
def test_db_copy_refuses_a_registry_with_a_bad_number(registry, table, capsys, tmp_path):
    bad = BAD[_backend(registry)]["not_a_number"]
    if table == "models":
        _execute(registry, "UPDATE models SET top1 = :bad WHERE name = 'user/tied'", bad=bad)
        column = "top1"
    else:
        _plant_run(registry, "user/conv", bad)
        column = "samples_per_s"
    target = tmp_path / "copy.db"
    rc, out, err = _cli(capsys, "db", "copy", registry, str(target))
    assert rc == 1 and f"{column} is" in err and "not a finite number" in err and "nothing was copied" in err, err
    with sqlite3.connect(target) as con:  # the schema may be made; no row is in it
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 0.0, "fast"])
def test_a_bench_result_that_is_no_positive_finite_number_is_not_recorded(template, tmp_path, bad):
    path = tmp_path / "r.db"
    sqlite_copy(template, path)
    z = zoo.connect(str(path))
    run = benchmark.run(z, "user/conv", steps=1, warmup=0, record=False)  # a real run's values
    values = {k: v for k, v in run.items() if k not in ("name", "skipped")}
    with pytest.raises(zoo.InvalidArgument, match="samples_per_s"):
        with db.session(z.url, write=True) as s, s.begin():
            measurements.record(s, "user/conv", {**values, "samples_per_s": bad})
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT count(*) FROM measurements").fetchone() == (0,)


def test_a_model_row_with_a_number_that_is_not_finite_is_refused(template, tmp_path):
    path = tmp_path / "r.db"
    sqlite_copy(template, path)
    record = {
        "name": "user/odd",
        "family": "user",
        "builder": "tests.builders:tied_net",
        "status": "ok",
        "source_hash": "0" * 64,
    }
    for field, bad in (("top1", math.nan), ("top5", math.inf), ("flops", "1e9")):
        with pytest.raises(zoo.InvalidArgument, match=f"user/odd: {field} is"):
            with db.session(f"sqlite:///{path}", write=True) as s, s.begin():
                store.write_model(s, {**record, field: bad}, None)
    with pytest.raises(zoo.InvalidArgument, match="metrics holds a number that is not finite"):
        BY_NAME["metrics"].encode({"imagenet": {"top1": math.nan}})
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT count(*) FROM models WHERE name = 'user/odd'").fetchone() == (0,)


def test_published_results_with_a_number_that_is_not_finite_are_refused(tmp_path):
    from zoo.families import timm as timm_family

    for name in timm_family.RESULT_SETS:
        (tmp_path / f"results-{name}.csv").write_text("model,top1,top5,img_size\nresnet18.a1_in1k,71.5,90.1,224\n")
    assert timm_family.read_results(tmp_path)["imagenet"]["resnet18.a1_in1k"][0]["top1"] == 71.5
    for cell in ("nan", "inf", "-Infinity"):
        (tmp_path / "results-sketch.csv").write_text(f"model,top1,top5,img_size\nresnet18.a1_in1k,{cell},90.1,224\n")
        with pytest.raises(zoo.InvalidArgument, match=r"results-sketch.csv: resnet18.a1_in1k: top1 is"):
            timm_family.read_results(tmp_path)
    (tmp_path / "results-sketch.csv").write_text("model,top1,top5,img_size\n")
    benchmark_file = tmp_path / timm_family.BENCHMARKS["infer_4090_amp"]
    for cell in ("inf", "nan", "0", "fast"):
        benchmark_file.write_text(
            f"model,infer_img_size,infer_samples_per_sec,infer_batch_size\nresnet18,224,{cell},256\n"
        )
        with pytest.raises(zoo.InvalidArgument, match="resnet18"):
            timm_family.read_results(tmp_path)


def _hardware_with(tmp_path, **changes):
    """catalog/hardware.csv with the first row's fields changed."""
    with open(roofline.HARDWARE, newline="") as f:
        rows = list(csv.DictReader(f))
    rows[0].update(changes)
    path = tmp_path / "hardware.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))  # the required FIELDS and the planning columns
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize(
    "changes",
    [
        dict(element_bytes="0.5"),
        dict(peak_tflops="1e308"),
        dict(bandwidth_gbs="1e308"),
        dict(batch="2.5"),
        dict(peak_tflops="nan"),
    ],
)
def test_a_hardware_row_that_would_divide_by_zero_is_refused(tmp_path, changes):
    assert roofline.load_hardware(_hardware_with(tmp_path)).keys() == roofline.load_hardware().keys()  # as shipped
    with pytest.raises(zoo.InvalidArgument, match=next(iter(changes))):
        roofline.load_hardware(_hardware_with(tmp_path, **changes))


def test_a_device_the_table_would_refuse_predicts_nothing_rather_than_dividing_by_zero(template, monkeypatch):
    """What element_bytes 0.5 (read as 0) and 1e308 peaks (infinite FLOP/s) made: coefficients of 0. A sort by
    its field raised ZeroDivisionError in the catalog's search."""
    field = "pred_infer_4090_amp"
    device = roofline.Device(
        column="infer_4090_amp",
        device="nowhere",
        mode="infer",
        precision="fp16",
        element_bytes=0,
        batch=1024,
        peak_flops=math.inf,
        bandwidth=math.inf,
        source="a test",
    )
    monkeypatch.setitem(roofline.PREDICTED, field, device)
    z = zoo.connect(template)
    assert roofline.predicted(z.info("user/conv"), field) is None
    with pytest.raises(zoo.InvalidArgument, match="no finite prediction"):
        roofline.predict(z.info("user/conv"), device, 1)
    page = views.search(z, {"q": "name~*", "sort": f"-{field}"})
    assert [r[field] for r in page["rows"]] == [None, None]
