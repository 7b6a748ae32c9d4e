// The search page: the grammar in one box, the result set as a sortable, paged table, facets that
// narrow it (by adding `and family=X` to the search: the grammar stays the only query language) and
// the plot of the whole result set (of a large one's first rows, which the page says). Served, the answer
// is embedded in the page; as static files it is computed here by grammar.js over data/index.json. Every
// change is a plain link, so each view has a URL.
import { el, errorView, gflops, getJSON, human, modelHref, pageData, searchHref } from "./format.js";
import { search as searchLocal, SearchSyntaxError } from "./grammar.js";
import { atSize, chooseAxes, describe, drawPlot } from "./plot.js";

const data = pageData();
const mode = data.mode;
const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const HEADINGS = { name: "name", family: "family", task: "task", params: "params", flops: "GFLOPs", bytes: "bytes",
  top1: "top-1", license: "license", max_batch: "max batch" };
// every column beyond the default ones is a number the search or its sort names (box_map, bench_cpu, ...)
const numeric = (column) => ["params", "flops", "bytes", "top1", "max_batch"].includes(column) || !(column in HEADINGS);

function cell(column, value) {
  if (value === null || value === undefined) return "-";
  if (column === "params") return human(value);
  if (column === "bytes") return human(value, "B");
  if (column === "flops") return gflops(value);
  if (typeof value !== "number" || column in HEADINGS) return String(value);
  return column.startsWith("pred_") ? `${Math.round(value)} (predicted)` : String(Math.round(value * 100) / 100);
}

