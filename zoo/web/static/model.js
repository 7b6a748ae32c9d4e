// The model page: what `zoo show` prints, copy-paste snippets, the estimate form (Zoo.estimate drawn as a
// stacked bar), the collapsible module tree (Zoo.scan) and the paged tensor table. Served, the model is
// embedded and the tree, tensor pages and estimates come from the JSON API; as static files everything
// comes from data/models/<file>.json, and estimates (which need torch) are left to the command.
import { apiHref, el, errorView, fileName, getJSON, human, pageData, svg } from "./format.js";

const data = pageData();
const mode = data.mode;
const $ = (id) => document.getElementById(id);
const PARTS = [["weights", "#4e79a7"], ["gradients", "#f28e2b"], ["optimizer_states", "#e15759"], ["inputs", "#76b7b2"],
  ["activations", "#59a14f"]];

function fail(body) {
  $("failure").replaceChildren(...errorView(body, mode));
  $("failure").hidden = false;
}

async function load() {
  if (mode === "server") return data.failure ? { failure: data.failure } : { model: data.model };
  const name = new URLSearchParams(location.search).get("name") || "";
  $("title").textContent = name;
  try {
    return await getJSON(`data/models/${fileName(name)}`);
  } catch (e) {
    return { failure: { message: `no model named '${name}' in this catalog`, ...(e.status === 404 ? {} : e.body || {}) } };
  }
}

function renderShow(model) {
  $("show").replaceChildren(...model.show.map(([label, text]) => el("tr", null, el("th", null, label), el("td", null, text))));
  $("snippets").replaceChildren(...model.snippets.map((text) => {
    const pre = el("pre", { class: "snippet" }, text);
    const copy = el("button", { type: "button", class: "copy", onclick: async () => {
      try { await navigator.clipboard.writeText(text); copy.textContent = "copied"; } catch {
        getSelection().selectAllChildren(pre); copy.textContent = "selected: Ctrl-C";
      }
    } }, "copy");
    return el("div", { class: "snippet-box" }, pre, copy);
  }));
}

function renderTensors(model, tensors) {
  $("tensors").replaceChildren(el("thead", null, el("tr", null, tensors.header.map((h) => el("th", null, h)))),
    el("tbody", null, tensors.rows.map((r) => el("tr", null, r.map((c) => el("td", null, c))))));
  $("tensor-note").textContent = `${tensors.total} tensors`;
  const go = async (page) => {
    if (mode === "server") {
      const answer = await getJSON(apiHref("models", model.name, { tensor_page: page, tensor_per_page: tensors.per_page }));
      renderTensors(model, answer.tensors);
    } else {
      const all = model.tensors;
      const per = 100, start = (page - 1) * per;
      renderTensors(model, { ...all, rows: all.rows.slice(start, start + per), page, per_page: per,
        pages: Math.max(1, Math.ceil(all.rows.length / per)) });
    }
  };
  const pager = [];
  if (tensors.page > 1) pager.push(el("button", { type: "button", onclick: () => go(tensors.page - 1) }, "\u2190 previous"));
  pager.push(el("span", null, ` page ${tensors.page} of ${tensors.pages} `));
  if (tensors.page < tensors.pages) pager.push(el("button", { type: "button", rel: "next", onclick: () => go(tensors.page + 1) }, "next \u2192"));
  $("tensor-pager").replaceChildren(...pager);
}

function label(m, root) {
  const shapes = m.outputs.slice(0, 4).map(([path, shape, dtype]) =>
    `${path ? `${path} ` : ""}${shape.join("x") || "scalar"}${dtype === "float32" ? "" : ` ${dtype}`}`).join("; ");
  const more = m.outputs.length > 4 ? `; ... ${m.outputs.length - 4} more` : "";
  const calls = m.calls > 1 ? ` x${m.calls}` : "";
  const out = m.calls ? (m.outputs.length ? `\u2192 ${shapes}${more}${calls}` : `\u2192 (no tensor output)${calls}`)
    : m.entered ? "(stopped inside)" : "(not called)";
  return [el("span", { class: "mod-name" }, m.name.split(".").pop() || root), " ", el("span", { class: "mod-type" }, m.type),
    ` ${human(m.params)} params, ${human(m.bytes, "B")} `, el("span", { class: m.calls ? "mod-out" : "mod-none" }, out)];
}

