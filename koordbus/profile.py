"""`koordbus colocation-profile …`: the ClusterColocationProfiles koordbus holds, from the terminal, through the REST
API (`/api/v1/colocation-profiles`, services.webhook.routes).

Registered by koordbus/cli.py. Subcommands: `get` (one profile as YAML, or all as a table), `apply -f FILE` (create
or replace every ClusterColocationProfile in YAML/JSON files, like kubectl apply; `--dry-run` has the API check them
and keep nothing) and `delete`. Connection options, output and exit codes as `koordbus quota` (koordbus.apiclient):
0 done, 1 the API refused something, 2 bad usage or the API unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any, Final

from koordbus import apiclient

KIND: Final = "ClusterColocationProfile"
PATH: Final = "/api/v1/colocation-profiles"
LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _selector(raw: Any) -> str:
    if not isinstance(raw, dict) or not raw:
        return "*"
    parts = [f"{k}={v}" for k, v in (raw.get("matchLabels") or {}).items()]
    for requirement in raw.get("matchExpressions") or ():
        values = ",".join(requirement.get("values") or ())
        parts.append(f"{requirement.get('key')} {requirement.get('operator')}" + (f" ({values})" if values else ""))
    return "; ".join(parts)


def cmd_get(api: apiclient.Api, args: argparse.Namespace) -> int:
    if args.name:
        profile = api.json("GET", f"{PATH}/{args.name}")
        sys.stdout.write(apiclient.dump(profile, "yaml" if args.output == "table" else args.output))
        return 0
    listed = api.json("GET", PATH)
    if args.output != "table":
        sys.stdout.write(apiclient.dump(listed, args.output))
        return 0
    rows = []
    for item in listed["items"]:
        spec = item.get("spec") or {}
        rows.append(
            [
                _name(item),
                _selector(spec.get("namespaceSelector")),
                _selector(spec.get("selector")),
                str(spec.get("qosClass") or "-"),
                str(spec.get("priorityClassName") or "-"),
                str(spec.get("probability", 100)),
                item["metadata"].get("resourceVersion", ""),
            ]
        )
    headers = ["NAME", "NAMESPACES", "PODS", "QOS", "PRIORITYCLASS", "PROBABILITY", "VERSION"]
    sys.stdout.write(apiclient.table(headers, rows))
    return 0


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether applying would change nothing: the same spec, labels and annotations (kubectl's own left out)."""
    have, want = current.get("metadata") or {}, wanted.get("metadata") or {}
    notes = {k: v for k, v in (want.get("annotations") or {}).items() if k != LAST_APPLIED}
    return (
        json.dumps(current.get("spec") or {}, sort_keys=True) == json.dumps(wanted.get("spec") or {}, sort_keys=True)
        and (have.get("labels") or {}) == (want.get("labels") or {})
        and (have.get("annotations") or {}) == notes
    )


def _apply_one(api: apiclient.Api, obj: dict[str, Any], *, dry_run: bool) -> int:
    name = _name(obj)
    if not name:
        sys.stderr.write("clustercolocationprofile: an object without metadata.name was skipped\n")
        return 1
    body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}
    query = "?dryRun=true" if dry_run else ""
    current = api.call("GET", f"{PATH}/{name}", ok=(200, 404, 422))
    if current.status_code == 422:
        sys.stderr.write(f"clustercolocationprofile/{name}: {apiclient.error_text(current)}\n")
        return 1
    if current.status_code == 404:
        response, verb = api.call("POST", PATH + query, body=body, ok=(201, 200)), "created"
    elif _same(current.json(), body):
        sys.stdout.write(f"clustercolocationprofile/{name} unchanged\n")
        return 0
    else:
        response, verb = api.call("PUT", f"{PATH}/{name}{query}", body=body), "configured"
    if response.status_code in (200, 201):
        sys.stdout.write(f"clustercolocationprofile/{name} {verb}{' (dry run)' if dry_run else ''}\n")
        return 0
    sys.stderr.write(f"clustercolocationprofile/{name}: {apiclient.error_text(response)}\n")
    return 1


def cmd_apply(api: apiclient.Api, args: argparse.Namespace) -> int:
    failed = 0
    for obj in apiclient.load_documents(args.filename):
        if obj.get("kind", KIND) != KIND:
            sys.stderr.write(f"skipped {obj.get('kind')}/{_name(obj)}: only {KIND}\n")
            failed += 1
            continue
        failed += _apply_one(api, obj, dry_run=args.dry_run)
    return 1 if failed else 0


def cmd_delete(api: apiclient.Api, args: argparse.Namespace) -> int:
    failed = 0
    for name in args.names:
        response = api.call("DELETE", f"{PATH}/{name}", ok=(200, 404, 409, 422))
        if response.status_code == 200:
            sys.stdout.write(f"clustercolocationprofile/{name} deleted\n")
        else:
            sys.stderr.write(f"clustercolocationprofile/{name}: {apiclient.error_text(response)}\n")
            failed += 1
    return 1 if failed else 0


def add_parser(sub: Any) -> None:
    command = sub.add_parser(
        "colocation-profile",
        help="manage the ClusterColocationProfiles koordbus holds through the API (get, apply, delete)",
        description="ClusterColocationProfiles through the koordbus REST API: the admission webhook applies them to "
        "Pods at CREATE like the cluster's own (for a name both hold, koordbus's). Writes need a token with role "
        "admin.",
        epilog="Exit codes: 0 done; 1 the API refused something; 2 usage or connection error.",
    )
    apiclient.add_connection_options(command)
    verbs = command.add_subparsers(dest="verb", metavar="VERB", required=True)

    get = verbs.add_parser("get", help="one profile as YAML (-o json), or every profile as a table")
    get.add_argument("name", nargs="?", help="profile name (omit to list)")
    apiclient.add_output_option(get)
    get.set_defaults(verb_run=cmd_get)

    apply = verbs.add_parser("apply", help="create or replace the ClusterColocationProfiles in files")
    apply.add_argument("-f", "--filename", action="append", required=True, help="YAML/JSON file ('-' for stdin)")
    apply.add_argument("--dry-run", action="store_true", help="have the API check them; keep nothing")
    apply.set_defaults(verb_run=cmd_apply)

    delete = verbs.add_parser("delete", help="delete profiles (Pods created from then on no longer get them)")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.set_defaults(verb_run=cmd_delete)

    command.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return apiclient.run_verb(args, command="colocation-profile")
