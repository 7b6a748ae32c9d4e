"""The web catalog over HTTP: the JSON API against the Python API, typed errors and their statuses, bounded
answers, nothing written to the registry by any request, `zoo serve` on 127.0.0.1, and `zoo catalog`'s
files. The pages in a real browser are tests/test_web_browser.py."""

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter

import pytest

from tests.conftest import ROOT, run_cli
from tests.web_support import serving_app
from zoo import render
from zoo.api import Zoo
from zoo.cli import parser
from zoo.errors import InvalidArgument, ModelNotFound, SearchSyntaxError
from zoo.query import parse
from zoo.throughput.measured import MEASURED
from zoo.web import views
from zoo.web.app import create_app
from zoo.web.export import file_name

QUERIES = [
    None,
    "family=timm",
    "params<1e7",
    "not task=image-classification",
    "name~'resnet*'",
    "flops>1G and (family=torchvision or name~'*vit*')",
    "bytes>=20MiB",
]
SORTS = [None, "-params", "flops", "name", "-bytes", "task"]


@pytest.fixture(scope="module")
def site(small_registry):
    with serving_app(create_app(small_registry)) as base:
        yield base


def get(base, path, method="GET", **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def get_json(base, path, **params):
    status, _, body = get(base, path, **params)
    return status, json.loads(body)


@pytest.mark.parametrize("q", QUERIES)
def test_api_search_answers_what_zoo_search_answers(site, small_registry, q):
    for sort in SORTS:
        status, body = get_json(site, "/api/search", **{k: v for k, v in (("q", q), ("sort", sort)) if v})
        assert status == 200
        found = Zoo(small_registry).search(q, order_by=sort, limit=None)
        assert [p["name"] for p in body["points"]] == [i.name for i in found]
        # each point says the size its numbers are at
        assert [p["input_size"] for p in body["points"]] == [
            list(i.input_size) if i.input_size else None for i in found
        ]
        assert [r["name"] for r in body["rows"]] == [i.name for i in found][: views.PER_PAGE]
        assert body["total"] == len(found) and body["more"] is False
        assert dict(body["facets"]["family"]) == Counter(i.family for i in found)
        assert dict(body["facets"]["task"]) == Counter(i.task for i in found if i.task)
        assert all(r == {c: getattr(i, c) for c in body["columns"]} for r, i in zip(body["rows"], found))


def test_api_search_with_fits_keeps_what_zoo_search_fits_keeps(site, small_registry):
    """The catalog's fits filter is search --fits: the models whose plan fits, each with its max_batch as a column,
    and the matches that record no plan (fasterrcnn cannot run on meta) counted."""
    spec = "RTX 4090 train batch=512"
    want, unplanned = Zoo(small_registry)._search_fits(None, "name", None, ["name", "max_batch"], spec)
    status, body = get_json(site, "/api/search", sort="name", fits=spec)
    assert status == 200 and body["fits"] == spec and body["columns"][-1] == "max_batch"
    assert [(r["name"], r["max_batch"]) for r in body["rows"]] == [(r["name"], r["max_batch"]) for r, _ in want]
    assert 0 < body["total"] == len(want) < len(Zoo(small_registry).search(None)) - len(unplanned)  # some do not fit
    assert body["unplanned"] == len(unplanned) > 0
    status, body = get_json(site, "/api/search", fits="H100 train lr=1")
    assert status == 400 and "unknown key 'lr'" in body["message"]


@pytest.mark.parametrize(
    "q, sort, named",
    [
        ("infer_4090_amp>0 or params>0", "-PRED_INFER_4090_AMP", ["infer_4090_amp", "pred_infer_4090_amp"]),
        ("bench_cpu>1 or family=timm", "-train_3090_amp", ["train_3090_amp", "bench_cpu"]),
    ],
)
def test_a_search_shows_the_numbers_it_names_as_columns(site, small_registry, q, sort, named):
    """As `zoo search` does: a published metric, a prediction or a measured field that the search or its sort
    names is a column after the default ones, each row holding the model's own number (a measured one: its best
    recorded run, none in this registry; tests/test_bench_cmd.py has some)."""
    from zoo.throughput.roofline import predicted

    status, body = get_json(site, "/api/search", q=q, sort=sort)
    assert status == 200 and body["columns"] == [*views.TABLE_COLUMNS, *named]
    found = Zoo(small_registry).search(q, order_by=sort, limit=None)
    assert [r["name"] for r in body["rows"]] == [i.name for i in found][: views.PER_PAGE]
    for r, i in zip(body["rows"], found):
        assert r == {
            c: predicted(i, c) if c.startswith("pred_") else None if c in MEASURED else getattr(i, c)
            for c in body["columns"]
        }
    assert all(any(r[c] is not None for r in body["rows"]) for c in named if c not in MEASURED)  # numbers, not Nones


def test_pages_of_a_search_add_up_to_the_whole_result(site, small_registry):
    whole = [i.name for i in Zoo(small_registry).search(None, order_by="-params", limit=None)]
    pages = []
    for page in range(1, 5):
        status, body = get_json(site, "/api/search", sort="-params", per_page=3, page=page)
        assert status == 200 and body["pages"] == -(-len(whole) // 3)
        pages += [r["name"] for r in body["rows"]]
    assert pages == whole


@pytest.mark.parametrize("q", QUERIES)
def test_zoo_search_with_fields_gives_those_fields_of_the_same_models(small_registry, q):
    zoo = Zoo(small_registry)
    fields = ("name", "task", "flops", "kwargs", "input_size", "indexed_at")
    for sort in SORTS:
        assert zoo.search(q, order_by=sort, limit=5, fields=fields) == [
            {f: getattr(i, f) for f in fields} for i in zoo.search(q, order_by=sort, limit=5)
        ]
    for private in ("short", "source_hash", "nope"):
        with pytest.raises(InvalidArgument, match=private):
            zoo.search(q, fields=("name", private))


def test_a_search_past_the_cap_is_counted_and_plotted_up_to_it(small_registry, monkeypatch):
    monkeypatch.setattr(views, "MAX_RESULTS", 3)
    body = views.search(Zoo(small_registry), {"sort": "-params", "per_page": "2", "page": "2"})
    first = [i.name for i in Zoo(small_registry).search(None, order_by="-params", limit=3)]
    assert body["more"] is True and body["total"] == 3 and body["pages"] == 2 and body["sampled"] is True
    assert [p["name"] for p in body["points"]] == first and [r["name"] for r in body["rows"]] == first[2:]
    assert sum(n for _, n in body["facets"]["family"]) == 3


@pytest.mark.parametrize("cap, sampled", [(5, True), (10_000, False)])
def test_a_large_result_plots_and_facets_its_first_rows_and_says_so(small_registry, monkeypatch, cap, sampled):
    """Past MAX_RESULTS matches, the plot and the facets are of the first SAMPLE in the table's order (`sampled`),
    while the rows page through all MAX_RESULTS; up to it, they are of every match, whose number SQL counts."""
    monkeypatch.setattr(views, "MAX_RESULTS", cap)
    monkeypatch.setattr(views, "SAMPLE", 3)
    zoo = Zoo(small_registry)
    whole = zoo.search(None, order_by="-params", limit=None)
    assert len(whole) > 5
    body = views.search(zoo, {"sort": "-params", "per_page": "2", "page": "3"})
    shown = whole[:3] if sampled else whole
    assert body["sampled"] is sampled and body["more"] is sampled
    assert body["total"] == (cap if sampled else len(whole)) and body["pages"] == -(-body["total"] // 2)
    assert [p["name"] for p in body["points"]] == [i.name for i in shown]
    assert [r["name"] for r in body["rows"]] == [i.name for i in whole[: body["total"]][4:6]]
    assert dict(body["facets"]["family"]) == Counter(i.family for i in shown)
    assert dict(body["facets"]["task"]) == Counter(i.task for i in shown if i.task)


@pytest.mark.parametrize("q", ["", "family=timm", "params<1e7 or family=torchvision", "name~'*resnet*'", "params<0"])
def test_zoo_count_counts_what_zoo_search_finds(small_registry, q):
    zoo = Zoo(small_registry)
    n = len(zoo.search(q or None, limit=None))
    assert zoo.count(q or None) == n
    for limit in (0, 1, n, n + 1):
        assert zoo.count(q or None, limit=limit) == min(n, limit)


@pytest.mark.parametrize(
    "params",
    [
        {"per_page": views.MAX_PER_PAGE + 1},
        {"per_page": 0},
        {"page": 0},
        {"page": "two"},
        {"per_page": "-5"},
        {"x": "license"},
        {"y": "bench_cpu"},
    ],
)
def test_paging_out_of_bounds_is_a_400(site, params):
    status, body = get_json(site, "/api/search", **params)
    assert status == 400 and body["error"] == "InvalidArgument" and next(iter(params)) in body["message"]


@pytest.mark.parametrize(
    "path, key",
    [
        ("/api/search", "page"),
        ("/api/search", "per_page"),
        ("/api/models/timm/resnet18", "tensor_page"),
        ("/api/estimate/timm/resnet18", "batch"),
    ],
)
@pytest.mark.parametrize("value", ["\u00b2", "1" * 5000, "\u0663"])  # a superscript two, 5,000 digits, an Arabic three
def test_a_number_that_is_not_plain_ascii_digits_is_a_400(site, path, key, value):
    # str.isdigit() says yes to all three; int() refuses the first two (a 500 once) and reads the third
    status, body = get_json(site, path, **{key: value})
    assert status == 400 and body["error"] == "InvalidArgument" and key in body["message"], body


def test_the_plot_points_carry_the_axes_the_url_names_and_their_predictions(site, small_registry):
    """x=infer_4090_amp brings each point's measured number and its prediction (pred_infer_4090_amp, the
    roofline of the row's flops, bytes and activations); y=test_top1 its own column; the defaults stay."""
    from zoo.throughput.roofline import predicted

    status, body = get_json(site, "/api/search", x="infer_4090_amp", y="test_top1")
    assert status == 200
    found = {i.name: i for i in Zoo(small_registry).search(None, limit=None)}
    for p in body["points"]:
        i = found[p["name"]]
        assert set(p) == {
            "name",
            "family",
            "input_size",
            "flops",
            "params",
            "top1",
            "infer_4090_amp",
            "pred_infer_4090_amp",
            "test_top1",
        }
        assert (p["infer_4090_amp"], p["test_top1"]) == (i.infer_4090_amp, i.test_top1)
        assert p["pred_infer_4090_amp"] == predicted(i, "pred_infer_4090_amp")
    assert {a["name"] for a in body["axes"]} >= {"top1", "flops", "infer_4090_amp", "pred_infer_4090_amp"}


@pytest.mark.parametrize("value, page", [("0001", 1), ("0" * 5000 + "2", 2), ("002", 2)])
def test_a_zero_padded_number_is_read_as_its_value(site, value, page):
    status, body = get_json(site, "/api/search", page=value, per_page="0002")
    assert status == 200 and (body["page"], body["per_page"]) == (page, 2), body
    status, body = get_json(site, "/api/search", page="0" * 9 + "1" * 10)  # past 10**9 however padded
    assert status == 400 and body["error"] == "InvalidArgument" and "page" in body["message"], body
    assert get_json(site, "/api/search", page="0000")[0] == 400


@pytest.mark.parametrize(
    "q",
    [
        "params<<1",
        "params < 7B and",
        "task=image-classification and (flops>1G",
        "paramz<1",
        "name~3 and params~*x*",
        "flops < lots",
        "",
    ],
)
def test_a_syntax_error_is_a_400_with_the_column(site, q):
    if not q:  # an empty search is every model, not an error
        assert get_json(site, "/api/search", q=q)[0] == 200
        return
    with pytest.raises(SearchSyntaxError) as expected:
        parse(q)
    status, body = get_json(site, "/api/search", q=q)
    assert status == 400 and body["error"] == "SearchSyntaxError" and body["param"] == "q"
    assert (body["column"], body["expression"]) == (expected.value.column, q)


def test_a_bad_sort_is_a_400_that_names_the_sort(site):
    status, body = get_json(site, "/api/search", q="family=timm", sort="-paramz")
    assert status == 400 and body["param"] == "sort" and body["column"] == 2 and "paramz" in body["message"]


@pytest.mark.parametrize("kind", ["models", "scan", "estimate"])
def test_an_unknown_name_is_a_404_with_suggestions(site, small_registry, kind):
    with pytest.raises(ModelNotFound) as expected:
        Zoo(small_registry).info("timm/resnet19")
    status, body = get_json(site, f"/api/{kind}/timm/resnet19")
    assert status == 404 and body["error"] == "ModelNotFound"
    assert body["suggestions"] == expected.value.suggestions and "timm/resnet18" in body["suggestions"]


def test_an_ambiguous_bare_name_is_a_404_listing_the_candidates(site):
    status, body = get_json(site, "/api/models/resnet18")
    assert status == 404 and body["error"] == "AmbiguousName"
    assert body["suggestions"] == ["timm/resnet18", "torchvision/resnet18"]


def test_api_models_is_zoo_info_and_what_zoo_show_prints(site, small_registry):
    info = Zoo(small_registry).info("timm/resnet18", tensors=True)
    status, body = get_json(site, "/api/models/timm/resnet18", tensor_page=2, tensor_per_page=50)
    assert status == 200
    expected = info.as_dict()
    expected.pop("tensor_table")
    assert body["fields"] == json.loads(json.dumps(expected))
    assert body["show"] == [list(r) for r in render.info_rows(info)]
    rows = render.tensor_rows(info.tensor_table)
    assert body["tensors"]["header"] == rows[0] and body["tensors"]["rows"] == rows[51:101]
    assert body["tensors"]["total"] == len(info.tensor_table) and body["tensors"]["pages"] == 3
    assert any('zoo.get("timm/resnet18")' in s for s in body["snippets"])
    status, body = get_json(site, "/api/models/timm/resnet18", tensor_per_page=views.MAX_TENSORS_PER_PAGE + 1)
    assert status == 400


def test_api_scan_is_zoo_scan(site, small_registry):
    status, body = get_json(site, "/api/scan/timm/resnet18")
    assert status == 200
    assert body["modules"] == Zoo(small_registry).scan("timm/resnet18", strict=False).as_dict()["modules"]
    assert body["error"] is None and body["truncated"] is False


def test_api_estimate_is_zoo_estimate(site, small_registry):
    status, body = get_json(
        site, "/api/estimate/timm/resnet18", batch=4, dtype="fp16", training="true", optimizer="sgd"
    )
    assert status == 200
    assert (
        body
        == Zoo(small_registry)
        .estimate("timm/resnet18", batch=4, dtype="fp16", training=True, optimizer="sgd")
        .as_dict()
    )


@pytest.mark.parametrize(
    "params",
    [
        {"batch": 0},
        {"batch": "x"},
        {"batch": views.MAX_BATCH + 1},
        {"dtype": "fp8"},
        {"training": "maybe"},
        {"seq_len": "-1"},
        {"training": "1", "optimizer": "lion"},
    ],
)
def test_bad_estimate_parameters_are_a_400(site, params):
    status, body = get_json(site, "/api/estimate/timm/resnet18", **params)
    assert status == 400 and body["error"] in ("InvalidArgument", "AnalysisError"), body


def test_pages_embed_their_answer_and_escape_what_they_embed(site):
    hostile = "name='</script><script>alert(1)</script>'"
    status, headers, html = get(site, "/", q=hostile, sort="-params")
    text = html.decode()
    assert status == 200 and "<script>alert(1)" not in text and text.count("</script>") == 2
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    data = json.loads(text.split('id="zoo-data">')[1].split("</script>")[0])
    assert data["mode"] == "server" and data["search"]["q"] == hostile and data["search"]["total"] == 0
    status, _, html = get(site, "/", q="params<<1")
    data = json.loads(html.decode().split('id="zoo-data">')[1].split("</script>")[0])
    assert status == 400 and data["failure"]["column"] == 8
    assert get(site, "/model/timm/resnet18")[0] == 200
    status, _, html = get(site, "/model/timm/resnet19")
    assert status == 404 and "timm/resnet18" in html.decode()
    assert get(site, "/static/plot.js")[0] == 200 and get(site, "/static/../views.py")[0] == 404


def _hash_folder(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _journal_copy(small_registry, registry):
    """A copy in rollback-journal mode, as the shipped registry is."""
    registry.parent.mkdir()
    source = sqlite3.connect(small_registry.removeprefix("sqlite:///"))
    copy = sqlite3.connect(registry)
    source.backup(copy)
    copy.execute("PRAGMA journal_mode=DELETE")
    copy.close()
    source.close()


def test_no_request_writes_to_the_registry(small_registry, tmp_path):
    # A WAL database would be checkpointed by its last reader closing, which rewrites the file without any
    # request writing to it: a rollback-journal copy.
    registry = tmp_path / "registry" / "copy.db"
    _journal_copy(small_registry, registry)
    before = _hash_folder(registry.parent)
    paths = [
        "/",
        "/?q=family%3Dtimm&sort=-params",
        "/?q=params<<",
        "/model/timm/resnet18",
        "/model/nope",
        "/api/search?q=params>1",
        "/api/search?q=bad~~",
        "/api/models/timm/resnet18",
        "/api/models/timm/resnet18?tensor_page=2",
        "/api/scan/timm/resnet18",
        "/api/estimate/timm/resnet18?batch=2",
        "/api/estimate/nope",
        "/static/zoo.css",
        "/nowhere",
    ]
    with serving_app(create_app(str(registry))) as base:
        for path in paths:
            assert get(base, path)[0] in (200, 400, 404), path
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                status = get(base, path, method=method)[0]
                assert status in (404, 405), (method, path, status)  # 404: no route at all
    assert _hash_folder(registry.parent) == before


def test_a_locked_registry_is_a_503_with_retry_after_that_names_no_path(small_registry, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_LOCK_TIMEOUT", "0.2")
    registry = tmp_path / "hidden-folder" / "private.db"
    _journal_copy(small_registry, registry)
    with serving_app(create_app(str(registry))) as base:
        assert get(base, "/api/search")[0] == 200
        writer = sqlite3.connect(registry, isolation_level=None, timeout=0)
        writer.execute("BEGIN EXCLUSIVE")  # a writer holding the file: no reader gets in
        try:
            for path in ("/api/models/timm/resnet18", "/?q=params>1"):  # each waits 5 s in zoo.registry.lite first
                status, headers, body = get(base, path)
                text = body.decode()
                assert status == 503 and int(headers["Retry-After"]) > 0, (path, status, text)
                assert "RegistryLocked" in text and "hidden-folder" not in text and "private" not in text, text
        finally:
            writer.rollback()
            writer.close()
        assert get(base, "/api/search")[0] == 200


def test_zoo_serve_binds_127_0_0_1_by_default_and_serves(small_registry):
    assert parser().parse_args(["serve"]).host == "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env_path = small_registry.removeprefix("sqlite:///")
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli", "serve", "--registry", env_path, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = get_json(f"http://127.0.0.1:{port}", "/api/search", q="family=timm")
                break
            except urllib.error.URLError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        assert status == 200 and body["total"] == 4
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0]
    assert f"http://127.0.0.1:{port}/" in output


def test_bound_to_this_machine_it_answers_only_its_own_names(small_registry):
    from zoo.web.app import LOOPBACK_HOSTS

    with serving_app(create_app(small_registry, hosts=LOOPBACK_HOSTS)) as base:
        assert get(base, "/api/search")[0] == 200
        request = urllib.request.Request(base + "/api/search", headers={"Host": "rebound.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400


def test_zoo_serve_on_a_missing_registry_fails_at_once(tmp_path):
    proc = run_cli("serve", "--registry", str(tmp_path / "none.db"), "--port", "9", check=False, timeout=60)
    assert proc.returncode == 1 and "no registry at" in proc.stderr


def test_zoo_catalog_writes_pages_json_and_assets(small_registry, tmp_path):
    out = tmp_path / "site"
    proc = run_cli("catalog", "--out", str(out), "--quiet", registry=small_registry)
    assert "wrote 8 models" in proc.stdout
    assert {p.name for p in out.iterdir()} == {"index.html", "model.html", "static", "data"}
    assert {p.name for p in (out / "static").iterdir()} >= {
        "zoo.css",
        "format.js",
        "grammar.js",
        "plot.js",
        "search.js",
        "model.js",
    }
    index = json.loads((out / "data" / "index.json").read_text())
    zoo = Zoo(small_registry)
    unmeasured = dict.fromkeys(MEASURED)  # bench_cpu, ...: no run recorded in this registry
    assert index["models"] == json.loads(
        json.dumps([{**views.summary(i), **unmeasured} for i in zoo.search(None, limit=None)])
    )
    assert [m["name"] for m in index["models"]] == [i.name for i in zoo.search(None, limit=None)]
    files = {p.name for p in (out / "data" / "models").iterdir()}
    assert files == {file_name(m["name"]) for m in index["models"]}
    one = json.loads((out / "data" / "models" / file_name("timm/resnet18")).read_text())
    assert one["model"] == json.loads(json.dumps(views.model(zoo, "timm/resnet18", whole=True)))
    assert len(one["model"]["tensors"]["rows"]) == one["model"]["tensors"]["total"] == 122
    assert one["tree"] is None  # --trees exports them
    assert "https://" not in (out / "index.html").read_text() + (out / "model.html").read_text()


@pytest.mark.parametrize("name", ["../../etc/passwd", "/abs", ".hidden", "a/b", "a_2fb", "hf/org/Name-1.5B", "ü"])
def test_a_data_file_name_stays_in_its_folder_and_is_one_to_one(name):
    made = file_name(name)
    assert "/" not in made and not made.startswith(".") and made.endswith(".json")
    assert file_name(name + "x") != made and file_name("a/b") != file_name("a_2fb")
    assert os.path.basename(made) == made
