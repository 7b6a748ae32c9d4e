// The scatter beside the table, as plain SVG: x = GFLOPs or params (log scale), y = top-1 where the rows
// have published accuracy (linear), else the other size (log); one colour per family; the Pareto front
// (the best y for its cost: no other model is as cheap and at least as good) drawn as a line and listed.
import { el, human, svg } from "./format.js";

const WIDTH = 560, HEIGHT = 420, LEFT = 64, RIGHT = 16, TOP = 14, BOTTOM = 46;
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const LABELS = { flops: "GFLOPs (batch 1)", params: "parameters", top1: "top-1 (%)" };

export function axes(points, x) {
  const y = points.some((p) => p.top1 !== null && p.top1 !== undefined) ? "top1" : x === "flops" ? "params" : "flops";
  return { x, y, logY: y !== "top1" };
}

// Points sorted by cost; each one kept when it beats the best y of every cheaper (or equal) point.
export function paretoFront(points, x, y) {
  const sorted = [...points].sort((a, b) => a[x] - b[x] || b[y] - a[y]);
  const front = [];
  for (const p of sorted) if (!front.length || p[y] > front[front.length - 1][y]) front.push(p);
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

const value = (field, n) => (field === "flops" ? n / 1e9 : n);
// powers of ten: 0.01, 1, 100, 1K, 10M (GFLOPs and params alike)
const tickLabel = (field, n) => (field === "top1" || n < 1000 ? String(n) : human(n).replace(/\.00/, ""));
// the size a point's numbers are at (top1 and flops of a row are at its input_size)
export const atSize = (p) => (p.input_size ? ` at ${p.input_size.slice(-2).join("x")}` : "");
export const describe = (field, n) => (field === "flops" ? `${(n / 1e9).toFixed(2)} GFLOPs` : field === "top1" ? `${n}%` : `${human(n)} params`);

// Draws into `container`; returns {plotted, skipped, front}. onOpen(name) follows a click.
export function drawPlot(container, points, x, { tooltip, onOpen, legend }) {
  const { y, logY } = axes(points, x);
  const usable = points.filter((p) => p[x] > 0 && p[y] !== null && p[y] !== undefined && (!logY || p[y] > 0));
  container.replaceChildren();
  legend.replaceChildren();
  if (!usable.length) {
    container.append(el("p", { class: "empty" }, "nothing to plot: no row has both values"));
    return { plotted: [], skipped: points.length, front: [], y };
  }
  const sx = scale(usable.map((p) => value(x, p[x])), true, LEFT, WIDTH - RIGHT);
  const sy = scale(usable.map((p) => value(y, p[y])), logY, HEIGHT - BOTTOM, TOP);
  const chart = svg("svg", { id: "scatter", viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: WIDTH, height: HEIGHT, role: "img",
    "aria-label": `${LABELS[y]} against ${LABELS[x]}` });
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
    svg("text", { class: "axis-label", x: (LEFT + WIDTH - RIGHT) / 2, y: HEIGHT - 8, "text-anchor": "middle" }, LABELS[x]),
    svg("text", { class: "axis-label", x: 14, y: (TOP + HEIGHT - BOTTOM) / 2, "text-anchor": "middle",
      transform: `rotate(-90 14 ${(TOP + HEIGHT - BOTTOM) / 2})` }, LABELS[y]));

  const families = [...new Set(usable.map((p) => p.family))].sort();
  const colour = Object.fromEntries(families.map((f, i) => [f, PALETTE[i % PALETTE.length]]));
  const front = paretoFront(usable, x, y);
  chart.append(svg("polyline", { class: "front", fill: "none",
    points: front.map((p) => `${sx.at(value(x, p[x])).toFixed(1)},${sy.at(value(y, p[y])).toFixed(1)}`).join(" ") }));
  const marks = svg("g", { class: "marks" });
  for (const p of usable) {
    const cx = sx.at(value(x, p[x])), cy = sy.at(value(y, p[y]));
    const show = (event) => {
      tooltip.replaceChildren(el("strong", null, p.name), el("br"), `${describe(x, p[x])}, ${describe(y, p[y])}${atSize(p)}`);
      tooltip.hidden = false;
      const box = container.getBoundingClientRect();
      tooltip.style.left = `${event.clientX - box.left + 12}px`;
      tooltip.style.top = `${event.clientY - box.top + 12}px`;
    };
    marks.append(svg("circle", { class: "mark", cx: cx.toFixed(1), cy: cy.toFixed(1), r: 4, fill: colour[p.family],
      "data-name": p.name, tabindex: 0, onmouseenter: show, onmousemove: show,
      onmouseleave: () => { tooltip.hidden = true; }, onclick: () => onOpen(p.name),
      onkeydown: (e) => { if (e.key === "Enter") onOpen(p.name); } }, svg("title", null, p.name)));
  }
  chart.append(marks);
  container.append(chart);
  for (const f of families) {
    legend.append(el("span", { class: "key" }, svg("svg", { width: 10, height: 10 }, svg("circle", { cx: 5, cy: 5, r: 5, fill: colour[f] })), ` ${f}`));
  }
  legend.append(el("span", { class: "key" }, svg("svg", { width: 18, height: 10 }, svg("line", { class: "front", x1: 0, x2: 18, y1: 5, y2: 5 })), " Pareto front"));
  return { plotted: usable, skipped: points.length - usable.length, front, y };
}
