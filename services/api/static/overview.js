// Cluster overview: totals (nodes, stale, CPU and memory used of capacity, batch/mid allocatable vs used), a
// histogram of node CPU utilisation and a virtualised node table. Rows come from /api/v1/overview/nodes (paged
// by name) and are then kept current from the event stream: each event changes one row object in place, and
// the table and totals repaint at most once per animation frame (totals at most twice a second).

import {api, events} from "./api.js";
import {AXES, barChart} from "./chart.js";
import {ago, bytes, clock, cores, h, percent} from "./format.js";
import {VirtualTable} from "./vtable.js";

const PAGE = 1000;
const SUMMARY_INTERVAL_MS = 500;

const PRIORITY_BATCH = "koord-batch";
const PRIORITY_MID = "koord-mid";
const RESOURCES = {
  "kubernetes.io/batch-cpu": "batchCpu",
  "kubernetes.io/batch-memory": "batchMemory",
  "kubernetes.io/mid-cpu": "midCpu",
  "kubernetes.io/mid-memory": "midMemory",
};

// A nodemetric.computed event's data (NodeMetricComputed) → the row fields the overview shows; the same sums as
// services.nodemetric.store.UsageSummary.
export function usageFromNodeMetric(data) {
  const status = data.status || {};
  const usage = ((status.node_metric || {}).node_usage || {}).resources || {};
  const sums = {batchCpuUsed: 0, batchMemoryUsed: 0, midCpuUsed: 0, midMemoryUsed: 0};
  for (const pod of status.pods_metric || []) {
    const prefix = pod.priority === PRIORITY_BATCH ? "batch" : pod.priority === PRIORITY_MID ? "mid" : null;
    if (!prefix) continue;
    const r = (pod.pod_usage || {}).resources || {};
    sums[`${prefix}CpuUsed`] += r.cpu || 0;
    sums[`${prefix}MemoryUsed`] += r.memory || 0;
  }
  return {reportTime: data.report_time, cpuUsed: usage.cpu ?? null, memoryUsed: usage.memory ?? null, ...sums};
}

// Where a node's batch use, as its last NodeMetric reported it, is above its batch allocatable: per resource, and
// whether the allocatable was decided at or after that report. Batch pods are placed within the allocatable by their
// requests, so a use above it means a decision since lowered it (from that very report, whose prod use rose, or on
// a prod pod bound, counted by its request): the agent evicts the batch pods past it by allocatable, and the next
// report, naming only the pods still on the node, no longer counts them. Over an allocatable decided before the
// report is not that, and shows as such. A node with no decision known (yet) is not compared.
export function batchOver(row) {
  if (!batchKnown(row)) return null;
  const over = [];
  if ((row.batchCpuUsed || 0) > (row.batchCpu || 0)) over.push("cpu");
  if ((row.batchMemoryUsed || 0) > (row.batchMemory || 0)) over.push("memory");
  if (over.length === 0) return null;
  const lowered = row.resourcesAt != null && row.reportTime != null && row.resourcesAt >= row.reportTime;
  return {resources: over, lowered, reportTime: row.reportTime, resourcesAt: row.resourcesAt};
}

// A decision on the node's batch resources is known (removed ones, degraded or disabled, count as none).
function batchKnown(row) {
  return row.outcome !== null && row.outcome !== undefined;
}

function overNote(row, resource) {
  const over = batchOver(row);
  if (!over || !over.resources.includes(resource)) return null;
  if (!over.lowered) {
    return h("span", {class: "badge bad", "data-over": "over",
      title: `batch ${resource} used (reported at ${clock(row.reportTime)}) above the allocatable decided before it, `
        + `at ${clock(row.resourcesAt)}`}, "over");
  }
  return h("span", {class: "badge severity-info", "data-over": "lowered",
    title: `batch allocatable decided at ${clock(row.resourcesAt)}, at or after the use reported at `
      + `${clock(row.reportTime)}: lowered below what the batch pods on the node used; those past it are evicted by `
      + "allocatable, and the next report no longer counts them"}, "lowered");
}

