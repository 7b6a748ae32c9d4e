// The scatter beside the table, as plain SVG: any two numbers of the axes catalog (views.plot_axes: accuracy,
// cost, measured or predicted throughput); x GFLOPs and y top-1 (else the other size) unless the URL names them.
// One colour per family. A measured throughput with `fill` takes its predicted field where nothing was
// measured; every predicted value is drawn hollow and named a prediction. The Pareto front (no other point is
// at least as good on both axes and better on one, "good" being each axis's `better` direction) is drawn as a
// line and listed.
import { el, human, svg } from "./format.js";

const WIDTH = 560, HEIGHT = 420, LEFT = 64, RIGHT = 16, TOP = 14, BOTTOM = 46;
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const GIGA = new Set(["flops", "test_flops"]); // drawn in GFLOPs
const present = (v) => v !== null && v !== undefined;

// The axes the URL asks for (x, y), else the defaults; each an entry of the catalog.
export function chooseAxes(catalog, points, params) {
  const byName = Object.fromEntries(catalog.map((a) => [a.name, a]));
  const x = byName[params.get("x")] || byName.flops;
  const fallback = points.some((p) => present(p.top1)) ? "top1" : x.name === "flops" ? "params" : "flops";
  const y = byName[params.get("y")] || byName[fallback];
  return { x, y, fill: params.get("predicted") !== "0" };
}

// A point's value on an axis: {v, predicted} or null (a measured field without a measurement takes its fill).
export function valueOf(p, axis, fill) {
  if (present(p[axis.name])) return { v: p[axis.name], predicted: axis.predicted };
  if (fill && axis.fill && present(p[axis.fill])) return { v: p[axis.fill], predicted: true };
  return null;
}

// Best first on x (then on y); a point joins the front when its y beats every point before it.
export function paretoFront(points, x, y) {
  const sorted = [...points].sort((a, b) => (b.x - a.x) * x.better || (b.y - a.y) * y.better);
  const front = [];
  for (const p of sorted) if (!front.length || (p.y - front[front.length - 1].y) * y.better > 0) front.push(p);
  return front;
}

function scale(values, log, from, to) {
  const v = values.map((n) => (log ? Math.log10(n) : n));
  let lo = Math.min(...v), hi = Math.max(...v);
  if (log) { lo = Math.floor(lo); hi = Math.ceil(hi); } else { const pad = (hi - lo) * 0.05 || 1; lo -= pad; hi += pad; }
  if (hi === lo) { lo -= 1; hi += 1; }
  const at = (n) => from + ((log ? Math.log10(n) : n) - lo) / (hi - lo) * (to - from);
  let ticks;
  if (log) ticks = Array.from({ length: hi - lo + 1 }, (_, i) => 10 ** (lo + i));
  else {
    const step = 10 ** Math.floor(Math.log10((hi - lo) / 4));
    const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => (hi - lo) / s <= 6);
    ticks = [];
    for (let t = Math.ceil(lo / nice) * nice; t <= hi; t += nice) ticks.push(Number(t.toFixed(6)));
  }
  return { at, ticks };
}

const drawn = (axis, n) => (GIGA.has(axis.name) ? n / 1e9 : n);
// powers of ten: 0.01, 1, 100, 1K, 10M
const tickLabel = (axis, n) => (!axis.log || n < 1000 ? String(n) : human(n).replace(/\.00/, ""));
// the size a point's numbers are at (a row's numbers are at its input_size)
export const atSize = (p) => (p.input_size ? ` at ${p.input_size.slice(-2).join("x")}` : "");
export function describe(axis, n, predicted) {
  const text = GIGA.has(axis.name) ? `${(n / 1e9).toFixed(2)} GFLOPs` : axis.name === "params" ? `${human(n)} params`
    : axis.name === "bytes" ? human(n, "B") : axis.log ? `${Math.round(n)} samples/s ${axis.name}` : `${n}% ${axis.name}`;
  return predicted ? `${text} (predicted)` : text;
}

