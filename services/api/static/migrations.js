// Pod migration: the queue (jobs not finished), recent jobs with their arbitration outcome and reason, jobs by
// phase, and for a picked job its whole decision trail (each round's outcome, the filter that held it and why).
// Migration events re-read the list (at most once a second) and the open trail.

import {api, events} from "./api.js";
import {barChart} from "./chart.js";
import {clock, h} from "./format.js";

const PHASES = ["Pending", "Running", "Succeeded", "Failed", "Aborted"];

export function migrationsPage(root, {signal, params}) {
  const selected = params[0] || null;
  const chart = h("div", {class: "chart-box", id: "migration-phases"});
  const queue = h("div", {id: "migration-queue"});
  const recent = h("div", {id: "migration-jobs"});
  const trail = h("div", {id: "migration-trail"});
  const error = h("p", {class: "error", hidden: true});
  root.replaceChildren(
    h("h1", {}, "Migrations"),
    error,
    h("section", {}, h("h2", {}, "Jobs by phase"), chart),
    h("section", {}, h("h2", {}, "Queue (pending and running)"), queue),
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
      {width: 640, height: 160, yFormat: (v) => v.toFixed(0)}));
    queue.replaceChildren(jobTable(jobs.filter((j) => j.phase === "Pending" || j.phase === "Running"), "the queue is empty"));
    recent.replaceChildren(jobTable(jobs.slice(0, 200), "no migration jobs yet"));
    root.dataset.loaded = "true";
  }

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
      Promise.all([loadJobs(), loadTrail()]).catch(fail);
    }, 1000);
  }

  events({type: ["migration.event"]}, signal, () => refreshSoon());
  Promise.all([loadJobs(), loadTrail()]).catch(fail);
  const poll = setInterval(() => {
    if (document.body.dataset.stream !== "live") refreshSoon();
  }, 15000);
  signal.addEventListener("abort", () => { clearInterval(poll); clearTimeout(timer); });
}
