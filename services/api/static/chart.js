// Small SVG charts: a time-series line chart and a grouped bar chart. Each returns an <svg> whose paths carry
// data-points (how many points were drawn), which the browser tests read.

const NS = "http://www.w3.org/2000/svg";
export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

function el(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function timeLabel(t, span) {
  const d = new Date(t * 1000);
  const hm = `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
  return span < 600 ? `${hm}:${String(d.getUTCSeconds()).padStart(2, "0")}` : hm;
}

// series: [{name, points: [[unixSeconds, value], ...], step?: bool}]; yFormat(value) → label.
export function lineChart(series, {width = 640, height = 200, yFormat = String, title = ""} = {}) {
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
  const yMax = niceMax(Math.max(...all.map((p) => p[1])));
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * innerW;
  const y = (v) => pad.top + innerH - (v / yMax) * innerH;
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    svg.append(el("line", {x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "grid"}));
    svg.append(el("text", {x: pad.left - 4, y: y(v) + 4, class: "axis", "text-anchor": "end"}, yFormat(v)));
  }
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

// groups: [{label, values: [{name, value}]}] drawn as clusters of bars; yFormat(value) → label.
export function barChart(groups, {width = 640, height = 200, yFormat = String, title = ""} = {}) {
  const pad = {left: 56, right: 12, top: title ? 22 : 8, bottom: 34};
  const svg = el("svg", {viewBox: `0 0 ${width} ${height}`, class: "chart bar-chart", role: "img"});
  if (title) svg.append(el("text", {x: pad.left, y: 14, class: "chart-title"}, title));
  const values = groups.flatMap((g) => g.values.map((v) => v.value)).filter((v) => v !== null && isFinite(v));
  if (values.length === 0) {
    svg.append(el("text", {x: width / 2, y: height / 2, class: "chart-empty", "text-anchor": "middle"}, "no data yet"));
    svg.dataset.points = "0";
    return svg;
  }
  const yMax = niceMax(Math.max(...values));
  const innerW = width - pad.left - pad.right;
  const innerH = height - pad.top - pad.bottom;
  const y = (v) => pad.top + innerH - (v / yMax) * innerH;
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    svg.append(el("line", {x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "grid"}));
    svg.append(el("text", {x: pad.left - 4, y: y(v) + 4, class: "axis", "text-anchor": "end"}, yFormat(v)));
  }
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
