// The quota trees: each quota's min / max / runtime / used / request (cpu and memory) indented under its parent,
// its pods and problems, and a what-if form (POST /api/v1/quotas/what-if: nothing is written) that shows how
// runtimes would move. Any quota event of the shown tree re-reads the tree (at most every 300 ms) and flashes the
// rows that changed, so a change made elsewhere appears without a reload.

import {api, events} from "./api.js";
import {AXES, barChart} from "./chart.js";
import {cores, h, parseQuantity, quantityText} from "./format.js";

const FIGURES = ["min", "max", "runtime", "used", "request"];
const REFRESH_MS = 300;

// Quotas in tree order: [{quota, depth}], roots first, children by name.
export function treeOrder(quotas) {
  const byName = new Map(quotas.map((q) => [q.name, q]));
  const roots = quotas.filter((q) => !q.parent || !byName.has(q.parent)).sort((a, b) => a.name.localeCompare(b.name));
  const out = [];
  const seen = new Set();
  const walk = (q, depth) => {
    if (seen.has(q.name)) return;
    seen.add(q.name);
    out.push({quota: q, depth});
    for (const child of [...q.children].sort()) if (byName.has(child)) walk(byName.get(child), depth + 1);
  };
  roots.forEach((q) => walk(q, 0));
  return out;
}

export function quotasPage(root, {signal, params}) {
  const tree = params[0] || "default";
  const picker = h("select", {id: "tree-picker"});
  const summary = h("p", {class: "muted", id: "tree-summary"});
  const table = h("div", {id: "quota-tree"});
  const chart = h("div", {class: "chart-box", id: "quota-chart"});
  const error = h("p", {class: "error", hidden: true});
  const whatIf = whatIfForm(signal);
  root.replaceChildren(
    h("h1", {}, "Quota trees"),
    h("div", {class: "toolbar"}, h("label", {}, "tree ", picker), summary),
    error,
    table,
    h("section", {}, h("h2", {}, "CPU runtime and used per quota"), chart),
    whatIf.root,
  );
  picker.addEventListener("change", () => { location.hash = `#/quotas/${encodeURIComponent(picker.value)}`; });
  const fail = (e) => {
    if (signal.aborted) return;
    error.hidden = false;
    error.textContent = e.message;
  };

  const previous = new Map();
  async function loadTree() {
    const answer = await api(`/api/v1/quota-trees/${encodeURIComponent(tree)}`, {signal});
    const ordered = treeOrder(answer.quotas);
    const firstLoad = previous.size === 0;
    whatIf.setQuotas(ordered.map((o) => o.quota.name));
    const rows = ordered.map(({quota: q, depth}) => {
      const key = JSON.stringify(FIGURES.map((f) => q[f]).concat([q.pods, q.problems]));
      const changed = !firstLoad && previous.get(q.name) !== key;
      previous.set(q.name, key);
      return h("tr", {"data-quota": q.name, class: changed ? "flash" : ""},
        h("td", {style: `padding-left:${0.5 + depth * 1.25}rem`}, q.children.length ? "▾ " : "• ", q.name),
        FIGURES.map((f) => h("td", {"data-figure": f}, quantityText((q[f] || {}).cpu, "cpu"))),
        FIGURES.map((f) => h("td", {"data-figure": `${f}-memory`}, quantityText((q[f] || {}).memory, "memory"))),
        h("td", {}, String(q.pods)),
        h("td", {class: q.problems.length ? "error" : ""}, q.problems.join("; ")));
    });
    table.replaceChildren(h("table", {class: "grid-table quota-table"},
      h("thead", {},
        h("tr", {}, h("th", {rowspan: 2}, "quota"), h("th", {colspan: FIGURES.length}, "cpu (cores)"),
          h("th", {colspan: FIGURES.length}, "memory"), h("th", {rowspan: 2}, "pods"), h("th", {rowspan: 2}, "problems")),
        h("tr", {}, FIGURES.map((f) => h("th", {}, f)), FIGURES.map((f) => h("th", {}, f)))),
      h("tbody", {}, rows)));
    summary.textContent = `${answer.quotas.length} quotas; total ${Object.entries(answer.total || {})
      .map(([r, v]) => `${r} ${quantityText(v, r)}`).join(", ") || "–"}` + (answer.problems && answer.problems.length
      ? `; problems: ${answer.problems.join("; ")}` : "");
    const bounded = (text) => {
      const v = parseQuantity(text, "cpu");
      return v === null || v >= 1e18 ? null : v;
    };
    chart.replaceChildren(barChart(ordered.map(({quota: q}) => ({
      label: q.name.length > 14 ? `${q.name.slice(0, 13)}…` : q.name,
      values: [
        {name: "min", value: bounded((q.min || {}).cpu)},
        {name: "runtime", value: bounded((q.runtime || {}).cpu)},
        {name: "used", value: bounded((q.used || {}).cpu) ?? 0},
      ],
    })), {width: 900, height: 200, y: AXES.cores, yFormat: cores}));
    root.dataset.loaded = "true";
    root.dataset.refreshes = String(Number(root.dataset.refreshes || 0) + 1);
  }

  async function loadTrees() {
    const answer = await api("/api/v1/quota-trees", {signal});
    const names = answer.items.map((t) => t.tree);
    if (!names.includes(tree)) names.push(tree);
    picker.replaceChildren(...names.sort().map((n) => h("option", {value: n, selected: n === tree}, n)));
  }

  let timer = 0;
  let running = false;
  let again = false;
  function refreshSoon() {
    if (timer) return;
    timer = setTimeout(async () => {
      timer = 0;
      if (running) { again = true; return; }
      running = true;
      try {
        await loadTree();
      } catch (e) {
        fail(e);
      } finally {
        running = false;
        if (again) { again = false; refreshSoon(); }
      }
    }, REFRESH_MS);
  }

  events({type: ["quota.status", "quota.tree", "quota.event"], tree}, signal, () => refreshSoon());
  Promise.all([loadTrees(), loadTree()]).catch(fail);
  const poll = setInterval(() => {
    if (document.body.dataset.stream !== "live") refreshSoon();
  }, 15000);
  signal.addEventListener("abort", () => { clearInterval(poll); clearTimeout(timer); });
}

