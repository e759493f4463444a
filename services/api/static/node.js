// One node: its NodeMetric percentiles (now, per aggregation window, and over time from the event history), its
// batch/mid allocatable over time with each change's explanation, the prod predictor's peak and reclaimable next to
// prod usage and mid allocatable (with the newest prediction explained), its pressure stall (PSI: koordbus's own
// field of each report, absent where the node's kernel has none), and what its agent changed (actuations).
// New events for the node are appended as they arrive.

import {ApiError, api, events} from "./api.js";
import {AXES, barChart, lineChart} from "./chart.js";
import {ago, bytes, clock, cores, h, parseQuantity} from "./format.js";

const STATS = ["avg", "p50", "p90", "p95", "p99"];
const HISTORY_SECONDS = 3 * 3600;
const HISTORY_LIMIT = 1000;
const BATCH = ["kubernetes.io/batch-cpu", "kubernetes.io/mid-cpu"];
const BATCH_MEMORY = ["kubernetes.io/batch-memory", "kubernetes.io/mid-memory"];

const gib = (v) => bytes(v);
const coresLabel = (v) => cores(v);
const short = (name) => name.replace("kubernetes.io/", "");

// A NodeMetricComputed (event data, snake_case, integer amounts) → [time, {duration: {stat: {cpu, memory}}}]
export function percentilesOf(data) {
  const out = {};
  for (const aggregate of ((data.status || {}).node_metric || {}).aggregated_node_usages || []) {
    const byStat = {};
    for (const [stat, usage] of Object.entries(aggregate.usage || {})) byStat[stat] = (usage || {}).resources || {};
    out[aggregate.duration_seconds] = byStat;
  }
  return [data.report_time, out];
}

// A NodeMetricComputed → [time, {prod: {cpu, memory}, peak, reclaimable}]: the prod pods' usage summed, and the
// predictor's prodPeak and prodReclaimable (null before its first round or, for the peak, when it failed).
export function predictionOf(data) {
  const status = data.status || {};
  const prod = {cpu: 0, memory: 0};
  for (const pod of status.pods_metric || []) {
    if (pod.priority !== "koord-prod") continue;
    const usage = (pod.pod_usage || {}).resources || {};
    prod.cpu += usage.cpu || 0;
    prod.memory += usage.memory || 0;
  }
  const resourcesOf = (map) => (map && map.resources && Object.keys(map.resources).length ? map.resources : null);
  return [data.report_time, {prod, peak: resourcesOf(status.prod_peak), reclaimable: resourcesOf(status.prod_reclaimable)}];
}

// A NodeMetricComputed → [time, psi]: the node's and its pods' average stall ratios over the aggregate window
// (schemas/psi.py PsiMetric), null when the node's agent sent no PSI.
export function psiOf(data) {
  return [data.report_time, data.psi || null];
}

const percent = (v) => (v == null ? "—" : `${(v * 100).toFixed(1)}%`);
const PSI_SIGNALS = ["cpu_some", "memory_some", "memory_full", "io_some", "io_full"];

// The NodeMetric object of the REST API (Koordinator's shape: quantity strings, "30m0s") → the same point shape.
export function percentilesOfObject(metric) {
  const out = {};
  for (const aggregate of metric.status.nodeMetric.aggregatedNodeUsages || []) {
    const byStat = {};
    for (const [stat, usage] of Object.entries(aggregate.usage || {})) {
      const resources = (usage || {}).resources || {};
      byStat[stat] = {cpu: parseQuantity(resources.cpu, "cpu"), memory: parseQuantity(resources.memory, "memory")};
    }
    out[durationSeconds(aggregate.duration)] = byStat;
  }
  return [Date.parse(metric.status.updateTime) / 1000, out];
}

function durationSeconds(text) {
  let total = 0;
  for (const [, n, unit] of String(text).matchAll(/([0-9.]+)(h|m|s)/g)) total += Number(n) * {h: 3600, m: 60, s: 1}[unit];
  return total;
}

