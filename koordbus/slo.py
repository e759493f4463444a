"""`koordbus slo preview -f slo-controller-config.yaml [--node NAME … | --nodes-from-cluster]`: what a proposed
`slo-controller-config` ConfigMap would make of each node's NodeSLO, before it is applied. A CI gate for ConfigMap
changes: exit 1 when a key is in error (each problem is named by the key and the JSON path inside it), 0 otherwise.

With `--node` or `--nodes-from-cluster` the nodes' labels and annotations, their NodeSLOs and the ConfigMap in effect
are read from the cluster (`--kubeconfig`, else KOORDBUS_KUBECONFIG, else the in-cluster service account); nodes that
end the same way are shown together, with the changes against the NodeSLO they have now. Without them, nothing is read
from a cluster: each key's strategies are shown per node-selector group, as merged. The rendering is the slo service's
own (services.common.sloconfig, services.slo.render); the file is read with the API's safe YAML rules (no aliases, no
tags beyond JSON's, bounded size and depth).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Final

import msgspec

from koordbus import apiclient
from services.common import bodies
from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.slo import preview as slo_preview

MAX_FILE_BYTES: Final = 4 * 1024 * 1024
"""Largest file read: four times what Kubernetes stores in one ConfigMap (1 MiB)."""


class PreviewInputError(Exception):
    """A file, option or cluster problem: exit 2 with the message."""


def add_parser(sub: Any) -> None:
    slo = sub.add_parser("slo", help="node QoS (NodeSLO) tools: preview a slo-controller-config change")
    verbs = slo.add_subparsers(dest="verb", metavar="VERB", required=True)
    preview = verbs.add_parser(
        "preview",
        help="each node's NodeSLO under a proposed slo-controller-config, and what would change",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 no key in error; 1 a key is in error (its nodes would keep their current value for it); "
        "2 a file, option or cluster problem.",
    )
    preview.add_argument("-f", "--filename", required=True, help="the ConfigMap, YAML or JSON ('-' for stdin)")
    which = preview.add_mutually_exclusive_group()
    which.add_argument("--node", action="append", metavar="NAME", help="preview this node (repeatable)")
    which.add_argument("--nodes-from-cluster", action="store_true", help="preview every node of the cluster")
    preview.add_argument(
        "--kubeconfig",
        default=os.environ.get("KOORDBUS_KUBECONFIG", ""),
        help="the cluster's kubeconfig (default: KOORDBUS_KUBECONFIG, else in-cluster)",
    )
    preview.add_argument("--context", default="", help="kubeconfig context (default: its current one)")
    apiclient.add_output_option(preview)
    preview.set_defaults(run=run_preview)


def run_preview(args: argparse.Namespace) -> int:
    try:
        namespace, name, data = read_configmap(args.filename)
        nodes, in_effect = None, None
        if args.node or args.nodes_from_cluster:
            nodes, in_effect = _read_cluster(args, namespace, name)
    except PreviewInputError as err:
        sys.stderr.write(f"koordbus slo preview: {err}\n")
        return 2
    result = slo_preview.preview(data, in_effect=in_effect, nodes=nodes)
    if args.output == "table":
        sys.stdout.write(render_table(result, source=f"{namespace}/{name}", cluster=nodes is not None))
    else:
        sys.stdout.write(apiclient.dump(msgspec.to_builtins(result), args.output))
    return 1 if result.errors else 0


def read_configmap(path: str) -> tuple[str, str, dict[str, str]]:
    """(namespace, name, data) of the ConfigMap in the file; PreviewInputError says what is wrong with it."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        else:
            with Path(path).open("rb") as file:
                raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise PreviewInputError(f"cannot read {path}: {err.strerror or err}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise PreviewInputError(f"{path} is larger than {MAX_FILE_BYTES} bytes; a ConfigMap holds at most 1 MiB")
    try:
        document = bodies.decode_yaml(raw)
    except bodies.BodyError as err:
        raise PreviewInputError(f"{path}: {str(err).replace('the body', 'the file')}") from None
    if not isinstance(document, dict):
        raise PreviewInputError(f"{path}: expected a ConfigMap object, got {type(document).__name__}")
    if document.get("kind", "ConfigMap") != "ConfigMap":
        raise PreviewInputError(f"{path}: expected kind ConfigMap, got {document.get('kind')!r}")
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise PreviewInputError(f"{path}: metadata: expected an object")
    namespace = metadata.get("namespace") or CONFIGMAP_NAMESPACE
    name = metadata.get("name") or CONFIGMAP_NAME
    if not isinstance(namespace, str) or not isinstance(name, str):
        raise PreviewInputError(f"{path}: metadata.namespace and metadata.name must be strings")
    data = document.get("data") or {}
    if not isinstance(data, dict):
        raise PreviewInputError(f"{path}: data: expected an object of strings")
    for key, value in data.items():
        if not isinstance(value, str):
            raise PreviewInputError(
                f"{path}: data.{key}: expected a string (a ConfigMap holds text; quote it or use `|`), "
                f"got {type(value).__name__}"
            )
    return namespace, name, data


def _read_cluster(
    args: argparse.Namespace, namespace: str, name: str
) -> tuple[list[slo_preview.NodeFacts], dict[str, str] | None]:
    from services.k8s.client import KubeConfigError
    from services.k8s.settings import K8sSettings
    from services.k8s.slo_reads import ReadError, read_cluster_slo

    settings = K8sSettings(
        kubeconfig=args.kubeconfig, kube_context=args.context, configmap_namespace=namespace, configmap_name=name
    )
    names = list(dict.fromkeys(args.node)) if args.node else None
    try:
        cluster = asyncio.run(read_cluster_slo(settings, node_names=names))
    except (KubeConfigError, ReadError) as err:
        raise PreviewInputError(str(err)) from None
    nodes = []
    for obj in cluster.nodes:
        metadata = obj.get("metadata") or {}
        node_name = str(metadata.get("name", ""))
        nodes.append(
            slo_preview.NodeFacts(
                name=node_name,
                labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
                annotations={str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()},
                current=cluster.nodeslos.get(node_name),
            )
        )
    in_effect = cluster.configmap
    if in_effect is not None:
        in_effect = {str(k): v for k, v in in_effect.items() if isinstance(v, str)}
    return nodes, in_effect


# --- the table


def _value(value: Any, *, limit: int = 100) -> str:
    text = json.dumps(value, sort_keys=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_table(result: slo_preview.Preview, *, source: str, cluster: bool) -> str:
    lines: list[str] = []
    keys_in_error = sorted({problem.key for problem in result.errors})
    if keys_in_error:
        keep = "their current value" if cluster else "the default"
        lines.append(
            f"ConfigMap {source}: {len(keys_in_error)} key(s) in error ({', '.join(keys_in_error)}); "
            f"the nodes would keep {keep} for them"
        )
        lines += [f"  ERROR {p.key} {p.path}: {p.reason}" for p in result.errors]
    else:
        lines.append(f"ConfigMap {source}: no key in error")
    lines += [f"  WARNING {warning}" for warning in result.warnings]
    if source != f"{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}":
        lines.append(f"  NOTE the slo service reads {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} unless configured otherwise")
    if cluster:
        count = sum(len(outcome.nodes) for outcome in result.outcomes)
        lines += ["", f"{count} node(s), {len(result.outcomes)} distinct outcome(s)"]
        for outcome in result.outcomes:
            lines.append("")
            lines += _outcome_lines(outcome)
    else:
        lines += ["", "strategies per node-selector group (no cluster read: pass --node or --nodes-from-cluster)"]
        for group in result.groups:
            selector = "" if group.node_selector is None else f" nodeSelector {_value(group.node_selector)}"
            skipped = "  [never used]" if group.skipped else ""
            lines.append(f"  {group.key} {group.entry}{selector}{skipped}")
            lines.append(f"      {_value(group.strategy, limit=100_000)}")
    return "\n".join(lines) + "\n"


def _outcome_lines(outcome: slo_preview.Outcome) -> list[str]:
    nodes = ", ".join(outcome.nodes)
    taken = [
        f"{key} {entry}" for key, entry in outcome.entries.items() if entry not in ("clusterStrategy", "applications")
    ]
    header = f"nodes {nodes}" + (f" (take {'; '.join(taken)})" if taken else "")
    if outcome.current is None:
        return [f"{header}: no NodeSLO yet; one would be created (-o yaml shows its spec)"]
    if not outcome.changes:
        return [f"{header}: no change"]
    lines = [f"{header}: {len(outcome.changes)} change(s)"]
    for change in outcome.changes:
        if change.change == "added":
            lines.append(f"  + {change.path}: {_value(change.after)}")
        elif change.change == "removed":
            lines.append(f"  - {change.path}: {_value(change.before)}")
        else:
            lines.append(f"  ~ {change.path}: {_value(change.before)} -> {_value(change.after)}")
    return lines
