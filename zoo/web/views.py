"""What the catalog shows, as JSON-ready dicts built from Zoo methods only (no SQL here): a search page
(one page of rows, facets and plot points of the whole result set, or of a large one's first rows), a model, its
module tree, an estimate; and typed errors as (status, body). The server (app.py) and the static export share it."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import overload

from zoo import render
from zoo.api import Zoo
from zoo.columns import SEARCH_FIELDS, THROUGHPUT
from zoo.errors import (
    AmbiguousName,
    AnalysisError,
    BuildFailed,
    InvalidArgument,
    ModelNotFound,
    NotBuildable,
    RegistryDrift,
    RegistryError,
    RegistryLocked,
    SearchSyntaxError,
    ZooError,
)
from zoo.families import family
from zoo.model_info import ModelInfo
from zoo.query import COMPARED, parse_sort
from zoo.throughput.measured import MEASURED
from zoo.throughput.roofline import PREDICTED, predicted

# Every answer is bounded: a page of rows, a page of tensors, at most MAX_RESULTS matches counted and paged (more
# are reported as `more`), at most MAX_TREE_MODULES modules. A search with at most MAX_RESULTS matches has its facets
# and plot from every match; one with more, from its first SAMPLE (`sampled`): reading 10,000 rows of a million-model
# registry took 200-480 ms, and counting every match by family took 0.3-4.7 s (GROUP BY, SQLite and PostgreSQL).
PER_PAGE, MAX_PER_PAGE = 50, 200
TENSORS_PER_PAGE, MAX_TENSORS_PER_PAGE = 100, 500
MAX_RESULTS = 10_000
SAMPLE = 200
MAX_TREE_MODULES = 5_000
MAX_BATCH, MAX_SEQ_LEN = 65_536, 1 << 20  # an estimate runs on meta, but its time grows with them

TABLE_COLUMNS = ("name", "family", "task", "params", "flops", "bytes", "top1", "license")
FACETS = ("family", "task")  # the fields whose values the page counts and narrows a search by
# what every plot point carries: the plot's default axes (x GFLOPs; y top-1 where any row has it, else the
# other size) and the size its numbers are at; the axes a URL names come on top (plot_axes)
PLOT_FIELDS = ("name", "family", "input_size", "flops", "params", "top1")
# the roofline's inputs: the predicted fields are computed from them, as the search computes them
ROOFLINE_INPUTS = ("flops", "bytes", "train_activation_bytes")


def plot_axes() -> list[dict]:
    """The numbers the plot can put on either axis: label, log scale, better (1: more is better, -1: less),
    predicted (every value is a prediction), fill (the predicted field that stands in where this measured
    one is missing, drawn as a prediction). plot.js reads this, the server's and the static catalog's alike."""

    def axis(name, label, log, better, prediction=False, fill=None):
        return {"name": name, "label": label, "log": log, "better": better, "predicted": prediction, "fill": fill}

    axes = [
        axis("top1", "top-1 (%)", False, 1),
        axis("top5", "top-5 (%)", False, 1),
        axis("test_top1", "top-1 at the test size (%)", False, 1),
        axis("flops", "GFLOPs (batch 1)", True, -1),
        axis("test_flops", "GFLOPs at the test size", True, -1),
        axis("params", "parameters", True, -1),
        axis("bytes", "bytes", True, -1),
    ]
    axes += [
        axis(c, f"{c} (samples/s, measured)", True, 1, fill=f"pred_{c}" if f"pred_{c}" in PREDICTED else None)
        for c in THROUGHPUT
    ]
    axes += [axis(f, f"{f} (samples/s, predicted)", True, 1, prediction=True) for f in PREDICTED]
    return axes


def _plotted(params) -> list[str]:
    """The fields the plot's points carry: the defaults, and the axes the URL names (x, y) with their fills."""
    axes = {a["name"]: a for a in plot_axes()}
    named = []
    for key in ("x", "y"):
        text = (params.get(key) or "").strip()
        if text and text not in axes:
            raise InvalidArgument(f"{key} must be one of {', '.join(axes)}, not {text[:40]!r}")
        named += [axes[text]] if text else []
    return list(dict.fromkeys([*PLOT_FIELDS, *(a["name"] for a in named), *(a["fill"] for a in named if a["fill"])]))


def columns() -> list[str]:
    return list(TABLE_COLUMNS)


def summary(info: ModelInfo) -> dict:
    """A model as one search row: every searchable field (the static page searches these) and the table's."""
    row = {f: getattr(info, f, None) for f in SEARCH_FIELDS if f != "short"}
    row["short"] = info.name.split("/", 1)[-1]  # the grammar's bare name; ModelInfo keeps it private
    row.update({c: getattr(info, c, None) for c in columns()})
    row["input_size"] = list(info.input_size) if info.input_size else None  # the plot says a point's size
    row.update({f: predicted(info, f) for f in PREDICTED})  # searched and plotted in the page like columns
    return row


