// Small SVG charts: a time-series line chart and a grouped bar chart. Each returns an <svg> whose paths carry
// data-points (how many points were drawn), which the browser tests read. The y axis of both comes from yTicks on
// one of AXES (cores, memory, counts, ratios), so its labels are distinct and readable whatever the range.

import {bytes} from "./format.js";

const NS = "http://www.w3.org/2000/svg";
export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

// The y axis over [0, max]: a step of 1, 2 or 5 × 10^k `unit`s giving at most `count` intervals (and no smaller than
// `minStep`), ticks from 0 up to the first one at or above max. A range with nothing above zero is drawn up to
// `zeroTop` (0, 0.5, 1 units), a small one with its own step (0, 0.001, 0.002, 0.003 cores): never five equal labels.
// Returns {top, step, ticks} in the data's own numbers (ticks rounded to 12 significant digits).
export function yTicks(max, {unit = 1, zeroTop = unit, minStep = 0, count = 4} = {}) {
  const top = (Number.isFinite(max) && max > 0 ? max : zeroTop) / unit;
  const rough = top / count;
  const power = 10 ** Math.floor(Math.log10(rough));
  const nice = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough * (1 - 1e-9));
  const step = Math.max(nice, minStep / unit);
  const intervals = Math.max(1, Math.ceil(top / step - 1e-9));
  const round = (v) => Number(v.toPrecision(12));
  const ticks = Array.from({length: intervals + 1}, (_, i) => round(i * step * unit));
  return {top: ticks[intervals], step: round(step * unit), ticks};
}

// `value` with as many decimals as `step` needs, trailing zeros dropped: 0, 0.5, 1 or 0, 0.002, 0.004.
export function axisNumber(value, step) {
  const decimals = Math.min(20, Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  return String(Number(value.toFixed(decimals)));
}

// What the charts plot on their y axis: the unit its steps are nice numbers of, and the label of a tick.
export const AXES = {
  plain: {unit: 1, label: axisNumber},
  cores: {unit: 1000, label: (milli, step) => axisNumber(milli / 1000, step / 1000)}, // millicores, labelled in cores
  bytes: {unit: 2 ** 30, label: (b) => bytes(b)}, // steps of whole (or 0.1, 0.5 …) GiB
  count: {unit: 1, minStep: 1, label: axisNumber}, // jobs, nodes: whole numbers
  ratio: {unit: 0.01, label: (v, step) => `${axisNumber(v * 100, step * 100)}%`}, // 0.25 → 25%
};

function yAxis(svg, max, axis, {left, right, width, y}) {
  const {unit, zeroTop, minStep, label} = {...AXES.plain, ...axis};
  const {top, step, ticks} = yTicks(max, {unit, zeroTop, minStep});
  for (const v of ticks) {
    svg.append(el("line", {x1: left, x2: width - right, y1: y(v, top), y2: y(v, top), class: "grid"}));
    svg.append(el("text", {x: left - 4, y: y(v, top) + 4, class: "axis y-tick", "text-anchor": "end"}, label(v, step)));
  }
  return top;
}

function el(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function timeLabel(t, span) {
  const d = new Date(t * 1000);
  const hm = `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
  return span < 600 ? `${hm}:${String(d.getUTCSeconds()).padStart(2, "0")}` : hm;
}

// series: [{name, points: [[unixSeconds, value], ...], step?: bool}]; y: one of AXES (or {unit, zeroTop, minStep,
// label(value, step)}); yFormat(value) → a point's label in its tooltip.
export function lineChart(series, {width = 640, height = 200, y: axis = AXES.plain, yFormat = String, title = ""} = {}) {
  const pad = {left: 56, right: 12, top: title ? 22 : 8, bottom: 34};
  const svg = el("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart line-chart", role: "img"});
  if (title) svg.append(el("text", {x: pad.left, y: 14, class: "chart-title"}, title));
  const all = series.flatMap((s) => s.points.filter((p) => p[1] !== null && isFinite(p[1])));
  if (all.length === 0) {
    svg.append(el("text", {x: width / 2, y: height / 2, class: "chart-empty", "text-anchor": "middle"}, "no data yet"));
    svg.dataset.points = "0";
    return svg;
  }
  let t0 = Math.min(...all.map((p) => p[0]));
  let t1 = Math.max(...all.map((p) => p[0]));
  if (t1 === t0) { t0 -= 30; t1 += 30; }
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * innerW;
  const scaled = (v, top) => pad.top + innerH - (v / top) * innerH;
  const yMax = yAxis(svg, Math.max(...all.map((p) => p[1])), axis, {left: pad.left, right: pad.right, width, y: scaled});
  const y = (v) => scaled(v, yMax);
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    svg.append(el("text", {x: x(t), y: height - pad.bottom + 14, class: "axis", "text-anchor": "middle"}, timeLabel(t, t1 - t0)));
  }
  let legendX = pad.left;
  series.forEach((s, index) => {
    const color = s.color || COLORS[index % COLORS.length];
    const points = s.points.filter((p) => p[1] !== null && isFinite(p[1])).sort((a, b) => a[0] - b[0]);
    let d = "";
    points.forEach(([t, v], i) => {
      if (i === 0) d += `M${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      else if (s.step) d += `H${x(t).toFixed(1)}V${y(v).toFixed(1)}`;
      else d += `L${x(t).toFixed(1)},${y(v).toFixed(1)}`;
    });
    if (points.length === 1) d += `h1`; // one point still shows as a dot with round caps
    const path = el("path", {d, stroke: color, class: "series", "data-series": s.name, "data-points": points.length});
    svg.append(path);
    for (const [t, v] of points.length <= 60 ? points : []) {
      const dot = el("circle", {cx: x(t), cy: y(v), r: 2.5, fill: color});
      dot.append(el("title", {}, `${s.name} ${yFormat(v)} at ${new Date(t * 1000).toISOString()}`));
      svg.append(dot);
    }
    svg.append(el("rect", {x: legendX, y: height - 14, width: 10, height: 10, fill: color}));
    const label = el("text", {x: legendX + 14, y: height - 5, class: "legend"}, s.name);
    svg.append(label);
    legendX += 24 + 7 * s.name.length;
  });
  svg.dataset.points = String(all.length);
  return svg;
}