// Draws into `container`; returns {plotted, skipped, front, predicted}. onOpen(name) follows a click.
export function drawPlot(container, points, { x, y, fill }, { tooltip, onOpen, legend }) {
  const usable = [];
  for (const p of points) {
    const vx = valueOf(p, x, fill), vy = valueOf(p, y, fill);
    if (vx && vy && vx.v > 0 && (!y.log || vy.v > 0)) usable.push({ ...p, x: vx.v, y: vy.v, px: vx.predicted, py: vy.predicted });
  }
  container.replaceChildren();
  legend.replaceChildren();
  if (!usable.length) {
    container.append(el("p", { class: "empty" }, "nothing to plot: no row has both values"));
    return { plotted: [], skipped: points.length, front: [], predicted: 0 };
  }
  const sx = scale(usable.map((p) => drawn(x, p.x)), x.log, LEFT, WIDTH - RIGHT);
  const sy = scale(usable.map((p) => drawn(y, p.y)), y.log, HEIGHT - BOTTOM, TOP);
  const chart = svg("svg", { id: "scatter", viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: WIDTH, height: HEIGHT, role: "img",
    "aria-label": `${y.label} against ${x.label}` });
  const gridLines = svg("g", { class: "grid-lines" });
  for (const t of sx.ticks) {
    gridLines.append(svg("line", { x1: sx.at(t), x2: sx.at(t), y1: TOP, y2: HEIGHT - BOTTOM }),
      svg("text", { x: sx.at(t), y: HEIGHT - BOTTOM + 16, "text-anchor": "middle" }, tickLabel(x, t)));
  }
  for (const t of sy.ticks) {
    gridLines.append(svg("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: sy.at(t), y2: sy.at(t) }),
      svg("text", { x: LEFT - 6, y: sy.at(t) + 4, "text-anchor": "end" }, tickLabel(y, t)));
  }
  chart.append(gridLines,
    svg("text", { class: "axis-label", x: (LEFT + WIDTH - RIGHT) / 2, y: HEIGHT - 8, "text-anchor": "middle" }, x.label),
    svg("text", { class: "axis-label", x: 14, y: (TOP + HEIGHT - BOTTOM) / 2, "text-anchor": "middle",
      transform: `rotate(-90 14 ${(TOP + HEIGHT - BOTTOM) / 2})` }, y.label));

  const families = [...new Set(usable.map((p) => p.family))].sort();
  const colour = Object.fromEntries(families.map((f, i) => [f, PALETTE[i % PALETTE.length]]));
  const front = paretoFront(usable, x, y);
  chart.append(svg("polyline", { class: "front", fill: "none",
    points: front.map((p) => `${sx.at(drawn(x, p.x)).toFixed(1)},${sy.at(drawn(y, p.y)).toFixed(1)}`).join(" ") }));
  const marks = svg("g", { class: "marks" });
  let predictions = 0;
  for (const p of usable) {
    const cx = sx.at(drawn(x, p.x)), cy = sy.at(drawn(y, p.y));
    const guess = p.px || p.py;
    predictions += guess;
    const show = (event) => {
      tooltip.replaceChildren(el("strong", null, p.name), el("br"), `${describe(x, p.x, p.px)}, ${describe(y, p.y, p.py)}${atSize(p)}`);
      tooltip.hidden = false;
      const box = container.getBoundingClientRect();
      tooltip.style.left = `${event.clientX - box.left + 12}px`;
      tooltip.style.top = `${event.clientY - box.top + 12}px`;
    };
    // a prediction is a ring in its family's colour, a measurement a filled dot
    marks.append(svg("circle", { class: guess ? "mark predicted" : "mark", cx: cx.toFixed(1), cy: cy.toFixed(1), r: 4,
      fill: guess ? "none" : colour[p.family], color: colour[p.family], // zoo.css strokes a ring in `color`
      "pointer-events": "all", // a ring hovers on its inside too
      "data-name": p.name, tabindex: 0, onmouseenter: show, onmousemove: show,
      onmouseleave: () => { tooltip.hidden = true; }, onclick: () => onOpen(p.name),
      onkeydown: (e) => { if (e.key === "Enter") onOpen(p.name); } }, svg("title", null, guess ? `${p.name} (predicted)` : p.name)));
  }
  chart.append(marks);
  container.append(chart);
  for (const f of families) {
    legend.append(el("span", { class: "key" }, svg("svg", { width: 10, height: 10 }, svg("circle", { cx: 5, cy: 5, r: 5, fill: colour[f] })), ` ${f}`));
  }
  if (predictions) {
    legend.append(el("span", { class: "key", id: "predicted-key" }, svg("svg", { width: 10, height: 10 },
      svg("circle", { cx: 5, cy: 5, r: 4, fill: "none", stroke: "#555", "stroke-width": 1.5 })), " predicted (roofline), not measured"));
  }
  legend.append(el("span", { class: "key" }, svg("svg", { width: 18, height: 10 }, svg("line", { class: "front", x1: 0, x2: 18, y1: 5, y2: 5 })), " Pareto front"));
  return { plotted: usable, skipped: points.length - usable.length, front, predicted: predictions };
}
