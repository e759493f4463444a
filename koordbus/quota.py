"""`koordbus quota …`: the elastic quota trees from the terminal, through the REST API.

Registered by koordbus/cli.py. Subcommands: `tree` (the whole tree as an indented table), `get` (one quota as YAML,
or all as a table), `apply -f FILE` (create or update every ElasticQuota and ElasticQuotaProfile in YAML/JSON
files, parents first, like kubectl apply), `delete`, `check -f PODS` (would these pods fit), `what-if` (how runtimes
would change) and `import` (adopt existing ElasticQuota objects from a file or a cluster as one validated batch).
`-o json|yaml` prints the API's documents instead of tables. The API address comes from --api or
KOORDBUS_API_URL (default http://127.0.0.1:8080), the token from --token, KOORDBUS_API_TOKEN, --token-file or the
token `koordbus up` wrote into .koordbus/api-token. Exit codes: 0 done, 1 the API refused something (or a pod does
not fit), 2 bad usage or the API unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from koordbus import apiclient
from schemas import quota as quota_schema

QUOTA_KIND: Final = "ElasticQuota"
PROFILE_KIND: Final = "ElasticQuotaProfile"
PARENT_LABEL: Final = "quota.scheduling.koordinator.sh/parent"
SHOWN: Final = ("min", "max", "runtime", "request", "used")


# --- reading files


def parents_first(quotas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Order quotas so that each comes after its parent when the parent is in the set (cycles keep file order)."""
    by_name = {_name(q): q for q in quotas}
    ordered: list[dict[str, Any]] = []
    placed: set[str] = set()

    def place(name: str, trail: set[str]) -> None:
        if name in placed or name in trail:
            return
        parent = ((by_name[name].get("metadata") or {}).get("labels") or {}).get(PARENT_LABEL, "")
        if parent in by_name:
            place(parent, trail | {name})
        placed.add(name)
        ordered.append(by_name[name])

    for name in by_name:
        place(name, set())
    return ordered


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


# --- output


def amounts(rl: Mapping[str, str] | None) -> str:
    if not rl:
        return "-"
    return ",".join(f"{k}={v}" for k, v in sorted(rl.items()))


# --- subcommands


def cmd_tree(api: apiclient.Api, args: argparse.Namespace) -> int:
    tree = api.json("GET", f"/api/v1/quota-trees/{args.tree}")
    if args.output != "table":
        sys.stdout.write(apiclient.dump(tree, args.output))
        return 0
    nodes = {q["name"]: q for q in tree["quotas"]}
    rows: list[list[str]] = []

    def walk(name: str, depth: int) -> None:
        node = nodes[name]
        rows.append(["  " * depth + name, str(node["pods"]), *(amounts(node.get(f)) for f in SHOWN)])
        for child in node["children"]:
            if child in nodes:
                walk(child, depth + 1)

    roots = [q["name"] for q in tree["quotas"] if q["parent"] not in nodes]
    for root in sorted(roots, key=lambda n: (n != "koordinator-root-quota", n)):
        walk(root, 0)
    sys.stdout.write(f"tree {tree['tree']}: total {amounts(tree.get('total'))}\n")
    for problem in tree.get("problems") or []:
        sys.stdout.write(f"PROBLEM: {problem}\n")
    sys.stdout.write(apiclient.table(["QUOTA", "PODS", *(f.upper() for f in SHOWN)], rows))
    return 0


def cmd_get(api: apiclient.Api, args: argparse.Namespace) -> int:
    if args.name:
        quota = api.json("GET", f"/api/v1/quotas/{args.name}")
        sys.stdout.write(apiclient.dump(quota, "yaml" if args.output == "table" else args.output))
        return 0
    listed = api.json("GET", "/api/v1/quotas" + (f"?tree={args.tree}" if args.tree else ""))
    if args.output != "table":
        sys.stdout.write(apiclient.dump(listed, args.output))
        return 0
    rows = []
    for item in listed["items"]:
        meta, spec = item["metadata"], item.get("spec", {})
        annotations = meta.get("annotations", {})
        runtime = json.loads(annotations.get("quota.scheduling.koordinator.sh/runtime", "{}"))
        rows.append(
            [
                meta["name"],
                meta.get("labels", {}).get(PARENT_LABEL, "-"),
                amounts(spec.get("min")),
                amounts(spec.get("max")),
                amounts(runtime),
                amounts(item.get("status", {}).get("used")),
            ]
        )
    sys.stdout.write(apiclient.table(["NAME", "PARENT", "MIN", "MAX", "RUNTIME", "USED"], rows))
    return 0


def cmd_apply(api: apiclient.Api, args: argparse.Namespace) -> int:
    documents = apiclient.load_documents(args.filename)
    quotas = [d for d in documents if d.get("kind", QUOTA_KIND) == QUOTA_KIND]
    profiles = [d for d in documents if d.get("kind") == PROFILE_KIND]
    others = [d for d in documents if d not in quotas and d not in profiles]
    failed = 0
    for other in others:
        sys.stderr.write(f"skipped {other.get('kind')}/{_name(other)}: only ElasticQuota and ElasticQuotaProfile\n")
        failed += 1
    for kind, path, items in (("elasticquotaprofile", "quota-profiles", profiles), ("elasticquota", "quotas", quotas)):
        for obj in parents_first(items) if kind == "elasticquota" else items:
            failed += _apply_one(api, kind, path, obj)
    return 1 if failed else 0


