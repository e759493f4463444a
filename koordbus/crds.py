"""`koordbus crds`: the CustomResourceDefinitions of the Koordinator kinds koordbus reads and writes, generated from
koordbus' own schemas.

The Helm chart ships the output in deploy/helm/koordbus/crds/ (tests/deploy/test_crds.py fails when the checked-in
files differ from a fresh run). Each kind's schema comes from the msgspec structs koordbus decodes and renders its
objects with, or for NodeSLO from the field tables (services.common.sloconfig) every NodeSLO is checked against,
turned into a Kubernetes structural schema by koordbus.crd_schema. Where Koordinator's object carries fields our
structs do not model, the struct that leaves them out is listed in `OPEN_STRUCTS` with the reason, and its object
keeps unknown fields instead of pruning them. Group, version, names, scope and the status subresource are
Koordinator's (its CRDs are what clusters already run), so an object valid for Koordinator's CRD stays valid for
ours. Rendering is pure; `run` writes the files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import yaml

from koordbus import crd_schema
from schemas import migration, nodemetric_json, quota

Json = dict[str, Any]

# --- NodeMetric as koordbus writes and reads it: the reader's structs, plus what only the writer
# (schemas.koordinator.nodemetric_status_to_json) puts in.


NodeMetricSpec = nodemetric_json.NodeMetricSpec
AggregatedUsage = nodemetric_json.AggregatedUsage


class NodeMetricInfo(nodemetric_json.NodeMetricInfoJSON, frozen=True, kw_only=True, rename="camel"):
    """The node's and the system's usage, latest and aggregated."""

    aggregated_system_usages: list[AggregatedUsage] | None = None


class NodeMetricStatus(nodemetric_json.NodeMetricStatusJSON, frozen=True, kw_only=True, rename="camel"):
    """NodeMetricStatus: what koordlet (or koordbus' nodemetric service through the bridge) last reported."""

    node_metric: NodeMetricInfo | None = None
    # Readers skip a `null` entry (Go's nil); the object's schema admits none.
    pods_metric: list[nodemetric_json.PodMetricJSON] | None = None  # type: ignore[assignment]


class NodeMetric(msgspec.Struct, frozen=True, kw_only=True):
    """NodeMetric: one node's resource usage, reported for the schedulers and the batch/mid calculation."""

    metadata: dict[str, Any] = {}
    spec: NodeMetricSpec | None = None
    status: NodeMetricStatus | None = None


OPEN_STRUCTS: Final[Mapping[type, str]] = {
    # Each struct here leaves out fields Koordinator's object has; its object keeps unknown fields (the declared
    # ones are still checked), so a cluster's existing objects are neither refused nor pruned.
    nodemetric_json.ResourceMapJSON: "Koordinator's ResourceMap also lists devices (GPU, RDMA), which koordbus "
    "neither reads nor writes.",
    NodeMetricInfo: "koordlet also reports numaUsages, which koordbus does not read.",
    NodeMetricStatus: "koordlet also reports prodPeakMetric, which koordbus does not read.",
    nodemetric_json.PodMetricJSON: "koordlet's pod entries carry extensions, open in Koordinator's schema too.",
    migration.ObjectReference: "A Kubernetes ObjectReference also has fieldPath and resourceVersion, which the "
    "migration service ignores.",
    migration.PodMigrationJobStatus: "Koordinator's migration controller also records preempted pods and their "
    "reservations, which koordbus does not do.",
}


def struct_schema(struct: type[msgspec.Struct]) -> Json:
    """The structural schema of a struct and everything it holds, the structs of OPEN_STRUCTS kept open."""
    return crd_schema.struct_schema(struct, open_structs=OPEN_STRUCTS)


# --- the kinds


@dataclass(frozen=True, kw_only=True)
class CustomResource:
    """One kind: its API names (Koordinator's) and where its schema comes from."""

    group: str
    version: str
    kind: str
    plural: str
    description: str
    scope: Literal["Cluster", "Namespaced"]
    status_subresource: bool
    schema: Callable[[], Json]
    short_names: tuple[str, ...] = ()
    annotations: Mapping[str, str] | None = None

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def filename(self) -> str:
        return f"{self.group}_{self.plural}.yaml"


def _from_struct(struct: type[msgspec.Struct]) -> Callable[[], Json]:
    return lambda: struct_schema(struct)


RESOURCES: Final = (
    CustomResource(
        group="slo.koordinator.sh",
        version="v1alpha1",
        kind="NodeMetric",
        plural="nodemetrics",
        description=(
            "One node's resource usage (latest and aggregated, per pod and for the system), written by koordlet "
            "or by koordbus' nodemetric service through its Kubernetes bridge; read by the schedulers and the "
            "batch/mid calculation."
        ),
        scope="Cluster",
        status_subresource=True,
        schema=_from_struct(NodeMetric),
    ),
    CustomResource(
        group="slo.koordinator.sh",
        version="v1alpha1",
        kind="NodeSLO",
        plural="nodeslos",
        description=(
            "The QoS strategies of one node (thresholds, resource QoS per class, CPU burst, system settings, host"
            " applications), rendered from slo-controller-config and applied by the node's agent."
        ),
        scope="Cluster",
        status_subresource=True,
        schema=crd_schema.nodeslo_schema,
    ),
    CustomResource(
        group="scheduling.sigs.k8s.io",
        version="v1alpha1",
        kind="ElasticQuota",
        plural="elasticquotas",
        description=(
            "A node of an elastic quota tree: guaranteed (min) and limit (max) resources, the runtime share "
            "koord-scheduler computes in its annotations, and the resources in use."
        ),
        scope="Namespaced",
        status_subresource=False,
        schema=_from_struct(quota.ElasticQuota),
        # A group under k8s.io is protected: the API server refuses its CRD without this annotation. The API is
        # scheduler-plugins', approved there; Koordinator's CRD carries the same.
        annotations={"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/scheduler-plugins/pull/52"},
    ),
    CustomResource(
        group="quota.koordinator.sh",
        version="v1alpha1",
        kind="ElasticQuotaProfile",
        plural="elasticquotaprofiles",
        description=(
            "Generates an ElasticQuota whose min and max are the resources of the nodes its selector picks "
            "(scaled by resourceRatio)."
        ),
        scope="Namespaced",
        status_subresource=False,
        schema=_from_struct(quota.ElasticQuotaProfile),
        short_names=("eqp",),
    ),
    CustomResource(
        group="scheduling.koordinator.sh",
        version="v1alpha1",
        kind="PodMigrationJob",
        plural="podmigrationjobs",
        description=(
            "A request to move one pod off its node (evict directly, or reserve room elsewhere first), admitted "
            "by the migration arbiter and executed by the migration controller."
        ),
        scope="Cluster",
        status_subresource=True,
        schema=_from_struct(migration.PodMigrationJob),
        short_names=("pmj",),
    ),
)
"""Reservation (scheduling.koordinator.sh) is not here: koordbus creates one for a ReservationFirst migration but
models none of it (the body is a pod template), and only koord-scheduler, which brings its CRD, acts on it."""


def openapi_schema(resource: CustomResource) -> Json:
    """The version's openAPIV3Schema: apiVersion and kind as strings, metadata left to the API server."""
    schema = resource.schema()
    properties = dict(schema.get("properties", {}))
    properties.pop("apiVersion", None)
    properties.pop("kind", None)
    properties["metadata"] = {"type": "object"}  # the API server validates ObjectMeta itself
    top: Json = {"description": resource.description, "type": "object"}
    top["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, **properties}
    top["properties"] = dict(sorted(top["properties"].items()))
    return top


def crd(resource: CustomResource) -> Json:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    metadata: Json = {"name": resource.name}
    if resource.annotations:
        metadata["annotations"] = dict(resource.annotations)
    names: Json = {
        "kind": resource.kind,
        "listKind": f"{resource.kind}List",
        "plural": resource.plural,
        "singular": resource.kind.lower(),
    }
    if resource.short_names:
        names["shortNames"] = list(resource.short_names)
    version: Json = {
        "name": resource.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": openapi_schema(resource)},
    }
    if resource.status_subresource:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {"group": resource.group, "names": names, "scope": resource.scope, "versions": [version]},
    }


COMMAND: Final = "koordbus crds --out deploy/helm/koordbus/crds"
HEADER: Final = f"# Generated by `{COMMAND}` from koordbus' own schemas (koordbus/crds.py): do not edit.\n"


def render(resource: CustomResource) -> str:
    return HEADER + yaml.safe_dump(crd(resource), sort_keys=False, width=120, allow_unicode=True)


def render_all() -> dict[str, str]:
    """File name → YAML text, every kind."""
    return {resource.filename: render(resource) for resource in RESOURCES}


# --- the command


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "crds",
        help="write the CRDs of the Koordinator kinds koordbus uses",
        description="Generate the CustomResourceDefinitions of the Koordinator kinds koordbus reads and writes "
        "(" + ", ".join(r.kind for r in RESOURCES) + ") from koordbus' own schemas. Names, scope and "
        "subresources are Koordinator's, so the CRDs can stand in for Koordinator's on a cluster without it.",
        epilog=f"The Helm chart ships them: after changing a schema, run `{COMMAND}` and commit the result "
        "(tests/deploy/test_crds.py fails until you do).",
    )
    p.add_argument(
        "--out", metavar="DIR", help="write one <group>_<plural>.yaml per kind into DIR (default: all to stdout)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="with --out: write nothing, exit 1 and name the files that differ from a fresh generation",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    files = render_all()
    if args.out is None:
        if args.check:
            sys.stderr.write("koordbus crds: --check needs --out DIR\n")
            return 2
        sys.stdout.write("---\n".join(files.values()))
        return 0
    out = Path(args.out)
    if args.check:
        stale = [name for name, text in files.items() if not _same(out / name, text)]
        for name in stale:
            sys.stderr.write(f"koordbus crds: {out / name} is out of date; run `{COMMAND}`\n")
        return 1 if stale else 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return 0


def _same(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") == text
    except OSError:
        return False
