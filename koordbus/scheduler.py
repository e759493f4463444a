"""`koordbus scheduler explain POD NODE`: the load-aware extender's filter verdict and score of a pod on a node, with
the arithmetic behind both, asked of a running extender (`koordbus service loadaware` or `koordbus up`, its /explain
route; `up`'s over mutual TLS, with the URL and client certificate it wrote to .koordbus/), or with
`--offline -f STATE` replayed from a node's saved state (`koordbus scheduler state NODE`, the API's
/api/v1/scheduler/nodes/NODE/state, or any `koordbus calc loadaware` input) through the same code.
`koordbus scheduler state NODE`: that state now, from the koordbus API (role viewer), to save and replay later.
`koordbus scheduler watermarks`: the API's /api/v1/config/watermarks as a table — what the scheduler, the descheduler
and each node QoS strategy do at which load, and the findings (loops that make pods cycle).

POD is a file holding the Pod (JSON or YAML, as `kubectl get pod -o yaml` prints it) or `-` for standard input; with
--offline it may be left out when the state holds a `pod`, and NODE when given must be the state's node. The live
answer reads the extender's state now: the node's last NodeMetric, the pods assigned since, its thresholds; the
offline one reads the state as it was when saved, at its `now`.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import yaml

from koordbus import apiclient, calc_input, extender
from koordbus.calc_errors import InputError
from schemas import kube, names
from services.common.args import ArgsError
from services.loadaware import core, snapshot

DEFAULT_URL = "http://127.0.0.1:9090"
UP_DIR = Path(".koordbus")
"""Where `koordbus up` run from this directory writes its extender's URL and client certificate (koordbus.extender)."""


def _default_url() -> str:
    """KOORDBUS_LOADAWARE_URL, else the extender of a `koordbus up` run from here, else the service's plain port."""
    if url := os.environ.get("KOORDBUS_LOADAWARE_URL"):
        return url
    try:
        return (UP_DIR / extender.URL_FILE).read_text(encoding="ascii").strip() or DEFAULT_URL
    except (OSError, UnicodeDecodeError):
        return DEFAULT_URL


def _up_file(name: str) -> str | None:
    path = UP_DIR / name
    return str(path) if path.is_file() else None


