"""An assigned pod as the load-aware extender reads it, kept as compact JSON for the state export. Pure.

The extender derives an entry per assigned pod (services.loadaware.state.assigned_pod) and drops the pod; to write
its state back out as a document that replays to the same entries (services.loadaware.snapshot), each entry keeps
`encode(pod)`: identity, the Koordinator labels and estimation annotations, spec.nodeName/priority/resources, phase,
QoS and the PodScheduled and Initialized conditions — what the estimate, the class and the dating read — in
Kubernetes' field names with empty fields left out. For the one-container pod kube-scheduler sends in
tests/integration/test_loadaware_http.py (scheduler_pod, with a nodeName and a PodScheduled condition) that is 368
bytes against 656 for the whole schemas.kube.Pod's encoding: some 37 MB for 100,000 assigned pods. It decodes as a
schemas.kube.Pod.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

import msgspec

from schemas import kube, vocab
from services.loadaware import estimator

RESERVE_POD_ANNOTATION: Final = "scheduling.koordinator.sh/reserve-pod"
_READ_LABELS: Final = (vocab.PRIORITY_CLASS_LABEL, vocab.QOS_CLASS_LABEL)
_READ_ANNOTATIONS: Final = (
    estimator.ANNOTATION_SCALING_FACTORS,
    estimator.ANNOTATION_AFTER_SCHEDULED,
    estimator.ANNOTATION_AFTER_INITIALIZED,
)
_READ_CONDITIONS: Final = ("PodScheduled", "Initialized")


class _Meta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}


class _Resources(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    requests: kube.RawResourceList | None = None
    limits: kube.RawResourceList | None = None


class _Container(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    name: str = ""
    resources: _Resources = _Resources()
    restart_policy: str | None = None


class _Spec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    node_name: str = ""
    priority: int | None = None
    containers: list[_Container] | None = None
    init_containers: list[_Container] | None = None
    overhead: kube.RawResourceList | None = None
    resources: _Resources | None = None


class _Condition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    type: str = ""
    status: str = ""
    last_transition_time: dt.datetime | None = None


class _Status(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    phase: str = ""
    qos_class: str = ""
    conditions: list[_Condition] | None = None


class _Pod(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    metadata: _Meta
    spec: _Spec
    status: _Status


_ENCODER: Final = msgspec.json.Encoder()


def _resources(requirements: kube.ResourceRequirements | None) -> _Resources | None:
    return None if requirements is None else _Resources(requests=requirements.requests, limits=requirements.limits)


def _containers(containers: list[kube.Container] | None) -> list[_Container] | None:
    if containers is None:
        return None
    return [
        _Container(name=c.name, resources=_Resources(requests=c.resources.requests, limits=c.resources.limits),
                   restart_policy=c.restart_policy)
        for c in containers
    ]  # fmt: skip


def encode(pod: kube.Pod) -> bytes:
    """The fields of `pod` an assigned pod's entry reads, as JSON."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    conditions = [
        _Condition(type=c.type, status=c.status, last_transition_time=c.last_transition_time)
        for c in status.conditions or ()
        if c.type in _READ_CONDITIONS
    ]
    return _ENCODER.encode(
        _Pod(
            metadata=_Meta(
                name=meta.name,
                namespace=meta.namespace,
                uid=meta.uid,
                labels={k: v for k, v in meta.labels.items() if k in _READ_LABELS},
                annotations={k: v for k, v in meta.annotations.items() if k in _READ_ANNOTATIONS},
            ),
            spec=_Spec(
                node_name=spec.node_name,
                priority=spec.priority,
                containers=_containers(spec.containers),
                init_containers=_containers(spec.init_containers),
                overhead=spec.overhead,
                resources=_resources(spec.resources),
            ),
            status=_Status(phase=status.phase, qos_class=status.qos_class, conditions=conditions or None),
        )
    )


def is_reserve_pod(pod: kube.Pod) -> bool:
    """A Reservation's placeholder pod, which Koordinator's cache does not count."""
    return pod.metadata.annotations.get(RESERVE_POD_ANNOTATION) == "true"
