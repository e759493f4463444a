"""The order the arbiter considers waiting jobs in (spec §4.4): pure.

`pod_sort_key` is Koordinator's PodSorter as one ascending key (evict first): koord priority class (Free < Batch
< Mid < Prod < none), spec.priority, kube QoS (BestEffort < Burstable < Guaranteed), koord QoS (BE < LS < LSR <
LSE = SYSTEM < none), the pod-deletion-cost annotation, the eviction-cost annotation, then newer pods first.
`sort_jobs` applies the four stable job sorts in Koordinator's order, so the last one dominates and earlier ones
break its ties: by job creation (newer first), by pod (PodSorter; jobs without a pod first), grouping jobs of one
batch `Job`'s pods next to the first of them, and by how many of that Job's pods are already migrating (more first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from schemas import kube, migration, vocab

PRIORITY_CLASS_RANK: Final = {
    vocab.PRIORITY_FREE: 1,
    vocab.PRIORITY_BATCH: 2,
    vocab.PRIORITY_MID: 3,
    vocab.PRIORITY_PROD: 4,
}
NO_PRIORITY_CLASS_RANK: Final = 5
KUBE_QOS_RANK: Final = {vocab.KUBE_QOS_BESTEFFORT: 1, vocab.KUBE_QOS_BURSTABLE: 2, vocab.KUBE_QOS_GUARANTEED: 3}
KOORD_QOS_RANK: Final = {
    vocab.QOS_BE: 1,
    vocab.QOS_LS: 2,
    vocab.QOS_LSR: 3,
    vocab.QOS_LSE: 4,
    vocab.QOS_SYSTEM: 4,
}
NO_KOORD_QOS_RANK: Final = 5

PodKey = tuple[int, int, int, int, int, int, float]


def _int_annotation(annotations: Mapping[str, str], key: str) -> int:
    try:
        return int(annotations.get(key, "0"))
    except ValueError:
        return 0


def creation_seconds(meta: kube.ObjectMeta) -> float:
    """Creation time in whole seconds (Kubernetes' resolution); 0 when absent."""
    stamp = meta.creation_timestamp
    return float(int(stamp.timestamp())) if stamp is not None else 0.0


def pod_sort_key(pod: kube.Pod) -> PodKey:
    meta = pod.metadata
    koord_qos = meta.labels.get(vocab.QOS_CLASS_LABEL, "")
    return (
        PRIORITY_CLASS_RANK.get(vocab.raw_priority_class(meta.labels, pod.spec.priority), NO_PRIORITY_CLASS_RANK),
        pod.spec.priority or 0,
        KUBE_QOS_RANK.get(kube.pod_kube_qos(pod), 0),
        KOORD_QOS_RANK.get(koord_qos, NO_KOORD_QOS_RANK),
        _int_annotation(meta.annotations, migration.ANNOTATION_DELETION_COST),
        _int_annotation(meta.annotations, migration.ANNOTATION_EVICTION_COST),
        -creation_seconds(meta),
    )


FIRST: Final[PodKey] = (-(2**63), 0, 0, 0, 0, 0, 0.0)
"""The key of a job whose pod is missing: such jobs go first."""


def batch_job_owner(pod: kube.Pod | None) -> str | None:
    """The uid of the batch `Job` controlling the pod, if one does."""
    if pod is None:
        return None
    owner = kube.controller_of(pod.metadata)
    return owner.uid if owner is not None and owner.kind == "Job" else None


def sort_jobs(
    jobs: Sequence[migration.PodMigrationJob],
    pod_of: Callable[[migration.PodMigrationJob], kube.Pod | None],
    migrating_in_job: Mapping[str, int],
) -> list[migration.PodMigrationJob]:
    """The four stable sorts of §4.4; `migrating_in_job` counts migrating pods per batch Job owner uid."""
    pods = {id(job): pod_of(job) for job in jobs}
    ordered = sorted(jobs, key=lambda job: -creation_seconds(job.metadata))
    ordered.sort(key=lambda job: FIRST if (pod := pods[id(job)]) is None else pod_sort_key(pod))
    grouped: list[migration.PodMigrationJob] = []
    placed: set[str] = set()
    by_owner: dict[str, list[migration.PodMigrationJob]] = {}
    for job in ordered:
        owner = batch_job_owner(pods[id(job)])
        if owner is not None:
            by_owner.setdefault(owner, []).append(job)
    for job in ordered:
        owner = batch_job_owner(pods[id(job)])
        if owner is None:
            grouped.append(job)
        elif owner not in placed:
            placed.add(owner)
            grouped.extend(by_owner[owner])
    grouped.sort(key=lambda job: -migrating_in_job.get(batch_job_owner(pods[id(job)]) or "", 0))
    return grouped