function whatIfForm(signal) {
  const quota = h("select", {id: "whatif-quota"});
  const inputs = {};
  for (const [figure, resource] of [["min", "cpu"], ["max", "cpu"], ["min", "memory"], ["max", "memory"]]) {
    inputs[`${figure}.${resource}`] = h("input", {
      id: `whatif-${figure}-${resource}`, size: 8,
      placeholder: resource === "cpu" ? "e.g. 20" : "e.g. 64Gi",
    });
  }
  const result = h("div", {id: "whatif-result"});
  const button = h("button", {type: "submit"}, "what if?");
  const form = h("form", {class: "whatif"},
    h("label", {}, "quota ", quota),
    Object.entries(inputs).map(([key, input]) => h("label", {}, `${key.replace(".", " ")} `, input)),
    button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const spec = {};
    for (const [key, input] of Object.entries(inputs)) {
      const value = input.value.trim();
      if (!value) continue;
      const [figure, resource] = key.split(".");
      (spec[figure] ||= {})[resource] = value;
    }
    if (!quota.value || Object.keys(spec).length === 0) {
      result.replaceChildren(h("p", {class: "muted"}, "pick a quota and give at least one new min or max"));
      return;
    }
    button.disabled = true;
    try {
      const answer = await api("/api/v1/quotas/what-if", {method: "POST", body: {patch: {[quota.value]: {spec}}}, signal});
      result.replaceChildren(renderWhatIf(answer));
    } catch (e) {
      result.replaceChildren(h("p", {class: "error"}, e.message));
    } finally {
      button.disabled = false;
    }
  });
  return {
    root: h("section", {}, h("h2", {}, "What if (nothing is written)"),
      h("p", {class: "muted"}, "Quantities as in an ElasticQuota: cpu in cores (\"20\", \"500m\"), memory with a unit (\"64Gi\")."),
      form, result),
    setQuotas(names) {
      const keep = quota.value;
      quota.replaceChildren(...names.map((n) => h("option", {value: n, selected: n === keep}, n)));
    },
  };
}

// Per changed quota: runtime always, and every other figure whose value the change moves.
function renderWhatIf(answer) {
  const parts = [];
  if (answer.violations.length) {
    parts.push(h("ul", {class: "error"}, answer.violations.map((v) => h("li", {}, `${v.quota}: ${v.message}`))));
  }
  if (answer.changes.length === 0) parts.push(h("p", {class: "muted"}, "no quota would change"));
  else {
    const moved = (c) => FIGURES.flatMap((figure) => ["cpu", "memory"].map((resource) => {
      const before = (c.before[figure] || {})[resource];
      const after = (c.after[figure] || {})[resource];
      if (figure !== "runtime" && before === after) return null;
      if (figure === "runtime" && before === undefined && after === undefined) return null;
      return h("div", {"data-figure": `${figure}-${resource}`},
        `${figure} ${resource}: ${quantityText(before, resource)} → ${quantityText(after, resource)}`);
    })).filter(Boolean);
    parts.push(h("table", {class: "grid-table"},
      h("thead", {}, h("tr", {}, h("th", {}, "quota"), h("th", {}, "before → after"))),
      h("tbody", {}, answer.changes.map((c) => h("tr", {"data-quota": c.quota}, h("td", {}, c.quota), h("td", {}, moved(c)))))));
  }
  for (const note of answer.notes || []) parts.push(h("p", {class: "muted"}, note));
  return h("div", {}, parts);
}