export function nodePage(root, {signal, params}) {
  const node = params[0];
  const state = {points: [], predictions: [], psi: [], decisions: [], actuations: [], current: null, explained: null};
  const header = h("div", {class: "node-header"});
  const nowCharts = h("div", {class: "chart-row", id: "node-percentiles-now"});
  const timeCharts = h("div", {class: "chart-row", id: "node-percentiles-history"});
  const historyNote = h("p", {class: "muted", id: "history-note"});
  const batchCharts = h("div", {class: "chart-row", id: "node-batch-history"});
  const predictionCharts = h("div", {class: "chart-row", id: "node-prediction-history"});
  const explained = h("div", {id: "node-prediction"});
  const psiCharts = h("div", {class: "chart-row", id: "node-psi"});
  const psiPods = h("div", {id: "node-psi-pods"});
  const decisions = h("div", {id: "node-decisions"});
  const actuations = h("div", {id: "node-actuations"});
  const error = h("p", {class: "error", hidden: true});
  root.replaceChildren(
    h("p", {}, h("a", {href: "#/"}, "← overview")),
    h("h1", {}, "Node ", h("code", {}, node)),
    error,
    header,
    h("section", {}, h("h2", {}, "Usage percentiles now (NodeMetric)"), nowCharts),
    h("section", {}, h("h2", {}, "Usage percentiles over time (30-minute window)"), historyNote, timeCharts),
    h("section", {}, h("h2", {}, "Batch and mid allocatable over time"), batchCharts,
      h("h3", {}, "Changes and why"), decisions),
    h("section", {}, h("h2", {}, "Prod usage, predicted peak and reclaimable, and mid allocatable"), predictionCharts,
      h("h3", {}, "The newest prediction"), explained),
    h("section", {}, h("h2", {}, "Pressure stall (PSI), averaged over each report's window"), psiCharts,
      h("h3", {}, "Pods stalled most on CPU in the newest report"), psiPods),
    h("section", {}, h("h2", {}, "Actuations on the node"), actuations),
  );
  const fail = (e) => {
    if (signal.aborted) return;
    error.hidden = false;
    error.textContent = e.message;
  };

  function renderNow() {
    const metric = state.current;
    if (!metric) {
      nowCharts.replaceChildren(h("p", {class: "muted"}, "no NodeMetric yet"));
      return;
    }
    const aggregates = metric.status.nodeMetric.aggregatedNodeUsages || [];
    const groups = (resource) => aggregates.map((a) => ({
      label: a.duration,
      values: STATS.map((stat) => ({name: stat, value: parseQuantity(((a.usage[stat] || {}).resources || {})[resource], resource)})),
    }));
    nowCharts.replaceChildren(
      h("div", {class: "chart-box", "data-chart": "cpu-now"},
        barChart(groups("cpu"), {title: "cpu (cores)", y: AXES.cores, yFormat: coresLabel, width: 460})),
      h("div", {class: "chart-box", "data-chart": "memory-now"},
        barChart(groups("memory"), {title: "memory", y: AXES.bytes, yFormat: gib, width: 460})),
    );
  }

  function renderHistory() {
    const points = state.points;
    const window = Math.max(...points.flatMap(([, byDuration]) => Object.keys(byDuration).map(Number)), 0);
    const series = (resource) => ["avg", "p50", "p95", "p99"].map((stat) => ({
      name: stat,
      points: points.map(([t, byDuration]) => [t, ((byDuration[window] || {})[stat] || {})[resource] ?? null]),
    }));
    timeCharts.replaceChildren(
      h("div", {class: "chart-box", "data-chart": "cpu-history"},
        lineChart(series("cpu"), {title: "cpu (cores)", y: AXES.cores, yFormat: coresLabel, width: 460})),
      h("div", {class: "chart-box", "data-chart": "memory-history"},
        lineChart(series("memory"), {title: "memory", y: AXES.bytes, yFormat: gib, width: 460})),
    );
  }

  function renderBatch() {
    const items = [...state.decisions].reverse(); // oldest first
    const series = (names) => names.map((name) => ({
      name: short(name),
      step: true,
      points: items.map((d) => [Date.parse(d.computedAt) / 1000, (d.resources[name] || {}).value ?? null]),
    }));
    batchCharts.replaceChildren(
      h("div", {class: "chart-box", "data-chart": "batch-cpu"},
        lineChart(series(BATCH), {title: "batch / mid cpu (cores)", y: AXES.cores, yFormat: coresLabel, width: 460})),
      h("div", {class: "chart-box", "data-chart": "batch-memory"},
        lineChart(series(BATCH_MEMORY), {title: "batch / mid memory", y: AXES.bytes, yFormat: gib, width: 460})),
    );
    const changes = state.decisions.filter((d) => d.changes.length || d.outcome !== "computed").slice(0, 50);
    decisions.replaceChildren(changes.length === 0
      ? h("p", {class: "muted"}, state.decisions.length ? "no changes in the kept history" : "no batch/mid decisions for this node")
      : h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, h("th", {}, "time"), h("th", {}, "outcome"), h("th", {}, "trigger"),
          h("th", {}, "what changed and why"))),
        h("tbody", {}, changes.map((d) => h("tr", {},
          h("td", {}, d.computedAt.replace("T", " ")),
          h("td", {}, d.outcome, d.reason ? h("div", {class: "muted"}, d.reason) : null),
          h("td", {}, d.trigger.join(", ")),
          h("td", {}, d.changes.map((c) => h("div", {class: "change"},
            h("b", {}, short(c.resource)), " ",
            `${fmt(c.resource, c.previous)} → ${fmt(c.resource, c.value)}`,
            h("div", {class: "formula"}, c.explanation.message || c.explanation.formula || c.explanation.reason || ""),
          ))),
        )))));
  }

  function renderPrediction() {
    const points = state.predictions;
    const mid = [...state.decisions].reverse();
    const series = (resource, midName) => [
      {name: "prod usage", points: points.map(([t, p]) => [t, p.prod[resource]])},
      {name: "prod peak", points: points.map(([t, p]) => [t, p.peak ? p.peak[resource] ?? null : null])},
      {name: "reclaimable", points: points.map(([t, p]) => [t, p.reclaimable ? p.reclaimable[resource] ?? null : null])},
      {name: short(midName), step: true,
        points: mid.map((d) => [Date.parse(d.computedAt) / 1000, (d.resources[midName] || {}).value ?? null])},
    ];
    predictionCharts.replaceChildren(
      h("div", {class: "chart-box", "data-chart": "prediction-cpu"},
        lineChart(series("cpu", "kubernetes.io/mid-cpu"), {title: "prod and mid cpu (cores)", y: AXES.cores, yFormat: coresLabel, width: 460})),
      h("div", {class: "chart-box", "data-chart": "prediction-memory"},
        lineChart(series("memory", "kubernetes.io/mid-memory"), {title: "prod and mid memory", y: AXES.bytes, yFormat: gib, width: 460})),
    );
    const view = state.explained;
    if (!view) {
      explained.replaceChildren(h("p", {class: "muted"}, "no prediction models for this node yet"));
      return;
    }
    const pods = ((view.explanation || {}).predictors || {}).podReclaimablePredictor?.pods || [];
    const unusual = pods.filter((p) => p.outcome !== "predicted");
    const errors = Object.values((view.explanation || {}).errors || {}).concat((view.explanation || {}).podErrors || []);
    const amount = (r) => (r ? `${cores(r.cpu)} cores, ${bytes(r.memory)}` : "—");
    explained.replaceChildren(...[
      h("p", {}, `reclaimable ${amount(view.reclaimable)}; peak ${amount(view.peak)}; `,
        `${view.models.length} models trained until ${view.trainedUntil ? clock(view.trainedUntil) : "—"}; `,
        `${pods.length - unusual.length} of ${pods.length} prod pods predicted`),
      errors.length ? h("div", {class: "error"}, errors.map((e) => h("div", {}, e))) : null,
      unusual.length ? h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, h("th", {}, "pod"), h("th", {}, "outcome"), h("th", {}, "counted as unpredicted"))),
        h("tbody", {}, unusual.slice(0, 50).map((p) => h("tr", {},
          h("td", {}, p.pod), h("td", {}, p.outcome), h("td", {}, amount(p.unpredicted)))))) : null,
    ].filter(Boolean));
  }

  function renderPsi() {
    const points = state.psi.filter(([, psi]) => psi);
    if (points.length === 0) {
      psiCharts.replaceChildren(h("p", {class: "muted"},
        "no PSI from this node's agent (its kernel has none, or the pressure files are absent)"));
      psiPods.replaceChildren();
      return;
    }
    const series = PSI_SIGNALS.map((signal) => ({
      name: signal.replace("_", " "),
      points: points.map(([t, psi]) => [t, psi.node ? psi.node[signal] ?? null : null]),
    }));
    psiCharts.replaceChildren(
      h("div", {class: "chart-box", "data-chart": "psi-node"},
        lineChart(series, {title: "node stall ratio", y: AXES.ratio, yFormat: percent, width: 460})));
    const pods = [...(points[points.length - 1][1].pods || [])]
      .filter((p) => p.averages.cpu_some != null)
      .sort((a, b) => b.averages.cpu_some - a.averages.cpu_some)
      .slice(0, 10);
    psiPods.replaceChildren(pods.length === 0
      ? h("p", {class: "muted"}, "no pod PSI in the newest report")
      : h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, h("th", {}, "pod"), ...PSI_SIGNALS.map((s) => h("th", {}, s.replace("_", " "))))),
        h("tbody", {}, pods.map((p) => h("tr", {},
          h("td", {}, p.namespace ? `${p.namespace}/${p.name}` : p.name),
          ...PSI_SIGNALS.map((s) => h("td", {}, percent(p.averages[s]))))))));
  }

  function mergePsi(points) {
    const byTime = new Map(state.psi.map((p) => [p[0], p]));
    for (const p of points) byTime.set(p[0], p);
    state.psi = [...byTime.values()].sort((a, b) => a[0] - b[0]).slice(-HISTORY_LIMIT);
  }

  function renderActuations() {
    const rows = [...state.actuations].reverse().slice(0, 100);
    actuations.replaceChildren(rows.length === 0
      ? h("p", {class: "muted"}, "no actuations in the last hour")
      : h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, h("th", {}, "time"), h("th", {}, "loop"), h("th", {}, "changes"))),
        h("tbody", {}, rows.map((a) => h("tr", {},
          h("td", {}, clock(a.at), a.dry_run ? h("div", {class: "muted"}, "dry run") : null),
          h("td", {}, a.loop),
          h("td", {}, (a.changes || []).slice(0, 10).map((c) => h("div", {class: "change"},
            h("code", {}, c.path), ` ${c.before} → ${c.after}`, h("div", {class: "formula"}, c.reason))),
          (a.changes || []).length > 10 ? h("div", {class: "muted"}, `… ${a.changes.length - 10} more`) : null,
          (a.problems || []).map((p) => h("div", {class: "error"}, `${p.target}: ${p.reason}`))),
        )))));
  }

  async function loadHeader() {
    try {
      const liveness = await api(`/api/v1/nodes/${encodeURIComponent(node)}`, {signal});
      header.replaceChildren(h("div", {class: "cards"},
        h("div", {class: "card"}, h("div", {class: "card-label"}, "status"),
          h("div", {class: "card-value"}, liveness.stale ? h("span", {class: "badge bad"}, "stale") : h("span", {class: "badge ok"}, "reporting"))),
        h("div", {class: "card"}, h("div", {class: "card-label"}, "last sample"),
          h("div", {class: "card-value"}, ago(liveness.secondsSinceLastSample)), h("div", {class: "card-detail"}, liveness.lastSampleTime)),
        h("div", {class: "card"}, h("div", {class: "card-label"}, "capacity"),
          h("div", {class: "card-value"}, `${liveness.cpuCores || "?"} cores`), h("div", {class: "card-detail"}, bytes(liveness.memoryTotalBytes))),
        h("div", {class: "card", "data-card": "pods", title: "the pods in the node's latest NodeMetric"},
          h("div", {class: "card-label"}, "pods"), h("div", {class: "card-value"}, String(liveness.pods))),
      ));
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
      header.replaceChildren(h("p", {class: "muted"}, "this node has never reported"));
    }
  }

  async function loadNow() {
    try {
      state.current = await api(`/api/v1/nodemetrics/${encodeURIComponent(node)}`, {signal});
      mergePoints([percentilesOfObject(state.current)]);
      renderHistory();
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
    }
    renderNow();
  }

  async function loadHistory() {
    const since = Math.floor(Date.now() / 1000 - HISTORY_SECONDS);
    const points = [];
    const predictions = [];
    const pressures = [];
    try {
      let cursor = null;
      for (let page = 0; page < 20; page++) {
        const query = new URLSearchParams({type: "nodemetric.computed", node, limit: "500"});
        if (cursor) query.set("cursor", cursor);
        else query.set("since", String(since));
        const answer = await api(`/api/v1/events?${query}`, {signal});
        for (const envelope of answer.events) {
          points.push(percentilesOf(envelope.data));
          predictions.push(predictionOf(envelope.data));
          pressures.push(psiOf(envelope.data));
        }
        cursor = answer.next;
        if (!cursor || answer.events.length === 0 || points.length >= HISTORY_LIMIT) break;
      }
      historyNote.textContent = `${points.length} reports from the event history, then live`;
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
      historyNote.textContent = "the server keeps no event history: reports are charted from now on";
    }
    mergePoints(points);
    mergePredictions(predictions);
    mergePsi(pressures);
    renderHistory();
    renderPrediction();
    renderPsi();
  }

  function mergePredictions(points) {
    const byTime = new Map(state.predictions.map((p) => [p[0], p]));
    for (const p of points) byTime.set(p[0], p);
    state.predictions = [...byTime.values()].sort((a, b) => a[0] - b[0]).slice(-HISTORY_LIMIT);
  }

  async function loadPrediction() {
    try {
      state.explained = await api(`/api/v1/nodes/${encodeURIComponent(node)}/prediction`, {signal});
    } catch (e) {
      if (!(e instanceof ApiError && [404, 502, 503].includes(e.status))) throw e;
      state.explained = null;
    }
    renderPrediction();
  }

  function mergePoints(points) {
    const byTime = new Map(state.points.map((p) => [p[0], p]));
    for (const p of points) byTime.set(p[0], p);
    state.points = [...byTime.values()].sort((a, b) => a[0] - b[0]).slice(-HISTORY_LIMIT);
  }

  async function loadDecisions() {
    try {
      const history = await api(`/api/v1/nodes/${encodeURIComponent(node)}/resources/history?limit=200`, {signal});
      state.decisions = history.items;
    } catch (e) {
      if (!(e instanceof ApiError && (e.status === 404 || e.status === 503))) throw e;
      state.decisions = [];
    }
    renderBatch();
    renderPrediction();
  }

  async function loadActuations() {
    try {
      const answer = await api(`/api/v1/nodes/${encodeURIComponent(node)}/actuations?limit=200`, {signal});
      state.actuations = answer.actuations;
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 503)) throw e;
      state.actuations = [];
    }
    renderActuations();
  }

  let decisionsTimer = 0;
  function onEvent(envelope) {
    if (envelope.node !== node) return;
    if (envelope.type === "nodemetric.computed") {
      mergePoints([percentilesOf(envelope.data)]);
      mergePredictions([predictionOf(envelope.data)]);
      mergePsi([psiOf(envelope.data)]);
      renderHistory();
      renderPsi();
      loadNow().catch(fail);
      loadPrediction().catch(fail);
    } else if (envelope.type === "noderesource.computed") {
      // the history route computes each change against the decision before; re-read it (at most once a second)
      if (!decisionsTimer) decisionsTimer = setTimeout(() => { decisionsTimer = 0; loadDecisions().catch(fail); }, 1000);
    } else if (envelope.type === "node.actuation") {
      state.actuations.push(envelope.data);
      renderActuations();
    }
  }

  events({type: ["nodemetric.computed", "noderesource.computed", "node.actuation"], node}, signal, onEvent);
  Promise.all([loadHeader(), loadNow(), loadHistory(), loadDecisions(), loadActuations(), loadPrediction()])
    .then(() => { root.dataset.loaded = "true"; })
    .catch(fail);
  const poll = setInterval(() => {
    if (document.body.dataset.stream !== "live") {
      Promise.all([loadHeader(), loadNow(), loadDecisions(), loadActuations(), loadPrediction()]).catch(fail);
    }
  }, 30000);
  signal.addEventListener("abort", () => { clearInterval(poll); clearTimeout(decisionsTimer); });
}

function fmt(resource, value) {
  if (value === null || value === undefined) return "removed";
  return resource.endsWith("cpu") ? `${cores(value)} cores` : bytes(value);
}
