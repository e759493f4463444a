"""`koordbus scheduler explain POD NODE`: the load-aware extender's filter verdict and score of a pod on a node, with
the arithmetic behind both, asked of a running extender (`koordbus service loadaware`, its /explain route).
`koordbus scheduler watermarks`: the API's /api/v1/config/watermarks as a table — what the scheduler, the descheduler
and each node QoS strategy do at which load, and the findings (loops that make pods cycle).

POD is a file holding the Pod (JSON or YAML, as `kubectl get pod -o yaml` prints it) or `-` for standard input.
The answer reads the extender's live state: the node's last NodeMetric, the pods assigned since, its thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from koordbus import apiclient

DEFAULT_URL = "http://127.0.0.1:9090"


def add_parser(sub: Any) -> None:
    scheduler = sub.add_parser("scheduler", help="ask the load-aware scheduler extender why")
    verbs = scheduler.add_subparsers(dest="verb", metavar="VERB", required=True)
    explain = verbs.add_parser(
        "explain",
        help="the filter verdict and score of POD on NODE, with the numbers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("pod", metavar="POD", help="a file with the Pod (JSON or YAML), or - for stdin")
    explain.add_argument("node", metavar="NODE", help="the node's name")
    explain.add_argument(
        "--url",
        default=os.environ.get("KOORDBUS_LOADAWARE_URL", DEFAULT_URL),
        help=f"the extender (default {DEFAULT_URL} or KOORDBUS_LOADAWARE_URL)",
    )
    explain.add_argument("--json", action="store_true", help="print the extender's answer as JSON")
    explain.set_defaults(run=run_explain)
    marks = verbs.add_parser(
        "watermarks",
        help="the load thresholds of scheduling, descheduling and node QoS side by side, with what does not agree",
        description="Reads GET /api/v1/config/watermarks of the koordbus API (role viewer). Exit code 1 when a "
        "finding is a warning (pods can cycle between eviction and placement), so a CI job can check a config.",
    )
    apiclient.add_connection_options(marks)
    apiclient.add_output_option(marks)
    marks.set_defaults(run=lambda args: apiclient.run_verb(args, command="scheduler"), verb_run=cmd_watermarks)


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value:g}%"


def render_watermarks(view: dict[str, Any]) -> str:
    rows = []
    for row in view["resources"]:
        qos = "; ".join(
            f"{q['strategy']}: "
            + ", ".join(
                part
                for part in (
                    f"suppress {_percent(q['suppress'])}" if q["suppress"] is not None else "",
                    f"evict {_percent(q['evict'])}" if q["evict"] is not None else "",
                    f"BE pods capped at {_percent(q['capForBEPods'])}" if q["capForBEPods"] is not None else "",
                )
                if part
            )
            for q in row["nodeQoS"]
            if q["suppress"] is not None or q["evict"] is not None
        )
        rows.append(
            [
                row["resource"],
                _percent(row["schedule"]),
                _percent(row["scheduleProd"]),
                _percent(row["descheduleHigh"]),
                _percent(row["descheduleLow"]),
                qos or "off",
            ]
        )
    out = apiclient.table(["RESOURCE", "SCHEDULE", "PROD", "DRAIN ABOVE", "FILL BELOW", "NODE QOS"], rows)
    stale = view["staleness"]
    out += (
        f"\nstale NodeMetric: scheduler {stale['schedulerSeconds']:g} s"
        f" ({'schedules anyway' if stale['schedulerAllowsStale'] else 'filters the node'}),"
        f" descheduler {stale['deschedulerSeconds']:g} s\n"
    )
    for side in ("scheduler", "descheduler"):
        section = view[side]
        source = ", ".join(section["fromConfigMap"]) or "nothing"
        state = "reported" if section["reported"] else "not reported"
        if side == "descheduler" and not section["enabled"]:
            state += ", load-aware descheduling off"
        out += f"{side}: {state}; from the ConfigMap: {source}\n"
    if view["findings"]:
        out += "\n" + "".join(f"{f['severity'].upper()} {f['code']}: {f['message']}\n" for f in view["findings"])
    return out


def cmd_watermarks(api: apiclient.Api, args: argparse.Namespace) -> int:
    view = api.json("GET", "/api/v1/config/watermarks")
    sys.stdout.write(apiclient.dump(view, args.output) if args.output != "table" else render_watermarks(view))
    return 1 if any(f["severity"] == "warning" for f in view["findings"]) else 0


def _read_pod(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise SystemExit(f"koordbus: {path}: {err.strerror}") from None
    try:
        pod = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SystemExit(f"koordbus: {path}: not JSON or YAML: {' '.join(str(err).split())}") from None
    if not isinstance(pod, dict):
        raise SystemExit(f"koordbus: {path}: expected a Pod object")
    return pod


def render(answer: dict[str, Any]) -> str:
    verdict, score = answer["filter"], answer["score"]
    lines = [
        f"pod {answer['pod']} on node {answer['node']}",
        f"  estimate: {', '.join(f'{k} {v}' for k, v in sorted(answer['estimate'].items())) or 'nothing'}",
        f"  assigned pods counted on the node: {answer['assigned_pods']}",
        f"  filter: {'pass' if verdict['passed'] else 'FAIL'}"
        + (f" ({verdict['reason']})" if verdict["reason"] else ""),
    ]
    if verdict["detail"]:
        lines += [f"    {part}" for part in verdict["detail"].split("; ")]
    lines.append(
        f"  score: {score['score']}/100, {score['extender_score']}/10 on the extender scale"
        + (f" ({score['reason']})" if score["reason"] else "")
    )
    if score["detail"]:
        lines += [f"    {part}" for part in score["detail"].split("; ")]
    return "\n".join(lines)


def run_explain(args: argparse.Namespace) -> int:
    pod = _read_pod(args.pod)
    try:
        response = httpx.post(f"{args.url.rstrip('/')}/explain", json={"pod": pod, "node": args.node}, timeout=10)
    except httpx.HTTPError as err:
        raise SystemExit(f"koordbus: the extender at {args.url} did not answer: {err}") from None
    if response.status_code != 200:
        raise SystemExit(f"koordbus: the extender refused: {response.status_code} {response.text}")
    answer = response.json()
    print(json.dumps(answer, indent=2) if args.json else render(answer))
    return 0
