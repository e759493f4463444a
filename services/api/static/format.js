// Number and time formatting shared by the pages, plus a tiny DOM builder.

export const UNLIMITED = 1e18; // a quota max of "1844674407370955161" (MaxInt64 / 5) means unlimited

export function cores(milli) {
  if (milli === null || milli === undefined) return "–";
  if (milli >= UNLIMITED) return "∞";
  const c = milli / 1000;
  return c >= 100 ? c.toFixed(0) : c >= 10 ? c.toFixed(1) : c.toFixed(2);
}

export function bytes(b) {
  if (b === null || b === undefined) return "–";
  if (b >= UNLIMITED) return "∞";
  const units = ["B", "Ki", "Mi", "Gi", "Ti", "Pi"];
  let v = b;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v >= 100 || i === 0 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1)}${units[i]}`;
}

export function percent(part, whole) {
  if (part === null || part === undefined || !whole) return "–";
  return `${((100 * part) / whole).toFixed(0)}%`;
}

export function ago(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.max(0, seconds);
  if (s < 120) return `${s.toFixed(0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function clock(unixSeconds) {
  if (!unixSeconds) return "–";
  const d = new Date(unixSeconds * 1000);
  return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

// Kubernetes quantity strings from the quota routes ("2", "500m", "4Gi", "1844674407370955161") → numbers:
// cpu in millicores, anything else in base units.
const SUFFIX = {
  n: 1e-9, u: 1e-6, m: 1e-3, "": 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
};
export function parseQuantity(text, resource) {
  if (text === null || text === undefined || text === "") return null;
  const match = /^([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([a-zA-Z]*)$/.exec(String(text));
  if (!match || !(match[2] in SUFFIX)) return null;
  const value = Number(match[1]) * SUFFIX[match[2]];
  return resource === "cpu" ? value * 1000 : value;
}

export function quantityText(text, resource) {
  const v = parseQuantity(text, resource);
  if (v === null) return "–";
  return resource === "cpu" ? cores(v) : resource === "memory" ? bytes(v) : String(text);
}

// h("div", {class: "x", onclick: f}, child, "text", [more]) → Element
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}