// q plus `and FIELD=VALUE`, parenthesized when q has an `or` that would otherwise bind looser.
function narrowed(q, field, value) {
  const v = /^[A-Za-z0-9_.\-/*?:+@]+$/.test(value) && !/^(and|or|not)$/i.test(value)
    ? value : `'${value.replaceAll("\\", "\\\\").replaceAll("'", "\\'")}'`;
  if (!q) return `${field}=${v}`;
  return /\bor\b/i.test(q) ? `(${q}) and ${field}=${v}` : `${q} and ${field}=${v}`;
}

function link(result, overrides) {
  return searchHref(mode, { q: result.q, sort: result.sort, fits: result.fits, x: params.get("x"), y: params.get("y"),
    predicted: params.get("predicted"), per_page: params.get("per_page"), ...overrides });
}

function renderTable(result) {
  const header = el("tr", null, result.columns.map((c) => {
    const next = result.sort === `-${c}` ? c : numeric(c) ? `-${c}` : result.sort === c ? `-${c}` : c;
    const arrow = result.sort === c ? " \u25b2" : result.sort === `-${c}` ? " \u25bc" : "";
    return el("th", { "data-col": c, class: numeric(c) ? "num" : null },
      el("a", { href: link(result, { sort: next, page: null }) }, HEADINGS[c] || c, arrow));
  }));
  const rows = result.rows.map((row) => el("tr", null, result.columns.map((c) => el("td",
    { "data-col": c, class: numeric(c) ? "num" : null },
    c === "name" ? el("a", { href: modelHref(mode, row.name) }, row.name) : cell(c, row[c])))));
  $("table").replaceChildren(el("thead", null, header), el("tbody", null, rows));
  const shown = result.total ? `${(result.page - 1) * result.per_page + 1}-${(result.page - 1) * result.per_page + result.rows.length}` : "0";
  const verb = result.fits ? `fit ${result.fits}` : "match";
  const unplanned = result.unplanned ? ` (${result.unplanned} matches record no plan for this run)` : "";
  $("summary").textContent = (result.total
    ? `${result.total}${result.more ? "+" : ""} models ${verb}; rows ${shown}`
    : `no models ${verb}`) + unplanned;
  const pager = [];
  if (result.page > 1) pager.push(el("a", { href: link(result, { page: result.page - 1 }), rel: "prev" }, "\u2190 previous"));
  pager.push(el("span", null, ` page ${result.page} of ${result.pages} `));
  if (result.page < result.pages) pager.push(el("a", { href: link(result, { page: result.page + 1 }), rel: "next" }, "next \u2192"));
  $("pager").replaceChildren(...pager);
}

// the server sends a sample of a result past its count (result.sampled): its first rows in the table's order
const sampleNote = (result) => `a sample: the first ${result.points.length} of ${result.total}${result.more ? "+" : ""} matches, in the table's order`;

function renderFacets(result) {
  const groups = Object.entries(result.facets).filter(([, values]) => values.length).map(([field, values]) =>
    el("div", { class: "facet", "data-facet": field }, el("h3", null, field),
      el("ul", null, values.map(([value, n]) => el("li", null,
        el("a", { href: link(result, { q: narrowed(result.q, field, value), page: null }) }, value), ` ${n}`)))));
  // a large result's facets count its sample (the plot's points), not every match: say so
  const note = result.sampled ? [el("p", { id: "facet-note", class: "note" }, sampleNote(result))] : [];
  $("facets").replaceChildren(...note, ...groups);
}

function renderPlot(result) {
  const axes = chooseAxes(result.axes, result.points, params);
  for (const [id, chosen] of [["plot-x", axes.x], ["plot-y", axes.y]]) {
    $(id).replaceChildren(...result.axes.map((a) => el("option", { value: a.name }, a.label)));
    $(id).value = chosen.name;
  }
  $("plot-predicted").checked = axes.fill;
  const drawn = drawPlot($("plot"), result.points, axes, { tooltip: $("tooltip"), legend: $("legend"),
    onOpen: (name) => { location.href = modelHref(mode, name); } });
  const notes = [];
  if (result.sampled) notes.push(sampleNote(result));
  if (drawn.skipped) notes.push(`${drawn.skipped} not plotted (no ${axes.x.name} or ${axes.y.name} recorded)`);
  $("plot-note").textContent = notes.join("; ");
  $("front-note").textContent = drawn.front.length ? `(best ${axes.y.name} for its ${axes.x.name})` : "";
  $("front").replaceChildren(...drawn.front.map((p) => el("li", { "data-name": p.name, class: p.px || p.py ? "predicted" : null },
    el("a", { href: modelHref(mode, p.name) }, p.name),
    ` ${describe(axes.x, p.x, p.px)}, ${describe(axes.y, p.y, p.py)}${atSize(p)}`)));
}

function showError(body) {
  $("error").replaceChildren(...errorView(body, mode));
  $("error").hidden = false;
  if (body.param !== "sort" && body.column) {
    const box = $("q");
    box.classList.add("invalid");
    box.focus();
    box.setSelectionRange(body.column - 1, body.column - 1);
  }
}

async function answer() {
  if (mode === "server") return data.failure ? { failure: data.failure } : { result: data.search };
  try {
    return { result: searchLocal(await getJSON("data/index.json"), params) };
  } catch (e) {
    return { failure: e instanceof SearchSyntaxError ? e.body : e.body || (e.message ? { message: e.message } : e) };
  }
}

const { result, failure } = await answer();
$("q").value = params.get("q") || "";
$("sort").value = params.get("sort") || "";
$("sort").disabled = !$("sort").value; // no empty sort= in the URL
$("fits").value = params.get("fits") || "";
$("fits").hidden = mode !== "server"; // a plan needs zoo's planner: the static catalog searches without it
$("search-form").addEventListener("submit", () => { $("fits").disabled = !$("fits").value.trim(); });
if (failure) {
  showError(failure);
  $("summary").textContent = "no search ran";
  $("plot-panel").hidden = true;
} else {
  renderFacets(result);
  renderTable(result);
  renderPlot(result);
  // a new axis may need numbers the page was not sent: each choice is a link, as every other view is
  for (const id of ["plot-x", "plot-y"]) {
    $(id).addEventListener("change", () => { location.href = link(result, { [id.slice(5)]: $(id).value }); });
  }
  $("plot-predicted").addEventListener("change", () => {
    location.href = link(result, { predicted: $("plot-predicted").checked ? null : "0" });
  });
}
document.body.dataset.ready = "true"; // the tests wait for this