// groups: [{label, values: [{name, value}]}] drawn as clusters of bars; y: one of AXES (as lineChart's);
// yFormat(value) → a bar's label in its tooltip.
export function barChart(groups, {width = 640, height = 200, y: axis = AXES.plain, yFormat = String, title = ""} = {}) {
  const pad = {left: 56, right: 12, top: title ? 22 : 8, bottom: 34};
  const svg = el("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart bar-chart", role: "img"});
  if (title) svg.append(el("text", {x: pad.left, y: 14, class: "chart-title"}, title));
  const values = groups.flatMap((g) => g.values.map((v) => v.value)).filter((v) => v !== null && isFinite(v));
  if (values.length === 0) {
    svg.append(el("text", {x: width / 2, y: height / 2, class: "chart-empty", "text-anchor": "middle"}, "no data yet"));
    svg.dataset.points = "0";
    return svg;
  }
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const scaled = (v, top) => pad.top + innerH - (v / top) * innerH;
  const yMax = yAxis(svg, Math.max(...values), axis, {left: pad.left, right: pad.right, width, y: scaled});
  const y = (v) => scaled(v, yMax);
  const groupW = innerW / groups.length;
  const names = [...new Set(groups.flatMap((g) => g.values.map((v) => v.name)))];
  const barW = Math.max(2, (groupW * 0.8) / Math.max(names.length, 1));
  let drawn = 0;
  groups.forEach((group, gi) => {
    const gx = pad.left + gi * groupW + groupW * 0.1;
    group.values.forEach((item) => {
      if (item.value === null || !isFinite(item.value)) return;
      const ni = names.indexOf(item.name);
      const bar = el("rect", {
        x: gx + ni * barW, y: y(item.value), width: barW - 1, height: Math.max(0, y(0) - y(item.value)),
        fill: COLORS[ni % COLORS.length], class: "bar", "data-series": item.name,
      });
      bar.append(el("title", {}, `${group.label} ${item.name}: ${yFormat(item.value)}`));
      svg.append(bar);
      drawn++;
    });
    svg.append(el("text", {x: gx + groupW * 0.4, y: height - pad.bottom + 14, class: "axis", "text-anchor": "middle"},
      group.label));
  });
  let legendX = pad.left;
  names.forEach((name, ni) => {
    svg.append(el("rect", {x: legendX, y: height - 14, width: 10, height: 10, fill: COLORS[ni % COLORS.length]}));
    svg.append(el("text", {x: legendX + 14, y: height - 5, class: "legend"}, name));
    legendX += 24 + 7 * name.length;
  });
  svg.dataset.points = String(drawn);
  return svg;
}
