"""`koordbus migration …`: pod-migration jobs from the terminal, through the REST API.

Registered by koordbus/cli.py. `list` (a table, filtered by phase, node, namespace or workload), `get NAME` (the
job with its decision trail), `request NAMESPACE/POD [--mode] [--ttl]` or `request -f FILE` (a PodMigrationJob),
`abort NAME`, `plan [--last] [--all]` (the descheduler's LowNodeLoad round for the current state without acting, or
its last round: each node's class and why, each pool's outcome, the pods to move). Connection options and exit codes
as `koordbus quota` (koordbus.apiclient): 0 done, 1 the API refused something (or the round did not run), 2 bad
usage or the API unreachable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from koordbus import apiclient


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if seconds else "-"


def cmd_list(api: apiclient.Api, args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("phase", args.phase), ("node", args.node), ("namespace", args.namespace),
                                ("workload", args.workload)) if v}  # fmt: skip
    query = "&".join(f"{k}={v}" for k, v in params.items())
    listed = api.json("GET", "/api/v1/migrations" + (f"?{query}" if query else ""))
    if args.output != "table":
        sys.stdout.write(apiclient.dump(listed, args.output))
        return 0
    rows = [
        [i["name"], f"{i['namespace']}/{i['pod']}", i["node"] or "-", i["phase"], i["arbitration"],
         i["reason"] or "-", _when(i["requestedAt"])]
        for i in listed["items"]
    ]  # fmt: skip
    sys.stdout.write(apiclient.table(["NAME", "POD", "NODE", "PHASE", "ARBITRATION", "REASON", "REQUESTED"], rows))
    return 0


def cmd_get(api: apiclient.Api, args: argparse.Namespace) -> int:
    job = api.json("GET", f"/api/v1/migrations/{args.name}")
    if args.output != "table":
        sys.stdout.write(apiclient.dump(job, args.output))
        return 0
    sys.stdout.write(
        f"{job['name']}: pod {job['namespace']}/{job['pod']} on {job['node'] or '?'}, phase {job['phase']}, "
        f"arbitration {job['arbitration']}{' (' + job['reason'] + ')' if job['reason'] else ''}\n"
    )
    rows = [[str(d["round"]), d["outcome"], d["filter"] or "-", d["message"] or "-"] for d in job["trail"]]
    sys.stdout.write(apiclient.table(["ROUND", "OUTCOME", "FILTER", "WHY"], rows) if rows else "no decision yet\n")
    return 0


def cmd_request(api: apiclient.Api, args: argparse.Namespace) -> int:
    body: dict[str, Any]
    if args.filename:
        documents = apiclient.load_documents([args.filename])
        if len(documents) != 1:
            raise apiclient.CliError(f"{args.filename} holds {len(documents)} objects; request one job at a time")
        body = documents[0]
    elif args.pod:
        namespace, _, name = args.pod.partition("/")
        if not namespace or not name:
            raise apiclient.CliError(f"{args.pod!r}: name the pod as NAMESPACE/NAME")
        body = {"pod": {"namespace": namespace, "name": name}}
        body.update({k: v for k, v in (("name", args.name), ("mode", args.mode), ("ttl", args.ttl)) if v})
    else:
        raise apiclient.CliError("name the pod (NAMESPACE/NAME) or pass -f FILE with a PodMigrationJob")
    response = api.call("POST", "/api/v1/migrations", body=body, ok=(202, 409, 422))
    if response.status_code != 202:
        sys.stderr.write(f"refused: {apiclient.error_text(response)}\n")
        return 1
    sys.stdout.write(f"podmigrationjob/{response.json()['name']} requested (the arbiter decides within a round)\n")
    return 0


def cmd_abort(api: apiclient.Api, args: argparse.Namespace) -> int:
    response = api.call("POST", f"/api/v1/migrations/{args.name}/abort", ok=(202, 404, 409))
    if response.status_code != 202:
        sys.stderr.write(f"podmigrationjob/{args.name}: {apiclient.error_text(response)}\n")
        return 1
    sys.stdout.write(f"podmigrationjob/{args.name} abort requested\n")
    return 0


SHORT_CLASS = {
    "highNodes": "high",
    "prodHighNodes": "prodHigh",
    "lowNodes": "low",
    "bothLowNodes": "bothLow",
    "prodLowNodes": "prodLow",
    "normal": "normal",
    "unusable": "unusable",
}


def render_round(view: dict[str, Any], *, all_nodes: bool = False) -> str:
    """A DeschedulerRound (its JSON) as text: what kind of round, each pool's counts and outcome, the nodes (not the
    normal ones unless `all_nodes`) with why, and the pods to move with Koordinator's reasons."""
    kind = "plan (nothing acted on)" if view["planned"] else "dry run" if view["dryRun"] else "round"
    out = [f"LowNodeLoad {kind} at {_when(view['at'])} UTC\n"]
    if view["problems"]:
        out.append("not run: " + "; ".join(view["problems"]) + "\n")
        return "".join(out)
    if view["paused"]:
        out.append("paused: the args say paused, no node is looked at\n")
    for pool in view["pools"]:
        counts = pool["counts"]
        shown = ", ".join(f"{short} {counts.get(name, 0)}" for name, short in SHORT_CLASS.items())
        out.append(
            f"pool {pool['name']}: {pool['nodes']} nodes ({shown}; abnormal {counts.get('abnormal', 0)}, "
            f"abnormal prod {counts.get('abnormalProd', 0)}): {pool['outcome']}\n"
        )
    rows = [
        [n["node"], n["pool"], SHORT_CLASS[n["nodeClass"]], "yes" if n.get("abnormal") else "-", n["why"]]
        for n in view["nodes"]
        if all_nodes or n["nodeClass"] != "normal"
    ]
    if rows:
        out.append(apiclient.table(["NODE", "POOL", "CLASS", "ABNORMAL", "WHY"], rows))
    if view.get("nodesOmitted"):
        out.append(f"({view['nodesOmitted']} more nodes not listed: the view lists the acted-on classes first)\n")
    evictions = [
        [e["pod"], e["node"], e["pool"], "yes" if e["prod"] else "-", e.get("job") or "-", e["reason"]]
        for e in view["evictions"]
    ]
    if evictions:
        out.append(apiclient.table(["POD", "NODE", "POOL", "PROD", "JOB", "REASON"], evictions))
    else:
        out.append("no pod to move\n")
    return "".join(out)


