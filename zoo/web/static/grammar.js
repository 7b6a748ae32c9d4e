// zoo's search grammar in the page, for the static catalog: the whole grammar of zoo/query.py
// (fields, < <= > >= = != ~, and/or/not, parentheses, quoted strings, 7B/350M/1.5GiB numbers),
// evaluated over the exported rows as zoo/registry/where.py compiles it to SQL: a comparison on a
// missing value is false, `~` is a case-insensitive glob, and on `name` it also matches the bare name.
// Errors carry the same 1-based column. Numbers are JS doubles: exact up to 2^53.

const MAX_LENGTH = 10000, MAX_DEPTH = 25, MAX_COMPARISONS = 200;
const OP_TOKENS = ["<=", ">=", "==", "!=", "<", ">", "=", "~"];
const KEYWORDS = ["and", "or", "not"];
const WORD = /[A-Za-z0-9_.\-/*?:+@]+/y;
const NUMBER = /^([+-]?(?:[0-9]+(?:_[0-9]+)*(?:\.(?:[0-9]+(?:_[0-9]+)*)?)?|\.[0-9]+(?:_[0-9]+)*)(?:[eE][+-]?[0-9]+)?)(k|K|M|G|T|B|kB|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$/;
const SUFFIXES = { k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, B: 1e9, kB: 1e3, KB: 1e3, MB: 1e6, GB: 1e9, TB: 1e12,
  KiB: 2 ** 10, MiB: 2 ** 20, GiB: 2 ** 30, TiB: 2 ** 40 };

export class SearchSyntaxError extends Error {
  constructor(message, expression = "", column = 0, param = "q") {
    super(message);
    Object.assign(this, { expression, column, param });
  }
  get body() {
    return { error: "SearchSyntaxError", message: this.message, expression: this.expression, column: this.column,
      param: this.param };
  }
}

const quote = (s) => `'${s}'`;

function tokenize(text) {
  const tokens = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (/\s/.test(c)) { i += 1; continue; }
    if (c === "(" || c === ")") { tokens.push({ kind: c, text: c, col: i + 1 }); i += 1; continue; }
    if (c === "'" || c === '"') {
      let out = "", j = i + 1;
      while (j < text.length && text[j] !== c) {
        if (text[j] === "\\" && j + 1 < text.length && (text[j + 1] === c || text[j + 1] === "\\")) j += 1;
        out += text[j];
        j += 1;
      }
      if (j >= text.length) throw new SearchSyntaxError(`unterminated string: expected a closing ${c}`, text, i + 1);
      tokens.push({ kind: "string", text: out, col: i + 1 });
      i = j + 1;
      continue;
    }
    WORD.lastIndex = i;
    const m = WORD.exec(text);
    if (m) { tokens.push({ kind: "word", text: m[0], col: i + 1 }); i += m[0].length; continue; }
    const op = OP_TOKENS.find((o) => text.startsWith(o, i));
    if (op) { tokens.push({ kind: "op", text: op, col: i + 1 }); i += op.length; continue; }
    throw new SearchSyntaxError(`unexpected character ${quote(c)}: expected a field, operator, value, parenthesis or quote`, text, i + 1);
  }
  tokens.push({ kind: "end", text: "", col: text.length + 1 });
  return tokens;
}

const describe = (t) => (t.kind === "end" ? "the end of the search" : t.kind === "string" ? `the string ${quote(t.text)}` : quote(t.text));

// One comparison's value, checked as zoo.query.check does; throws [message, atOp].
function check(fields, field, op, value) {
  if (fields[field] === "number") {
    if (op === "~") throw [`'~' (glob) works on string fields only, and ${field} is a number`, true];
    const m = NUMBER.exec(value);
    if (!m) throw [`expected a number for ${field} (such as 7B, 350M, 1.5GiB, 7e9), got ${quote(value)}`, false];
    const n = Number(m[1].replaceAll("_", "")) * (SUFFIXES[m[2]] || 1);
    if (!Number.isFinite(n) || (n !== 0 && (Math.abs(n) >= 1e301 || Math.abs(n) < 1e-300))) {
      throw [`number out of range for ${field}: ${quote(value)}`, false];
    }
    return n;
  }
  if (op === "~" && value.includes("[")) throw ["character classes ([...]) are not supported in globs: use * and ?", false];
  return value;
}

// Text -> {and|or: [...]}, {not: e} or {field, op, value}; precedence not > and > or.
export function parse(text, fields) {
  if (text.length > MAX_LENGTH) {
    throw new SearchSyntaxError(`search too long: ${text.length} characters, at most ${MAX_LENGTH}`, "", MAX_LENGTH + 1);
  }
  const tokens = tokenize(text);
  const names = Object.keys(fields).join(", ");
  let pos = 0, depth = 0, comparisons = 0;
  const fail = (message, tok) => { throw new SearchSyntaxError(message, text, tok.col); };
  const next = () => { const t = tokens[pos]; if (t.kind !== "end") pos += 1; return t; };
  const keyword = (word) => {
    const t = tokens[pos];
    if (t.kind === "word" && t.text.toLowerCase() === word) { pos += 1; return true; }
    return false;
  };
  const join = (kind, items) => (items.length === 1 ? items[0] : { [kind]: items.flatMap((i) => i[kind] || [i]) });
  const or = () => { const items = [and()]; while (keyword("or")) items.push(and()); return join("or", items); };
  const and = () => { const items = [unary()]; while (keyword("and")) items.push(unary()); return join("and", items); };
  const unary = () => {
    const tok = tokens[pos];
    const isNot = tok.kind === "word" && tok.text.toLowerCase() === "not";
    if (tok.kind !== "(" && !isNot) return comparison();
    depth += 1;
    if (depth > MAX_DEPTH) fail(`search nested too deeply: at most ${MAX_DEPTH} levels of parentheses and 'not'`, tok);
    pos += 1;
    let expr;
    if (isNot) expr = { not: unary() };
    else {
      expr = or();
      const close = next();
      if (close.kind !== ")") fail(`expected ')' to close the '(' at column ${tok.col}, got ${describe(close)}`, close);
    }
    depth -= 1;
    return expr;
  };
  const comparison = () => {
    const field = next();
    if (field.kind !== "word" || KEYWORDS.includes(field.text.toLowerCase())) {
      fail(`expected a comparison (a field such as 'params', '(' or 'not'), got ${describe(field)}`, field);
    }
    const name = field.text.toLowerCase();
    if (!(name in fields)) fail(`unknown field ${quote(field.text)}; fields are: ${names}`, field);
    const op = next();
    if (op.kind !== "op") fail(`expected an operator (${OP_TOKENS.join(" ")}) after ${quote(field.text)}, got ${describe(op)}`, op);
    const value = next();
    if (!(value.kind === "word" || value.kind === "string") || (value.kind === "word" && KEYWORDS.includes(value.text.toLowerCase()))) {
      const hint = value.kind === "word" ? ` (quote it, '${value.text}', to compare with the word)` : "";
      fail(`expected a value after ${quote(op.text)}, got ${describe(value)}${hint}`, value);
    }
    comparisons += 1;
    if (comparisons > MAX_COMPARISONS) fail(`too many comparisons: at most ${MAX_COMPARISONS}`, field);
    const opText = op.text === "==" ? "=" : op.text;
    try {
      return { field: name, op: opText, value: check(fields, name, opText, value.text) };
    } catch ([message, atOp]) {
      return fail(message, atOp ? op : value);
    }
  };
  if (tokens[0].kind === "end") fail("empty search: expected a comparison such as 'params < 7B'", tokens[0]);
  const expr = or();
  if (tokens[pos].kind !== "end") fail(`unexpected ${describe(tokens[pos])}: expected 'and', 'or' or the end of the search`, tokens[pos]);
  return expr;
}

// A glob as zoo/registry/where.py's LIKE reads it: * any run of characters, ? exactly one (a code point),
// every other character itself, ASCII letters' case ignored (SQLite's LIKE and lower(), PostgreSQL's ILIKE
// under COLLATE "C" fold ASCII only). Matched by the two-pointer walk that returns to the last '*' only,
// O(glob * text) at worst: a regular expression backtracks, and '*?*?*?*?*?*?*?*Q' froze the tab for seconds.
const foldAscii = (text) => Array.from(String(text), (c) => (c >= "A" && c <= "Z" ? c.toLowerCase() : c));

function globMatches(g, text) {  // g: the glob, folded
  const t = foldAscii(text);
  let i = 0, j = 0, star = -1, resume = 0;
  while (j < t.length) {
    if (i < g.length && g[i] === "*") { star = i; i += 1; resume = j; }
    else if (i < g.length && (g[i] === "?" || g[i] === t[j])) { i += 1; j += 1; }
    else if (star >= 0) { i = star + 1; resume += 1; j = resume; }  // let the last '*' take one more character
    else return false;
  }
  while (i < g.length && g[i] === "*") i += 1;
  return i === g.length;
}

const COMPARE = { "<": (a, b) => a < b, "<=": (a, b) => a <= b, ">": (a, b) => a > b, ">=": (a, b) => a >= b,
  "=": (a, b) => a === b, "!=": (a, b) => a !== b };

export function matches(expr, row) {
  if (expr.and) return expr.and.every((e) => matches(e, row));
  if (expr.or) return expr.or.some((e) => matches(e, row));
  if (expr.not) return !matches(expr.not, row);
  const v = row[expr.field];
  if (v === null || v === undefined) return false;
  if (expr.op !== "~") return COMPARE[expr.op](v, expr.value);
  expr.glob ||= foldAscii(expr.value);
  return globMatches(expr.glob, v) || (expr.field === "name" && !expr.value.startsWith("*") && row.short != null
    && globMatches(expr.glob, row.short));
}

// "params" or "-params" -> a comparator: missing values last either way, then by name (zoo's ORDER BY).
export function sorter(spec, fields) {
  const text = spec.trim();
  const descending = text.startsWith("-");
  const field = (descending ? text.slice(1) : text).toLowerCase();
  if (!(field in fields)) {
    const column = spec.length - spec.trimStart().length + 1 + (descending ? 1 : 0);
    throw new SearchSyntaxError(`cannot sort by '${descending ? text.slice(1) : text}': expected one of ${Object.keys(fields).join(", ")}`, spec, column, "sort");
  }
  const byName = (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  return (a, b) => {
    const x = a[field], y = b[field];
    const xm = x === null || x === undefined, ym = y === null || y === undefined;
    if (xm || ym) return xm && ym ? byName(a, b) : xm ? 1 : -1;
    const order = x < y ? -1 : x > y ? 1 : 0;
    return (descending ? -order : order) || byName(a, b);
  };
}

function wholeNumber(params, key, fallback, high) {
  const text = (params.get(key) || "").trim();
  if (!text) return fallback;
  if (!/^[0-9]+$/.test(text) || Number(text) < 1 || Number(text) > high) {
    throw { error: "InvalidArgument", message: `${key} must be a whole number from 1 to ${high}, not '${text}'` };
  }
  return Number(text);
}

// The answer zoo/web/views.py search() gives, computed here over the exported index.
export function search(index, params, perPageDefault = 50) {
  const q = (params.get("q") || "").trim();
  const sort = (params.get("sort") || "").trim() || null;
  const page = wholeNumber(params, "page", 1, 1e9);
  const perPage = wholeNumber(params, "per_page", perPageDefault, 200);
  for (const key of ["x", "y"]) {
    const text = (params.get(key) || "").trim();
    if (text && !index.axes.some((a) => a.name === text)) {
      throw { error: "InvalidArgument", message: `${key} must be one of ${index.axes.map((a) => a.name).join(", ")}, not '${text}'` };
    }
  }
  const order = sorter(sort || "name", index.fields);
  const expr = q ? parse(q, index.fields) : null;
  const found = index.models.filter((row) => !expr || matches(expr, row)).sort(order);
  const facets = {};
  for (const f of ["family", "task"]) {
    const counts = new Map();
    for (const row of found) if (row[f]) counts.set(row[f], (counts.get(row[f]) || 0) + 1);
    facets[f] = [...counts].sort((a, b) => b[1] - a[1]);
  }
  const start = (page - 1) * perPage;
  const pick = (row, keys) => Object.fromEntries(keys.map((k) => [k, row[k] ?? null]));
  // the numbers the search or its sort names are columns too, as zoo.render.named_numbers finds them
  const words = new Set(`${q} ${sort || ""}`.toLowerCase().match(/[a-z_0-9]+/g) || []);
  const columns = [...index.columns, ...Object.keys(index.fields).filter((f) =>
    index.fields[f] === "number" && words.has(f) && !index.columns.includes(f))];
  return {
    q, sort, page, per_page: perPage, total: found.length, more: false, sampled: false,
    pages: Math.max(1, Math.ceil(found.length / perPage)), columns,
    rows: found.slice(start, start + perPage).map((row) => pick(row, columns)),
    facets, axes: index.axes,
    points: found.map((row) => pick(row, ["name", "family", "input_size", ...index.axes.map((a) => a.name)])),
  };
}