def _apply_one(api: apiclient.Api, kind: str, path: str, obj: dict[str, Any]) -> int:
    name = _name(obj)
    if not name:
        sys.stderr.write(f"{kind}: an object without metadata.name was skipped\n")
        return 1
    body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}
    current = api.call("GET", f"/api/v1/{path}/{name}", ok=(200, 404))
    if current.status_code == 404:
        response = api.call("POST", f"/api/v1/{path}", body=body)
        verb = "created"
    else:
        if _same(current.json(), body):
            sys.stdout.write(f"{kind}/{name} unchanged\n")
            return 0
        response = api.call("PUT", f"/api/v1/{path}/{name}", body=body)
        verb = "configured"
    if response.status_code in (200, 201):
        sys.stdout.write(f"{kind}/{name} {verb}\n")
        return 0
    sys.stderr.write(f"{kind}/{name}: {apiclient.error_text(response)}\n")
    return 1


def _same(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether applying would change nothing: the same amounts in spec (however written) and every label and
    annotation the file sets already in place."""
    try:
        have = quota_schema.decode_elastic_quota(current)
        want = quota_schema.decode_elastic_quota(wanted)
    except quota_schema.QuotaFormatError:
        return False  # let the API say what is wrong
    if (have.min, have.max) != (want.min, want.max):
        return False
    return all(have.labels.get(k) == v for k, v in want.labels.items()) and all(
        have.annotations.get(k) == v for k, v in want.annotations.items()
    )


def cmd_delete(api: apiclient.Api, args: argparse.Namespace) -> int:
    failed = 0
    for name in args.names:
        response = api.call("DELETE", f"/api/v1/quotas/{name}", ok=(200, 404, 409, 422))
        if response.status_code == 200:
            sys.stdout.write(f"elasticquota/{name} deleted\n")
        else:
            sys.stderr.write(f"elasticquota/{name}: {apiclient.error_text(response)}\n")
            failed += 1
    return 1 if failed else 0


def cmd_check(api: apiclient.Api, args: argparse.Namespace) -> int:
    pods = apiclient.load_documents(args.filename)
    path = "/api/v1/quotas/check" + ("?parents=true" if args.parents else "")
    result = api.json("POST", path, body={"pods": pods})
    if args.output != "table":
        sys.stdout.write(apiclient.dump(result, args.output))
    else:
        rows = [
            [v["pod"], v.get("quota") or "-", "yes" if v["fits"] else "NO", "; ".join(v.get("reasons") or []) or "-"]
            for v in result["verdicts"]
        ]
        sys.stdout.write(apiclient.table(["POD", "QUOTA", "FITS", "WHY"], rows))
    return 0 if result["fits"] else 1


def cmd_what_if(api: apiclient.Api, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    for path in args.filename or ():
        for document in apiclient.load_documents([path]):
            if document.get("kind") == QUOTA_KIND:
                body.setdefault("update" if args.update else "create", []).append(document)
            else:
                for key, value in document.items():
                    body[key] = [*body.get(key, []), *value] if isinstance(value, list) else value
    for setting in args.min or ():
        name, _, rest = setting.partition(":")
        try:
            wanted = dict(pair.split("=", 1) for pair in rest.split(","))
        except ValueError:
            raise apiclient.CliError(
                f"--min {setting!r}: expected QUOTA:RESOURCE=QUANTITY[,…], e.g. team-a:cpu=10"
            ) from None
        body.setdefault("patch", {})[name] = {"spec": {"min": wanted}}
    if not body:
        raise apiclient.CliError("nothing to evaluate: pass -f FILE and/or --min QUOTA:cpu=10")
    result = api.json("POST", "/api/v1/quotas/what-if", body=body)
    if args.output != "table":
        sys.stdout.write(apiclient.dump(result, args.output))
        return 0
    for violation in result["violations"]:
        sys.stdout.write(f"REJECTED: {violation['message']}\n")
    rows = []
    for change in result["changes"]:
        for field in ("runtime", "request", "used", "min"):
            before, after = change["before"].get(field), change["after"].get(field)
            if before != after:
                rows.append([change["quota"], field, amounts(before), amounts(after)])
    sys.stdout.write(apiclient.table(["QUOTA", "FIELD", "NOW", "WOULD BE"], rows) if rows else "nothing would change\n")
    for note in result.get("notes") or []:
        sys.stdout.write(f"note: {note}\n")
    return 1 if result["violations"] else 0


def cmd_import(api: apiclient.Api, args: argparse.Namespace) -> int:
    if bool(args.filename) == bool(args.kubeconfig):
        raise apiclient.CliError(
            "pass either -f FILE (ElasticQuotas exported as YAML/JSON) or --kubeconfig FILE (a cluster)"
        )
    if args.filename:
        source = ", ".join(args.filename)
        documents = [d for d in apiclient.load_documents(args.filename) if d.get("kind", QUOTA_KIND) == QUOTA_KIND]
    else:
        source = f"the cluster of {args.kubeconfig}"
        documents = _cluster_quotas(args.kubeconfig, args.context)
    if not documents:
        raise apiclient.CliError(f"no ElasticQuota found in {source}", code=1)
    path = "/api/v1/quotas/import" + ("?dryRun=true" if args.dry_run else "")
    response = api.call("POST", path, body={"items": documents}, ok=(200, 404, 409, 422))
    if response.status_code != 200:
        sys.stderr.write(f"import refused, nothing was changed: {apiclient.error_text(response)}\n")
        return 1
    result = response.json()
    verb = "would change" if args.dry_run else "imported"
    sys.stdout.write(
        f"{len(documents)} ElasticQuotas read from {source}: {verb} {len(result['changed'])}, "
        f"unchanged {len(result['unchanged'])}\n"
    )
    for name in result["changed"]:
        sys.stdout.write(f"  elasticquota/{name}\n")
    return 0


def _cluster_quotas(kubeconfig: str, context: str | None) -> list[dict[str, Any]]:
    import asyncio

    from services.k8s.client import KubeConfigError
    from services.k8s.quotas import ListError, list_elastic_quotas
    from services.k8s.settings import K8sSettings

    try:
        return asyncio.run(list_elastic_quotas(K8sSettings(kubeconfig=kubeconfig, kube_context=context or "")))
    except (KubeConfigError, ListError) as e:
        raise apiclient.CliError(str(e)) from None


# --- wiring


def add_parser(sub: Any) -> None:
    quota = sub.add_parser(
        "quota",
        help="manage elastic quota trees through the API (tree, get, apply, delete, check, what-if)",
        description="Elastic quota trees through the koordbus REST API. Writes need a token with role quota-admin.",
        epilog="Exit codes: 0 done; 1 the API refused something or a pod does not fit; 2 usage or connection error.",
    )
    apiclient.add_connection_options(quota)
    verbs = quota.add_subparsers(dest="verb", metavar="VERB", required=True)

    tree = verbs.add_parser("tree", help="a whole tree: min, max, runtime, request, used per quota")
    tree.add_argument("tree", nargs="?", default="default", help="tree id (default: the main tree, 'default')")
    apiclient.add_output_option(tree)
    tree.set_defaults(verb_run=cmd_tree)

    get = verbs.add_parser("get", help="one quota as YAML (-o json), or every quota as a table")
    get.add_argument("name", nargs="?", help="quota name (omit to list)")
    get.add_argument("--tree", default=None, help="when listing: only this tree")
    apiclient.add_output_option(get)
    get.set_defaults(verb_run=cmd_get)

    apply = verbs.add_parser("apply", help="create or update the ElasticQuotas and profiles in files, parents first")
    apply.add_argument("-f", "--filename", action="append", required=True, help="YAML/JSON file ('-' for stdin)")
    apply.set_defaults(verb_run=cmd_apply)

    delete = verbs.add_parser("delete", help="delete quotas (refused while they have children or pods)")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.set_defaults(verb_run=cmd_delete)

    check = verbs.add_parser("check", help="would these pods fit their quotas? (exit 1 if one does not)")
    check.add_argument("-f", "--filename", action="append", required=True, help="Pod / PodList YAML or JSON")
    check.add_argument("--parents", action="store_true", help="also check every ancestor's runtime")
    apiclient.add_output_option(check)
    check.set_defaults(verb_run=cmd_check)

    what_if = verbs.add_parser("what-if", help="how runtimes would change; nothing is written")
    what_if.add_argument(
        "-f",
        "--filename",
        action="append",
        help="ElasticQuotas to create (or --update), or a what-if body {create, update, patch, delete, pods}",
    )
    what_if.add_argument("--update", action="store_true", help="quotas in the files replace existing ones")
    what_if.add_argument("--min", action="append", metavar="QUOTA:RES=QTY[,…]", help="a changed min, e.g. a:cpu=10")
    apiclient.add_output_option(what_if)
    what_if.set_defaults(verb_run=cmd_what_if)

    imp = verbs.add_parser(
        "import",
        help="adopt existing ElasticQuotas (a file or a cluster) as one batch validated as trees",
        description="Read ElasticQuota objects from files (e.g. `kubectl get elasticquota -A -o yaml`) or straight "
        "from a cluster, and append them as one validated batch: each is created, or replaces the quota of that "
        "name. One invalid quota refuses the whole import; every violation is listed.",
    )
    imp.add_argument("-f", "--filename", action="append", help="YAML/JSON file ('-' for stdin)")
    imp.add_argument("--kubeconfig", help="read the ElasticQuotas of this kubeconfig's cluster")
    imp.add_argument("--context", help="kubeconfig context (default: its current one)")
    imp.add_argument("--dry-run", action="store_true", help="validate and report; change nothing")
    imp.set_defaults(verb_run=cmd_import)

    quota.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return apiclient.run_verb(args, command="quota")