@overload
def whole_number(params, key: str, default: int, low: int, high: int) -> int: ...
@overload
def whole_number(params, key: str, default: None, low: int, high: int) -> int | None: ...
def whole_number(params, key: str, default: int | None, low: int, high: int) -> int | None:
    """A query parameter that must be a whole number in [low, high]; absent or empty gives default."""
    text = (params.get(key) or "").strip()
    if not text:
        return default
    # ASCII digits only, no longer than the bound once leading zeros are gone (0001 is 1): str.isdigit() also
    # takes "²" (which int() refuses) and int() refuses more than 4,300 digits; both were a 500
    digits = text.lstrip("0") or "0"
    if not (text.isascii() and text.isdigit() and len(digits) <= len(str(high))) or not low <= int(digits) <= high:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidArgument(f"{key} must be a whole number from {low} to {high}, not {shown!r}")
    return int(digits)


def flag(params, key: str) -> bool:
    text = (params.get(key) or "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise InvalidArgument(f"{key} must be true or false, not {text!r}")


def search(zoo: Zoo, params) -> dict:
    """One search page: q (the grammar), sort ("params" or "-params"), page, per_page; fits (a hardware and a run, as
    `zoo search --fits` takes it): only the models whose plan fits, with their max_batch."""
    q = (params.get("q") or "").strip()
    fits = (params.get("fits") or "").strip() or None
    sort = (params.get("sort") or "").strip() or None
    page = whole_number(params, "page", 1, 1, 10**9)
    per_page = whole_number(params, "per_page", PER_PAGE, 1, MAX_PER_PAGE)
    if sort is not None:
        try:
            parse_sort(sort)
        except SearchSyntaxError as e:
            e.param = "sort"  # type: ignore[attr-defined]  # the parameter at fault, which error() reads
            raise
    # the numbers the search or its sort names are columns too (box_map>40 shows box_map), as `zoo search` adds them
    named = [f for f in render.named_numbers(q, sort) if f not in TABLE_COLUMNS]
    shown, plotted = [*columns(), *named], _plotted(params)
    wanted = list(dict.fromkeys([*shown, *plotted]))
    stored = [f for f in wanted if f not in PREDICTED and f not in MEASURED]
    read = list(dict.fromkeys([*stored, *FACETS, *(ROOFLINE_INPUTS if any(f in PREDICTED for f in wanted) else ())]))
    # just the fields shown and plotted: reading whole rows (ModelInfo) for every match is most of a search's time.
    # First the rows a large result shows (its sample, this page); a small one is all there is, and else the count
    # (SQL alone, up to MAX_RESULTS + 1) says whether to read every match or show the sample.
    wanted_rows = min(max(SAMPLE + 1, page * per_page), MAX_RESULTS)
    unplanned: list[str] = []
    if fits is not None:  # every match is planned: the ones that fit, as many as a page may show
        shown.append("max_batch")
        pairs, unplanned = zoo._search_fits(q or None, sort, MAX_RESULTS + 1, [*read, "max_batch"], fits)
        found = [row for row, _ in pairs]
        total = len(found)
    else:
        found = zoo.search(q or None, order_by=sort, limit=wanted_rows, fields=read)
        total = len(found)
    if fits is None and total == wanted_rows:
        total = max(zoo.count(q or None, limit=MAX_RESULTS + 1), total)  # not fewer than were read, writers aside
        if wanted_rows < total <= MAX_RESULTS:
            found = zoo.search(q or None, order_by=sort, limit=total, fields=read)
    more = total > MAX_RESULTS
    total = min(total, MAX_RESULTS)
    sampled = more  # then the plot and the facets are of the first SAMPLE in the table's order
    plotted_rows = found[:SAMPLE] if sampled else found
    for row in plotted_rows:  # the plot's points
        row.update({f: predicted(row, f) for f in plotted if f in PREDICTED})
    start = (page - 1) * per_page
    rows = found[start : start + per_page]
    for row in rows:  # the table's columns: this page
        row.update({f: predicted(row, f) for f in named if f in PREDICTED and f not in row})
    if any(f in MEASURED for f in named):
        from zoo.throughput.benchmark import fastest

        for field in (f for f in named if f in MEASURED):  # each model's best recorded run, as the search compares
            best = fastest(zoo, [r["name"] for r in rows], field)
            for row in rows:
                row[field] = best.get(row["name"])
    return {
        "q": q,
        "sort": sort,
        "page": page,
        "per_page": per_page,
        "total": total,
        "more": more,
        "pages": max(1, math.ceil(total / per_page)),
        "columns": shown,
        "rows": [{c: r[c] for c in shown} for r in rows],
        # of every match, or (sampled) of the first SAMPLE in the table's order, as the plot
        "facets": {f: Counter(r[f] for r in plotted_rows if r[f]).most_common() for f in FACETS},
        "points": [{f: r[f] for f in plotted} for r in plotted_rows],
        "sampled": sampled,
        "fits": fits,
        "unplanned": len(unplanned),  # matches that record no plan for this run (zoo plan NAME measures one)
        "axes": plot_axes(),
    }


def model(zoo: Zoo, name: str, params=None, whole: bool = False) -> dict:
    """Everything `zoo show NAME --tensors` prints (as label/text rows), the recorded fields, one page
    of the tensor table (tensor_page, tensor_per_page; whole: all of it, for files) and the snippets."""
    params = params or {}
    info = zoo.info(name, tensors=True)
    table = info.tensor_table or []
    per_page = whole_number(params, "tensor_per_page", TENSORS_PER_PAGE, 1, MAX_TENSORS_PER_PAGE)
    page = whole_number(params, "tensor_page", 1, 1, 10**9)
    if whole:
        page, per_page = 1, max(1, len(table))
    fields = info.as_dict()
    fields.pop("tensor_table", None)
    start = (page - 1) * per_page
    header, *rows = render.tensor_rows(table[start : start + per_page])  # just the page: a third of a model's time
    return {
        "name": info.name,
        "fields": fields,
        "show": [list(r) for r in render.info_rows(info)],
        "tensors": {
            "header": header,
            "rows": rows,
            "total": len(table),
            "page": page,
            "per_page": per_page,
            "pages": max(1, math.ceil(len(table) / per_page)),
        },
        "snippets": snippets(info),
    }


def snippets(info: ModelInfo) -> list[str]:
    weights = f", weights={json.dumps(info.weights[0]['tag'])}" if info.weights else ""
    lines = [f"import zoo\nm = zoo.get({json.dumps(info.name)}{weights})  # every tensor on meta until .materialize()"]
    if info.status == "ok" and family(info.family).BUILDS:
        lines += [
            f"zoo estimate {info.name} --batch 32 --dtype bf16 --training",
            f"zoo show {info.name} --tree --depth 2",
        ]
    return lines


def tree(zoo: Zoo, name: str) -> dict:
    """The module tree with params, bytes and output shapes per module (Zoo.scan, strict=False)."""
    info = zoo.info(name)
    result = zoo.scan(info.name, strict=False)
    modules = result.as_dict()["modules"]
    return {
        "name": info.name,
        "error": result.error,
        "outputs": result.outputs,
        "total": len(modules),
        "truncated": len(modules) > MAX_TREE_MODULES,
        "modules": modules[:MAX_TREE_MODULES],
    }


def estimate(zoo: Zoo, name: str, params) -> dict:
    """Zoo.estimate with batch, dtype, training, optimizer, seq_len, kv_dtype, weights_dtype, group_size and
    checkpointing from query parameters."""
    result = zoo.estimate(
        name,
        batch=whole_number(params, "batch", 1, 1, MAX_BATCH),
        dtype=(params.get("dtype") or "bf16").strip(),
        training=flag(params, "training"),
        optimizer=(params.get("optimizer") or "adamw").strip(),
        seq_len=whole_number(params, "seq_len", None, 1, MAX_SEQ_LEN),
        kv_dtype=(params.get("kv_dtype") or "").strip() or None,
        weights_dtype=(params.get("weights_dtype") or "").strip() or None,
        group_size=whole_number(params, "group_size", 128, 1, 1 << 20),
        checkpointing=flag(params, "checkpointing"),
    )
    return result.as_dict()


def catalog_index(zoo: Zoo) -> dict:
    """Every model as a search row, with the grammar's fields: the static catalog searches this in the page. A
    measured field (bench_cpu, ...) is each model's best recorded run, as the search compares and sorts it."""
    from zoo.throughput.benchmark import fastest

    rows = [summary(i) for i in zoo.search(None, limit=None)]
    for field in MEASURED:
        best = fastest(zoo, [r["name"] for r in rows], field)
        for row in rows:
            row[field] = best.get(row["name"])
    return {"fields": COMPARED, "columns": columns(), "axes": plot_axes(), "models": rows}


def error(e: Exception) -> tuple[int, dict]:
    """An exception as an HTTP status and a JSON body naming what to fix."""
    body = {"error": type(e).__name__, "message": str(e).split("\n")[0]}
    if isinstance(e, SearchSyntaxError):
        return 400, {**body, "param": getattr(e, "param", "q"), "expression": e.expression, "column": e.column}
    if isinstance(e, ModelNotFound):
        return 404, {**body, "name": e.name, "suggestions": e.suggestions}
    if isinstance(e, AmbiguousName):
        return 404, {**body, "name": e.name, "suggestions": e.candidates}
    if isinstance(e, (InvalidArgument, AnalysisError)):
        return 400, body
    if isinstance(e, (BuildFailed, NotBuildable, RegistryDrift)):
        return 422, body  # a real model that cannot be built here: nothing the request can change
    # a registry's messages name its file or server, which are the server's business, not the client's
    if isinstance(e, RegistryLocked):
        return 503, {**body, "message": "the registry is locked by a writer: try again in a few seconds"}
    if isinstance(e, RegistryError):
        return 500, {**body, "message": "the registry cannot be read: the server's log says why"}
    if isinstance(e, ZooError):
        return 500, body
    raise e
