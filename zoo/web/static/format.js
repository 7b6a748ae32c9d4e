// What both pages share: numbers as zoo's CLI prints them (zoo/render.py), DOM building through
// text nodes only (registry values are untrusted: never innerHTML), the page's embedded data, and links
// that differ between the server (/model/NAME) and the static catalog (model.html?name=NAME).

export function human(n, unit = "") {
  if (n === null || n === undefined) return "-";
  if (unit === "B") {
    for (const [suffix, size] of [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (n >= size) return `${(n / size).toFixed(1)} ${suffix}`;
    }
    return `${n} B`;
  }
  for (const [suffix, size] of [["T", 1e12], ["B", 1e9], ["M", 1e6], ["K", 1e3]]) {
    if (n >= size) return `${(n / size).toFixed(2)}${suffix}`;
  }
  return String(n);
}

export function gflops(n) {
  return n === null || n === undefined ? "-" : (n / 1e9).toFixed(2);
}

const SVG_NS = "http://www.w3.org/2000/svg";

function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function pageData() {
  return JSON.parse(document.getElementById("zoo-data").textContent);
}

const pathOf = (name) => name.split("/").map(encodeURIComponent).join("/");

export function modelHref(mode, name) {
  return mode === "server" ? `/model/${pathOf(name)}` : `model.html?name=${encodeURIComponent(name)}`;
}

export function searchHref(mode, params) {
  const kept = Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== "");
  const query = new URLSearchParams(kept).toString();
  return (mode === "server" ? "/" : "index.html") + (query ? `?${query}` : "");
}

export function apiHref(kind, name, params = {}) {
  const query = new URLSearchParams(params).toString();
  return `/api/${kind}/${pathOf(name)}${query ? `?${query}` : ""}`;
}

// zoo/web/export.py file_name: each byte outside [A-Za-z0-9-] as _XX, in folders of 120 characters.
export function fileName(name) {
  let out = "";
  for (const b of new TextEncoder().encode(name)) {
    const c = String.fromCharCode(b);
    out += /[A-Za-z0-9-]/.test(c) ? c : `_${b.toString(16).padStart(2, "0")}`;
  }
  return `${out.match(/.{1,120}/g).join("/")}.json`;
}

// fetch JSON; a non-2xx answer throws {status, body} with zoo's typed error body.
export async function getJSON(url) {
  const response = await fetch(url);
  let body;
  try {
    body = await response.json();
  } catch {
    body = { error: "HTTPError", message: `${response.status} ${response.statusText} from ${url}` };
  }
  if (!response.ok) throw { status: response.status, body };
  return body;
}

// An error body as a paragraph, with the expression and a caret under the column for syntax errors.
export function errorView(body, mode) {
  const parts = [el("p", { class: "message" }, body.message || String(body))];
  if (body.column && body.expression) {
    parts.push(el("pre", { class: "caret" }, `${body.expression}\n${" ".repeat(body.column - 1)}^ (column ${body.column})`));
  }
  if (body.suggestions && body.suggestions.length) {
    parts.push(el("p", null, "did you mean ",
      body.suggestions.map((s, i) => [i ? ", " : "", el("a", { href: modelHref(mode, s) }, s)]), "?"));
  }
  return parts;
}
