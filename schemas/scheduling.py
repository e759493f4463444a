"""The scheduling fields of Nodes and Pods that a node-fit check reads, and Kubernetes' matching of them. Pure.

schemas.kube keeps the Node and Pod fields most of koordbus reads; the descheduler's NodeFit (spec §11.6, read by
services.migration.lownodeload_balance) also needs a node's `spec.unschedulable` and `spec.taints` and a pod's
`spec.nodeSelector`, required node affinity and tolerations. `SchedulingNode` / `SchedulingPod` are kube.Node /
kube.Pod with those fields, so every kube helper still applies to them. `pod_matches_node_labels` is the
scheduler's nodeSelector-and-required-affinity rule (component-helpers MatchNodeSelectorTerms); `tolerates_taints`
is toleration matching restricted to NoSchedule and NoExecute taints, as the descheduler checks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from schemas import kube
from schemas.selectors import LabelSelector, selector_problems

NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"


class Taint(msgspec.Struct, frozen=True, kw_only=True):
    key: str = ""
    value: str = ""
    effect: str = ""


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    unschedulable: bool = False
    taints: list[Taint] | None = None


class SchedulingNode(kube.Node, frozen=True, kw_only=True):
    spec: NodeSpec = NodeSpec()


class Toleration(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


class NodeSelectorRequirement(msgspec.Struct, frozen=True, kw_only=True):
    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class NodeSelectorTerm(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    match_expressions: list[NodeSelectorRequirement] | None = None
    match_fields: list[NodeSelectorRequirement] | None = None


class NodeSelector(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    node_selector_terms: list[NodeSelectorTerm] | None = None


class NodeAffinity(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None


class Affinity(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    node_affinity: NodeAffinity | None = None


class SchedulingPodSpec(kube.PodSpec, frozen=True, kw_only=True, rename="camel"):
    node_selector: dict[str, str] | None = None
    affinity: Affinity | None = None
    tolerations: list[Toleration] | None = None


class SchedulingPod(kube.Pod, frozen=True, kw_only=True):
    spec: SchedulingPodSpec = SchedulingPodSpec()


def _requirement_matches(req: NodeSelectorRequirement, values: Mapping[str, str]) -> bool:
    """One node selector requirement against labels (or fields); an invalid one raises ValueError."""
    present, value = req.key in values, values.get(req.key, "")
    wanted = req.values or []
    if req.operator in ("In", "NotIn") and not wanted:
        raise ValueError(f"{req.operator} needs values")
    if req.operator in ("Exists", "DoesNotExist") and wanted:
        raise ValueError(f"{req.operator} takes no values")
    if req.operator == "In":
        return present and value in wanted
    if req.operator == "NotIn":
        return not present or value not in wanted
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return not present
    if req.operator in ("Gt", "Lt"):
        if len(wanted) != 1:
            raise ValueError(f"{req.operator} needs exactly one value")
        bound = int(wanted[0])
        if not present:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        return number > bound if req.operator == "Gt" else number < bound
    raise ValueError(f"unknown operator {req.operator!r}")


def _term_matches(term: NodeSelectorTerm, labels: Mapping[str, str], fields: Mapping[str, str]) -> bool:
    expressions, node_fields = term.match_expressions or [], term.match_fields or []
    if not expressions and not node_fields:
        return False  # an empty term matches no node
    try:
        for req in node_fields:
            if req.operator not in ("In", "NotIn") or len(req.values or []) != 1:
                return False
        return all(_requirement_matches(r, labels) for r in expressions) and all(
            _requirement_matches(r, fields) for r in node_fields
        )
    except ValueError:
        return False  # a term that does not parse matches nothing


def pod_matches_node_labels(pod: SchedulingPod, node: SchedulingNode) -> bool:
    """The pod's nodeSelector and its required node affinity both accept the node."""
    labels = node.metadata.labels
    if any(labels.get(k) != v for k, v in (pod.spec.node_selector or {}).items()):
        return False
    affinity = pod.spec.affinity
    if affinity is None or affinity.node_affinity is None:
        return True
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if required is None:
        return True
    fields = {"metadata.name": node.metadata.name}
    return any(_term_matches(term, labels, fields) for term in required.node_selector_terms or [])


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' Toleration.ToleratesTaint (without the Gt/Lt comparison operators)."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def tolerates_taints(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> bool:
    """Every NoSchedule / NoExecute taint is tolerated by some toleration."""
    listed = list(tolerations)
    return all(
        any(tolerates(t, taint) for t in listed) for taint in taints if taint.effect in (NO_SCHEDULE, NO_EXECUTE)
    )


def label_selector_error(selector: LabelSelector | None) -> str | None:
    """Why metav1.LabelSelectorAsSelector would refuse the selector, or None (an absent selector is fine)."""
    if selector is None:
        return None
    problems = selector_problems(selector)
    return "; ".join(problems) if problems else None