def cmd_plan(api: apiclient.Api, args: argparse.Namespace) -> int:
    view = api.json("GET", "/api/v1/descheduler/rounds/latest" if args.last else "/api/v1/descheduler/plan")
    if args.output != "table":
        sys.stdout.write(apiclient.dump(view, args.output))
    else:
        sys.stdout.write(render_round(view, all_nodes=args.all))
    return 1 if view["problems"] else 0


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "migration",
        help="pod-migration jobs through the API (list, get, request, abort) and the descheduler's plan",
        description="PodMigrationJobs through the koordbus REST API: their arbitration and decision trails. "
        "Requests and aborts need a token with role admin.",
        epilog="Exit codes: 0 done; 1 the API refused something; 2 usage or connection error.",
    )
    apiclient.add_connection_options(parser)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="jobs, newest first")
    listing.add_argument("--phase", help="Pending, Running, Succeeded, Failed or Aborted")
    listing.add_argument("--node", help="jobs of pods on this node")
    listing.add_argument("--namespace", help="jobs of pods in this namespace")
    listing.add_argument("--workload", help="jobs of pods controlled by this uid")
    apiclient.add_output_option(listing)
    listing.set_defaults(verb_run=cmd_list)
    get = verbs.add_parser("get", help="one job with its decision trail")
    get.add_argument("name")
    apiclient.add_output_option(get)
    get.set_defaults(verb_run=cmd_get)
    request = verbs.add_parser("request", help="ask for a pod to be migrated")
    request.add_argument("pod", nargs="?", help="NAMESPACE/NAME of the pod")
    request.add_argument("-f", "--filename", help="a PodMigrationJob (YAML/JSON) instead")
    request.add_argument("--name", help="the job's name (default: a generated one)")
    request.add_argument("--mode", choices=("ReservationFirst", "EvictDirectly"), help="default: the args' mode")
    request.add_argument("--ttl", help="a duration like 5m (default: the args' defaultJobTTL)")
    request.set_defaults(verb_run=cmd_request)
    abort = verbs.add_parser("abort", help="abort a job that has not finished")
    abort.add_argument("name")
    abort.set_defaults(verb_run=cmd_abort)
    planning = verbs.add_parser(
        "plan",
        help="what the load-aware descheduler would move now, and why (a dry run)",
        description="The migration service runs a LowNodeLoad round over the state it holds now, with copies of its "
        "anomaly detectors, and acts on nothing: each node's class (high, prodHigh, low, bothLow, prodLow, normal, "
        "unusable), whether it is abnormal and why (usage against thresholds in percent of allocatable), each pool's "
        "outcome, and the pods it would ask to move with Koordinator's reasons. Exit 1 when the round cannot run "
        "(no lowNodeLoadArgs, or args refused).",
    )
    planning.add_argument("--last", action="store_true", help="the descheduler's last round instead of a new plan")
    planning.add_argument("--all", action="store_true", help="list the normal nodes too")
    apiclient.add_output_option(planning)
    planning.set_defaults(verb_run=cmd_plan)
    parser.set_defaults(run=lambda args: apiclient.run_verb(args, command="migration"))