function bar(used, total) {
  const share = used !== null && used !== undefined && total ? Math.min(1, used / total) : 0;
  const level = share > 0.9 ? "hot" : share > 0.7 ? "warm" : "";
  return h("span", {class: "meter"}, h("span", {class: `fill ${level}`, style: `width:${(share * 100).toFixed(1)}%`}));
}

// used / total with a meter, or with `note` in the meter's place (a full meter would say less than the note)
function pair(used, total, fmt, note = null) {
  return h("span", {class: "pair"}, note || bar(used, total), h("span", {}, `${fmt(used)} / ${fmt(total)}`));
}

export function overviewPage(root, {signal}) {
  const state = {rows: [], byName: new Map(), clockOffset: 0, staleAfter: 180, loaded: false, applied: 0, early: []};
  const now = () => Date.now() / 1000 + state.clockOffset;
  const isStale = (row) => now() - row.lastSample > state.staleAfter;

  const cards = h("div", {class: "cards", id: "overview-cards"});
  const histogram = h("div", {class: "chart-box", id: "cpu-histogram"});
  const search = h("input", {type: "search", placeholder: "filter nodes by name", id: "node-filter"});
  const staleOnly = h("input", {type: "checkbox", id: "stale-only"});
  const counter = h("span", {class: "muted", id: "node-count"});
  const table = new VirtualTable(
    [
      {key: "name", label: "node", width: "2fr", sort: (r) => r.name,
        render: (r) => h("a", {href: `#/node/${encodeURIComponent(r.name)}`}, r.name)},
      {key: "stale", label: "status", width: "0.7fr", sort: (r) => (isStale(r) ? 1 : 0),
        render: (r) => (isStale(r) ? h("span", {class: "badge bad"}, "stale") : h("span", {class: "badge ok"}, "ok"))},
      {key: "cpu", label: "cpu used / cores", width: "1.6fr", sort: (r) => share(r.cpuUsed, r.cpuCores * 1000),
        render: (r) => pair(r.cpuUsed, r.cpuCores ? r.cpuCores * 1000 : null, cores)},
      {key: "memory", label: "memory used / total", width: "1.6fr", sort: (r) => share(r.memoryUsed, r.memoryTotal),
        render: (r) => pair(r.memoryUsed, r.memoryTotal || null, bytes)},
      {key: "batchCpu", label: "batch cpu used / alloc.", width: "1.6fr", sort: (r) => r.batchCpu,
        render: (r) => pair(r.batchCpuUsed, r.batchCpu, cores, overNote(r, "cpu"))},
      {key: "batchMemory", label: "batch mem used / alloc.", width: "1.6fr", sort: (r) => r.batchMemory,
        render: (r) => pair(r.batchMemoryUsed, r.batchMemory, bytes, overNote(r, "memory"))},
      {key: "midCpu", label: "mid cpu / mem alloc.", width: "1.2fr", sort: (r) => r.midCpu,
        render: (r) => `${cores(r.midCpu)} / ${bytes(r.midMemory)}`},
      {key: "age", label: "last sample", width: "0.8fr", sort: (r) => -r.lastSample,
        render: (r) => ago(now() - r.lastSample)},
    ],
    {emptyText: "no nodes have reported yet"},
  );
  const error = h("p", {class: "error", hidden: true});
  root.replaceChildren(
    h("h1", {}, "Cluster overview"),
    error,
    cards,
    h("section", {}, h("h2", {}, "Nodes by CPU utilisation"), histogram),
    h("section", {}, h("h2", {}, "Nodes"),
      h("div", {class: "toolbar"}, search, h("label", {}, staleOnly, " stale only"), counter),
      table.root),
  );

  const applyFilter = () => {
    const text = search.value.trim().toLowerCase();
    const stale = staleOnly.checked;
    table.setFilter((r) => (!text || r.name.includes(text)) && (!stale || isStale(r)));
    counter.textContent = `${table.view.length} of ${state.rows.length} nodes`;
  };
  search.addEventListener("input", applyFilter);
  staleOnly.addEventListener("change", applyFilter);

  let summaryDue = false;
  let summaryTimer = 0;
  function scheduleSummary() {
    summaryDue = true;
    if (summaryTimer) return;
    summaryTimer = setTimeout(() => {
      summaryTimer = 0;
      if (summaryDue) {
        summaryDue = false;
        requestAnimationFrame(renderSummary);
      }
    }, SUMMARY_INTERVAL_MS);
  }

  function renderSummary() {
    // utilisation counts only the nodes whose capacity is known (their agents reported it)
    const t = {nodes: 0, stale: 0, cores: 0, cpuUsed: 0, memTotal: 0, memUsed: 0, sized: 0,
      batchCpu: 0, batchCpuUsed: 0, batchMem: 0, batchMemUsed: 0, midCpu: 0, midCpuUsed: 0, midMem: 0, midMemUsed: 0};
    const buckets = new Array(10).fill(0);
    let unknown = 0;
    const over = [];
    let undecided = 0;
    for (const r of state.rows) {
      const o = batchOver(r);
      if (o) over.push({node: r.name, ...o});
      if (!batchKnown(r) && (r.batchCpuUsed || r.batchMemoryUsed)) undecided++;
      t.nodes++;
      if (isStale(r)) t.stale++;
      if (r.cpuCores && r.memoryTotal) {
        t.sized++;
        t.cores += r.cpuCores;
        t.cpuUsed += r.cpuUsed || 0;
        t.memTotal += r.memoryTotal;
        t.memUsed += r.memoryUsed || 0;
      }
      if (batchKnown(r)) { // batch used against allocatable where the allocatable is known
        t.batchCpu += r.batchCpu || 0;
        t.batchCpuUsed += r.batchCpuUsed || 0;
        t.batchMem += r.batchMemory || 0;
        t.batchMemUsed += r.batchMemoryUsed || 0;
      }
      t.midCpu += r.midCpu || 0;
      t.midCpuUsed += r.midCpuUsed || 0;
      t.midMem += r.midMemory || 0;
      t.midMemUsed += r.midMemoryUsed || 0;
      const s = share(r.cpuUsed, r.cpuCores * 1000);
      if (s === null) unknown++;
      else buckets[Math.min(9, Math.floor(s * 10))]++;
    }
    const card = (label, value, detail, id, note = "") =>
      h("div", {class: "card", "data-card": id}, h("div", {class: "card-label"}, label),
        h("div", {class: "card-value"}, value), h("div", {class: "card-detail"}, detail),
        ...(note ? [h("div", {class: "card-detail card-note"}, note)] : []));
    const lowered = (resource) => {
      const nodes = over.filter((o) => o.lowered && o.resources.includes(resource)).length;
      const notes = [];
      if (nodes) {
        notes.push(`${nodes} node${nodes === 1 ? "" : "s"} above a batch allocatable lowered since their last `
          + "report: the batch pods past it are evicted by allocatable");
      }
      if (undecided) notes.push(`${undecided} node${undecided === 1 ? "" : "s"} with batch use and no decision known `
        + "yet: not counted");
      return notes.join("; ");
    };
    cards.replaceChildren(
      card("nodes", String(t.nodes), `${t.sized} with known capacity`, "nodes"),
      card("stale nodes", String(t.stale), `no sample for ${state.staleAfter} s`, "stale"),
      card("cpu used", percent(t.cpuUsed, t.cores * 1000), `${cores(t.cpuUsed)} of ${cores(t.cores * 1000)} cores`,
        "cpu"),
      card("memory used", percent(t.memUsed, t.memTotal), `${bytes(t.memUsed)} of ${bytes(t.memTotal)}`, "memory"),
      card("batch cpu used / allocatable", percent(t.batchCpuUsed, t.batchCpu),
        `${cores(t.batchCpuUsed)} of ${cores(t.batchCpu)} cores`, "batch-cpu", lowered("cpu")),
      card("batch memory used / allocatable", percent(t.batchMemUsed, t.batchMem),
        `${bytes(t.batchMemUsed)} of ${bytes(t.batchMem)}`, "batch-memory", lowered("memory")),
      card("mid cpu used / allocatable", percent(t.midCpuUsed, t.midCpu),
        `${cores(t.midCpuUsed)} of ${cores(t.midCpu)} cores`, "mid-cpu"),
      card("mid memory used / allocatable", percent(t.midMemUsed, t.midMem),
        `${bytes(t.midMemUsed)} of ${bytes(t.midMem)}`, "mid-memory"),
    );
    const groups = buckets.map((count, i) => ({label: `${i * 10}–${i * 10 + 10}%`, values: [{name: "nodes", value: count}]}));
    if (unknown) groups.push({label: "no capacity", values: [{name: "nodes", value: unknown}]});
    histogram.replaceChildren(barChart(groups, {width: 900, height: 180, y: AXES.count, yFormat: (v) => v.toFixed(0)}));
    counter.textContent = `${table.view.length} of ${state.rows.length} nodes`;
    root.dataset.eventsApplied = String(state.applied); // read by tests/browser
    root.dataset.batchOver = JSON.stringify(over); // read by tests/browser
  }

  function changed() {
    table.update();
    scheduleSummary();
  }

  async function load() {
    const rows = [];
    let after = null;
    do {
      const query = new URLSearchParams({limit: String(PAGE)});
      if (after) query.set("after", after);
      const page = await api(`/api/v1/overview/nodes?${query}`, {signal});
      state.clockOffset = page.now - Date.now() / 1000;
      state.staleAfter = page.staleAfterSeconds;
      rows.push(...page.items);
      after = page.continue;
    } while (after && !signal.aborted);
    // rows seen live while loading keep their newer values
    for (const row of rows) {
      const live = state.byName.get(row.name);
      if (live && (live.reportTime || 0) > (row.reportTime || 0)) Object.assign(row, usageOf(live));
    }
    state.rows = rows;
    state.byName = new Map(rows.map((r) => [r.name, r]));
    state.loaded = true;
    table.setRows(rows);
    for (const envelope of state.early.splice(0)) onEvent(envelope);
    applyFilter();
    renderSummary();
    root.dataset.loaded = "true";
    performance.mark("overview-loaded");
  }

  function onEvent(envelope) {
    if (!state.loaded) {
      state.early.push(envelope); // applied once the rows are there
      return;
    }
    state.applied++;
    const row = state.byName.get(envelope.node);
    const data = envelope.data || {};
    if (envelope.type === "nodemetric.computed") {
      if (!row) return reloadSoon();
      if ((row.reportTime || 0) > data.report_time) return;
      Object.assign(row, usageFromNodeMetric(data));
      row.lastSample = Math.max(row.lastSample, data.report_time || 0);
    } else if (envelope.type === "noderesource.computed") {
      if (!row) return;
      for (const [name, key] of Object.entries(RESOURCES)) {
        const resources = data.resources || {};
        row[key] = name in resources ? resources[name] : null;
      }
      row.outcome = data.outcome;
      row.resourcesAt = data.computed_at;
    } else if (envelope.type === "node.lifecycle") {
      return reloadSoon();
    }
    changed();
  }

  let reloadTimer = 0;
  function reloadSoon() {
    if (reloadTimer || signal.aborted) return;
    reloadTimer = setTimeout(() => {
      reloadTimer = 0;
      load().catch(showError);
    }, 5000);
  }

  function showError(e) {
    if (signal.aborted) return;
    error.hidden = false;
    error.textContent = e.message;
  }

  events({type: ["nodemetric.computed", "noderesource.computed", "node.lifecycle"]}, signal, onEvent);
  load().catch(showError);
  // ages and staleness move with the clock; without a live stream the rows are re-read every 30 s
  const tick = setInterval(() => {
    if (!state.loaded) return;
    changed();
  }, 5000);
  const poll = setInterval(() => {
    if (document.body.dataset.stream !== "live") load().catch(showError);
  }, 30000);
  signal.addEventListener("abort", () => {
    clearInterval(tick);
    clearInterval(poll);
    clearTimeout(reloadTimer);
    clearTimeout(summaryTimer);
  });
}

function share(used, total) {
  if (used === null || used === undefined || !total) return null;
  return used / total;
}

function usageOf(row) {
  const {reportTime, cpuUsed, memoryUsed, batchCpuUsed, batchMemoryUsed, midCpuUsed, midMemoryUsed, lastSample} = row;
  return {reportTime, cpuUsed, memoryUsed, batchCpuUsed, batchMemoryUsed, midCpuUsed, midMemoryUsed, lastSample};
}