def add_parser(sub: Any) -> None:
    scheduler = sub.add_parser("scheduler", help="ask the load-aware scheduler extender why")
    verbs = scheduler.add_subparsers(dest="verb", metavar="VERB", required=True)
    explain = verbs.add_parser(
        "explain",
        help="the filter verdict and score of POD on NODE, with the numbers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("pod", metavar="POD", nargs="?", help="a file with the Pod (JSON or YAML), or - for stdin")
    explain.add_argument("node", metavar="NODE", nargs="?", help="the node's name")
    explain.add_argument(
        "--offline", action="store_true", help="replay a saved node state (-f) instead of asking the extender"
    )
    explain.add_argument("-f", "--file", metavar="STATE", help="the saved state (JSON or YAML) for --offline")
    explain.add_argument(
        "--url",
        default=None,
        help=f"the extender (default KOORDBUS_LOADAWARE_URL, else the one `koordbus up` run from this directory "
        f"wrote to {UP_DIR / extender.URL_FILE}, else {DEFAULT_URL})",
    )
    explain.add_argument(
        "--cacert",
        metavar="FILE",
        help=f"with an https URL: the CA of the extender's certificate (default {UP_DIR / extender.CA_FILE} when "
        "there, else the system's)",
    )
    explain.add_argument(
        "--cert",
        metavar="FILE",
        help=f"with an https URL: the client certificate to present (default {UP_DIR / extender.CLIENT_CERT_FILE} "
        "when there)",
    )
    explain.add_argument(
        "--key",
        metavar="FILE",
        help=f"the client certificate's key (default {UP_DIR / extender.CLIENT_KEY_FILE} when there)",
    )
    explain.add_argument("--json", action="store_true", help="print the extender's answer as JSON")
    explain.set_defaults(run=run_explain)
    state = verbs.add_parser(
        "state",
        help="a node's load-aware extender state now, to replay with `explain --offline -f`",
        description="Reads GET /api/v1/scheduler/nodes/NODE/state of the koordbus API (role viewer): the extender's "
        "args, the node's allocatable, its NodeMetric and the pods counted on it, as `koordbus calc loadaware` reads.",
    )
    state.add_argument("node", metavar="NODE", help="the node's name")
    apiclient.add_connection_options(state)
    apiclient.add_output_option(state, default="json")
    state.set_defaults(run=lambda args: apiclient.run_verb(args, command="scheduler"), verb_run=cmd_state)
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


def cmd_state(api: apiclient.Api, args: argparse.Namespace) -> int:
    try:
        names.node_name(args.node, "NODE")
    except names.InvalidName as err:
        raise apiclient.CliError(str(err)) from None
    document = api.json("GET", f"/api/v1/scheduler/nodes/{args.node}/state")
    sys.stdout.write(apiclient.dump(document, "yaml" if args.output == "yaml" else "json"))
    return 0


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


def _explain_offline(args: argparse.Namespace) -> dict[str, Any]:
    """core.explain on the state saved in args.file (services.loadaware.snapshot), as the extender answered then."""
    if not args.file:
        raise SystemExit("koordbus scheduler explain: --offline needs -f STATE (a node state saved as JSON or YAML)")
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SystemExit(f"koordbus: {args.file}: {getattr(err, 'strerror', None) or err}") from None
    try:
        document = calc_input.decode_input(text, snapshot.NodeStateInput)
        load, node, now = snapshot.read(document)
        pod = document.pod
        if args.pod is not None:
            pod = msgspec.convert(_read_pod(args.pod), kube.Pod, strict=False)
    except (InputError, snapshot.SnapshotError, ArgsError) as err:
        raise SystemExit(f"koordbus: {args.file}: {' '.join(str(err).split())}") from None
    except msgspec.ValidationError as err:
        raise SystemExit(f"koordbus: {args.pod}: not a Pod: {err}") from None
    if pod is None:
        raise SystemExit(f"koordbus: {args.file} holds no pod: give POD")
    if args.node is not None and args.node != node:
        raise SystemExit(f"koordbus: {args.file} is the state of node {node!r}, not {args.node!r}")
    return core.explain(load, pod, node, now=now)


def _tls(args: argparse.Namespace, url: str) -> ssl.SSLContext | bool:
    """For an https URL: an SSL context trusting --cacert and presenting --cert/--key (each defaulting to what
    `koordbus up` wrote to .koordbus/, when there); for plain http, nothing."""
    if not url.startswith("https://"):
        return True
    context = ssl.create_default_context(cafile=args.cacert or _up_file(extender.CA_FILE))
    cert = args.cert or _up_file(extender.CLIENT_CERT_FILE)
    if cert is not None:
        context.load_cert_chain(cert, args.key or _up_file(extender.CLIENT_KEY_FILE))
    return context


def run_explain(args: argparse.Namespace) -> int:
    if args.offline:
        answer = _explain_offline(args)
        print(json.dumps(answer, indent=2) if args.json else render(answer))
        return 0
    if args.pod is None or args.node is None:
        raise SystemExit("koordbus scheduler explain: POD and NODE are required (or --offline -f STATE)")
    pod = _read_pod(args.pod)
    url = args.url or _default_url()
    try:
        response = httpx.post(
            f"{url.rstrip('/')}/explain", json={"pod": pod, "node": args.node}, timeout=10, verify=_tls(args, url)
        )
    except httpx.HTTPError as err:
        raise SystemExit(f"koordbus: the extender at {url} did not answer: {err}") from None
    except (OSError, ssl.SSLError) as err:  # a certificate or key file that cannot be read or used
        raise SystemExit(f"koordbus: cannot use the TLS files for {url}: {err}") from None
    if response.status_code != 200:
        raise SystemExit(f"koordbus: the extender refused: {response.status_code} {response.text}")
    answer = response.json()
    print(json.dumps(answer, indent=2) if args.json else render(answer))
    return 0
