// Watermarks: what the load-aware scheduler, the descheduler and each node QoS strategy do at which load, per
// resource, with the staleness rules and the findings (loops that make pods cycle) — GET /api/v1/config/watermarks,
// read again every 30 s (the ConfigMap and the services' statements have no event type of their own).

import {api} from "./api.js";
import {h} from "./format.js";

const REFRESH_MS = 30_000;

const pct = (value) => (value === null || value === undefined ? "–" : `${value}%`);

function qosCell(strategies) {
  const parts = strategies
    .filter((q) => q.suppress !== null || q.evict !== null)
    .map((q) => h("div", {},
      h("b", {}, q.strategy), ": ",
      [q.suppress !== null ? `suppress BE at ${pct(q.suppress)}` : null,
        q.evict !== null ? `evict at ${pct(q.evict)}` : null,
        q.capForBEPods !== null ? `BE pods capped at ${pct(q.capForBEPods)}` : null].filter(Boolean).join(", ")));
  return parts.length ? parts : h("span", {class: "muted"}, "off");
}

function sideText(name, side) {
  const source = side.fromConfigMap.length ? side.fromConfigMap.join(", ") : "nothing";
  const state = side.reported ? "reported" : "not reported (defaults shown)";
  const off = name === "descheduler" && !side.enabled ? ", load-aware descheduling off" : "";
  return `${name}: ${state}${off}; from the ConfigMap: ${source}`;
}

export function watermarksPage(root, {signal}) {
  const table = h("div", {id: "watermark-resources"});
  const staleness = h("div", {id: "watermark-staleness"});
  const findings = h("div", {id: "watermark-findings"});
  const strategies = h("div", {id: "watermark-qos"});
  const error = h("p", {class: "error", hidden: true});
  root.replaceChildren(
    h("h1", {}, "Watermarks"),
    h("p", {class: "muted"}, "One line per resource: where the scheduler stops placing pods, where the descheduler "
      + "drains and fills, and where each node's agent suppresses and evicts BE pods (slo-controller-config: "
      + "load-watermarks-config and resource-threshold-config)."),
    error,
    h("section", {}, h("h2", {}, "Findings"), findings),
    h("section", {}, h("h2", {}, "By resource"), table),
    h("section", {}, h("h2", {}, "Stale NodeMetric"), staleness),
    h("section", {}, h("h2", {}, "Node QoS strategies"), strategies),
  );

  async function load() {
    const view = await api("/api/v1/config/watermarks", {signal});
    findings.replaceChildren(view.findings.length === 0
      ? h("p", {class: "muted"}, "nothing to report: the lines agree")
      : h("ul", {class: "findings"}, view.findings.map((f) => h("li", {class: `finding ${f.severity}`, "data-code": f.code},
        h("span", {class: `badge severity-${f.severity}`}, f.severity), " ", h("code", {}, f.code), " ", f.message))));
    table.replaceChildren(h("table", {class: "grid-table"},
      h("thead", {}, h("tr", {}, ["resource", "scheduler admits up to", "prod pods up to", "descheduler drains above",
        "descheduler fills below", "node QoS"].map((c) => h("th", {}, c)))),
      h("tbody", {}, view.resources.map((r) => h("tr", {"data-resource": r.resource},
        h("td", {}, r.resource), h("td", {}, pct(r.schedule)), h("td", {}, pct(r.scheduleProd)),
        h("td", {}, pct(r.descheduleHigh)), h("td", {}, pct(r.descheduleLow)), h("td", {}, qosCell(r.nodeQoS)))))));
    const s = view.staleness;
    staleness.replaceChildren(
      h("p", {}, `scheduler: ${s.schedulerSeconds} s (${s.schedulerAllowsStale ? "schedules anyway" : "filters the node"}); `
        + `descheduler: ${s.deschedulerSeconds} s; dashboard: ${s.dashboardSeconds} s`),
      h("p", {class: "muted"}, sideText("scheduler", view.scheduler)),
      h("p", {class: "muted"}, sideText("descheduler", view.descheduler)));
    strategies.replaceChildren(h("table", {class: "grid-table"},
      h("thead", {}, h("tr", {}, ["strategy", "enable", "cpu suppress", "cpu evict", "memory evict",
        "evict priority ≤"].map((c) => h("th", {}, c)))),
      h("tbody", {}, view.nodeQoS.map((q) => h("tr", {},
        h("td", {}, q.strategy), h("td", {}, q.enable ? "yes" : "no"), h("td", {}, pct(q.cpuSuppressThresholdPercent)),
        h("td", {}, pct(q.cpuEvictThresholdPercent)), h("td", {}, pct(q.memoryEvictThresholdPercent)),
        h("td", {}, q.evictEnabledPriorityThreshold ?? "–"))))));
    error.hidden = true;
    root.dataset.loaded = "true";
  }

  const fail = (e) => {
    if (signal.aborted) return;
    error.hidden = false;
    error.textContent = e.message;
  };
  load().catch(fail);
  const timer = setInterval(() => load().catch(fail), REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}
