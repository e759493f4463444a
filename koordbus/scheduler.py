"""`koordbus scheduler explain POD NODE`: the load-aware extender's filter verdict and score of a pod on a node, with
the arithmetic behind both, asked of a running extender (`koordbus service loadaware`, its /explain route).

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