// Modules come in pre-order with their depth: a stack of open containers builds the nesting.
function renderTree(tree) {
  const root = el("div", { class: "tree" });
  const stack = [root];
  tree.modules.forEach((m, i) => {
    const parent = stack[m.depth] || stack[stack.length - 1];
    const hasChildren = i + 1 < tree.modules.length && tree.modules[i + 1].depth > m.depth;
    if (hasChildren) {
      const children = el("div", { class: "children" });
      parent.append(el("details", { class: "node", "data-module": m.name, open: m.depth === 0 },
        el("summary", null, label(m, tree.name)), children));
      stack.length = m.depth + 1;
      stack.push(children);
    } else {
      parent.append(el("div", { class: "node leaf", "data-module": m.name }, label(m, tree.name)));
    }
  });
  const notes = [];
  if (tree.error) notes.push(el("p", { class: "warning" }, tree.error.startsWith("this module has no recorded input")
    ? "no forward: " : "the forward stopped on meta: ", tree.error));
  if (tree.truncated) notes.push(el("p", { class: "warning" }, `the first ${tree.modules.length} of ${tree.total} modules`));
  $("tree").replaceChildren(...notes, root);
}

function setupTree(model, staticTree) {
  let loaded = false;
  $("tree-details").addEventListener("toggle", async () => {
    if (!$("tree-details").open || loaded) return;
    loaded = true;
    if (mode !== "server") {
      if (!staticTree) $("tree").replaceChildren(el("p", null, "not exported: run `zoo catalog --trees`, or ",
        el("code", null, `zoo show ${model.name} --tree`)));
      else if (staticTree.failure) $("tree").replaceChildren(...errorView(staticTree.failure, mode));
      else renderTree(staticTree);
      return;
    }
    $("tree").replaceChildren(el("p", { class: "loading" }, "running a forward on meta\u2026"));
    try { renderTree(await getJSON(apiHref("scan", model.name))); } catch (e) {
      $("tree").replaceChildren(...errorView(e.body || { message: String(e) }, mode));
    }
  });
  const setAll = (open) => $("tree").querySelectorAll("details").forEach((d) => { d.open = open; });
  $("tree-expand").addEventListener("click", () => setAll(true));
  $("tree-collapse").addEventListener("click", () => setAll(false));
}

function renderEstimate(result) {
  const scale = 600 / Math.max(1, result.upper_bound);
  const bar = svg("svg", { id: "estimate-bar", viewBox: "0 0 600 44", width: 600, height: 44, role: "img",
    "aria-label": "memory by part" });
  let x = 0;
  for (const [part, colour] of PARTS) {
    if (!result[part]) continue;
    const w = result[part] * scale;
    bar.append(svg("rect", { class: "seg", "data-part": part, x: x.toFixed(2), y: 4, width: Math.max(w, 0.5).toFixed(2),
      height: 28, fill: colour }, svg("title", null, `${part.replace("_", " ")}: ${human(result[part], "B")}`)));
    x += w;
  }
  if (result.total < result.upper_bound) {
    const at = (result.total * scale).toFixed(2);
    bar.append(svg("line", { class: "peak", x1: at, x2: at, y1: 0, y2: 40 }, svg("title", null, "measured peak")));
  }
  const mode_ = result.training ? `training, ${result.optimizer}` : "inference";
  $("estimate-result").replaceChildren(
    el("p", null, `batch ${result.batch}, ${result.dtype}, ${mode_}${result.seq_len ? `, seq_len ${result.seq_len}` : ""}: `,
      el("strong", { id: "estimate-total" }, human(result.total, "B")), " measured peak",
      result.total < result.upper_bound ? ` (parts add up to ${human(result.upper_bound, "B")}; the line marks the peak)` : ""),
    bar,
    el("ul", { class: "parts" }, PARTS.filter(([p]) => result[p]).map(([p, colour]) => el("li", null,
      svg("svg", { width: 10, height: 10 }, svg("rect", { width: 10, height: 10, fill: colour })),
      ` ${p.replace("_", " ")}: ${human(result[p], "B")}`))));
}

function setupEstimate(model) {
  const form = $("estimate-form");
  if (mode !== "server") {
    form.replaceWith(el("p", null, "Estimates run the model on meta and need zoo: ", el("code", null,
      `zoo estimate ${model.name} --batch 32 --dtype bf16 --training`), " (or serve this registry with zoo serve)."));
    return;
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const params = {};
    for (const [k, v] of new FormData(form)) if (v !== "") params[k] = v;
    $("estimate-result").replaceChildren(el("p", { class: "loading" }, "measuring on meta\u2026"));
    try { renderEstimate(await getJSON(apiHref("estimate", model.name, params))); } catch (e) {
      $("estimate-result").replaceChildren(...errorView(e.body || { message: String(e) }, mode));
    }
  });
}

const answer = await load();
if (answer.failure) fail(answer.failure);
else {
  const model = answer.model;
  document.title = `${model.name} - zoo catalog`;
  $("title").textContent = model.name;
  $("body").hidden = false;
  renderShow(model);
  setupEstimate(model);
  setupTree(model, answer.tree);
  if (mode === "server") renderTensors(model, model.tensors);
  else {
    const per = 100;
    renderTensors(model, { ...model.tensors, rows: model.tensors.rows.slice(0, per), page: 1, per_page: per,
      pages: Math.max(1, Math.ceil(model.tensors.rows.length / per)) });
  }
}
document.body.dataset.ready = "true"; // the tests wait for this
