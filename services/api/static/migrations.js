// Pod migration: the queue (jobs not finished), recent jobs with their arbitration outcome and reason, jobs by
// phase, and for a picked job its whole decision trail (each round's outcome, the filter that held it and why).
// Next to the queue, the descheduler's last LowNodeLoad round (each node's class and why, each pool's outcome, the
// pods it asked to move), or on "Plan now" one computed for the current state without acting.
// Migration events re-read the list (at most once a second), the open trail and the descheduler's round.

import {ApiError, api, events} from "./api.js";
import {AXES, barChart} from "./chart.js";
import {clock, h} from "./format.js";

const PHASES = ["Pending", "Running", "Succeeded", "Failed", "Aborted"];

export function migrationsPage(root, {signal, params}) {
  const selected = params[0] || null;
  const chart = h("div", {class: "chart-box", id: "migration-phases"});
  const queue = h("div", {id: "migration-queue"});
  const recent = h("div", {id: "migration-jobs"});
  const trail = h("div", {id: "migration-trail"});
  const descheduler = h("div", {id: "descheduler-round"});
  const planButton = h("button", {type: "button", id: "descheduler-plan"}, "Plan now (dry run)");
  const error = h("p", {class: "error", hidden: true});
  root.replaceChildren(
    h("h1", {}, "Migrations"),
    error,
    h("section", {}, h("h2", {}, "Jobs by phase"), chart),
    h("section", {}, h("h2", {}, "Queue (pending and running)"), queue),
    h("section", {}, h("h2", {}, "Descheduler (LowNodeLoad) ", planButton), descheduler),
    h("section", {}, h("h2", {}, "Decision trail"), trail),
    h("section", {}, h("h2", {}, "Recent jobs"), recent),
  );
  const fail = (e) => {
    if (signal.aborted) return;
    error.hidden = false;
    error.textContent = e.message;
  };

  const jobTable = (jobs, empty) => (jobs.length === 0 ? h("p", {class: "muted"}, empty) : h("table", {class: "grid-table"},
    h("thead", {}, h("tr", {}, ["job", "pod", "node", "phase", "arbitration", "reason", "requested"].map((c) => h("th", {}, c)))),
    h("tbody", {}, jobs.map((j) => h("tr", {"data-job": j.name, class: j.name === selected ? "selected" : ""},
      h("td", {}, h("a", {href: `#/migrations/${encodeURIComponent(j.name)}`}, j.name)),
      h("td", {}, `${j.namespace}/${j.pod}`),
      h("td", {}, j.node ? h("a", {href: `#/node/${encodeURIComponent(j.node)}`}, j.node) : "–"),
      h("td", {}, h("span", {class: `badge phase-${j.phase.toLowerCase()}`}, j.phase)),
      h("td", {}, j.arbitration || "–"),
      h("td", {}, j.reason || "", j.message ? h("div", {class: "muted"}, j.message) : null),
      h("td", {}, clock(j.requestedAt)),
    )))));

  async function loadJobs() {
    const answer = await api("/api/v1/migrations?limit=500", {signal});
    const jobs = answer.items;
    const counts = Object.fromEntries(PHASES.map((p) => [p, 0]));
    for (const job of jobs) counts[job.phase] = (counts[job.phase] || 0) + 1;
    chart.replaceChildren(barChart(PHASES.map((p) => ({label: p, values: [{name: "jobs", value: counts[p]}]})),
      {width: 640, height: 160, y: AXES.count, yFormat: (v) => v.toFixed(0)}));
    queue.replaceChildren(jobTable(jobs.filter((j) => j.phase === "Pending" || j.phase === "Running"), "the queue is empty"));
    recent.replaceChildren(jobTable(jobs.slice(0, 200), "no migration jobs yet"));
    root.dataset.loaded = "true";
  }

  const CLASSES = {highNodes: "high", prodHighNodes: "prodHigh", lowNodes: "low", bothLowNodes: "bothLow",
    prodLowNodes: "prodLow", normal: "normal", unusable: "unusable"};

  function roundView(round) {
    const kind = round.planned ? "plan for now, nothing acted on" : round.dryRun ? "dry run" : "round";
    const head = h("p", {}, h("b", {}, kind), ` at ${clock(round.at)}`, round.paused ? " — paused" : "");
    if (round.problems.length) return [head, h("p", {class: "error"}, `not run: ${round.problems.join("; ")}`)];
    const pools = round.pools.map((p) => h("p", {"data-pool": p.name}, h("b", {}, p.name), `: ${p.nodes} nodes — `,
      Object.entries(CLASSES).map(([k, label]) => `${label} ${p.counts[k] || 0}`).join(", "),
      `, abnormal ${p.counts.abnormal || 0} — ${p.outcome}`));
    const nodes = round.nodes.filter((n) => n.nodeClass !== "normal");
    const nodeTable = nodes.length === 0 ? h("p", {class: "muted"}, "every node is between its thresholds") :
      h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, ["node", "pool", "class", "abnormal", "why"].map((c) => h("th", {}, c)))),
        h("tbody", {}, nodes.map((n) => h("tr", {"data-node": n.node},
          h("td", {}, h("a", {href: `#/node/${encodeURIComponent(n.node)}`}, n.node)),
          h("td", {}, n.pool),
          h("td", {}, h("span", {class: `badge ${["highNodes", "prodHighNodes"].includes(n.nodeClass) ? "bad" : ""}`},
            CLASSES[n.nodeClass])),
          h("td", {}, n.abnormal ? "yes" : "–"),
          h("td", {}, n.why)))));
    const moves = round.evictions.length === 0 ? h("p", {class: "muted"}, "no pod to move") :
      h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, ["pod", "from node", "job", "reason"].map((c) => h("th", {}, c)))),
        h("tbody", {}, round.evictions.map((e) => h("tr", {"data-eviction": e.pod},
          h("td", {}, e.pod), h("td", {}, e.node),
          h("td", {}, e.job ? h("a", {href: `#/migrations/${encodeURIComponent(e.job)}`}, e.job) : "–"),
          h("td", {}, e.reason)))));
    const omitted = round.nodesOmitted ? h("p", {class: "muted"}, `${round.nodesOmitted} more nodes not listed`) : null;
    return [head, ...pools, nodeTable, omitted, h("h3", {}, "Pods to move"), moves].filter((part) => part !== null);
  }

  let planned = false;
  async function loadDescheduler() {
    if (planned) return;  // a plan stays on screen until the page is left
    try {
      descheduler.replaceChildren(...roundView(await api("/api/v1/descheduler/rounds/latest", {signal})));
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) throw e;
      descheduler.replaceChildren(h("p", {class: "muted"}, e.message));
    }
  }
  planButton.addEventListener("click", () => {
    planned = true;
    api("/api/v1/descheduler/plan", {signal})
      .then((round) => descheduler.replaceChildren(...roundView(round)))
      .catch(fail);
  });

  async function loadTrail() {
    if (!selected) {
      trail.replaceChildren(h("p", {class: "muted"}, "pick a job to see every arbitration decision about it"));
      return;
    }
    const job = await api(`/api/v1/migrations/${encodeURIComponent(selected)}`, {signal});
    trail.replaceChildren(
      h("p", {}, h("b", {}, job.name), ` ${job.namespace}/${job.pod}: ${job.phase}`,
        job.reason ? ` (${job.reason})` : "", job.message ? ` — ${job.message}` : ""),
      job.trail.length === 0 ? h("p", {class: "muted"}, "no decisions yet") : h("table", {class: "grid-table"},
        h("thead", {}, h("tr", {}, ["round", "time", "outcome", "filter", "reason", "message"].map((c) => h("th", {}, c)))),
        h("tbody", {}, job.trail.map((d) => h("tr", {},
          h("td", {}, String(d.round)), h("td", {}, clock(d.time)), h("td", {}, d.outcome),
          h("td", {}, d.filter || "–"), h("td", {}, d.reason || ""), h("td", {}, d.message || ""))))));
  }

  let timer = 0;
  function refreshSoon() {
    if (timer) return;
    timer = setTimeout(() => {
      timer = 0;
      Promise.all([loadJobs(), loadTrail(), loadDescheduler()]).catch(fail);
    }, 1000);
  }

  events({type: ["migration.event"]}, signal, () => refreshSoon());
  Promise.all([loadJobs(), loadTrail(), loadDescheduler()]).catch(fail);
  const poll = setInterval(() => {
    if (document.body.dataset.stream !== "live") refreshSoon();
  }, 15000);
  signal.addEventListener("abort", () => { clearInterval(poll); clearTimeout(timer); });
}
