"""The order the arbiter considers waiting jobs in (spec §4.4): pure.

`pod_sort_key` is Koordinator's PodSorter as one ascending key (evict first): koord priority class (Free < Batch
< Mid < Prod < none), spec.priority, kube QoS (BestEffort < Burstable < Guaranteed), koord QoS (BE < LS < LSR <
LSE = SYSTEM < none), the pod-deletion-cost annotation, the eviction-cost annotation, then newer pods first.
`sort_jobs` applies the four stable job sorts in Koordinator's order, so the last one dominates and earlier ones
break its ties: by job creation (newer first), by pod (PodSorter; jobs without a pod first), grouping jobs of one
batch `Job`'s pods next to the first of them, and by how many of that Job's pods are already migrating (more first).
`arrange` is the same over anything with a precomputed key: the arbiter sorts its per-job records with it, their
keys kept from round to round (tests/unit/test_migration_arbiter_rounds.py holds it to the four sorts written out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

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


def batch_job_owner(owner: kube.OwnerReference | None) -> str | None:
    """The uid of the batch `Job` a pod's controller reference names, if it names one."""
    return owner.uid if owner is not None and owner.kind == "Job" else None


T = TypeVar("T")


def sort_jobs(
    jobs: Sequence[migration.PodMigrationJob],
    pod_keys: Mapping[str, PodKey | None],
    batch_owners: Mapping[str, str | None],
    migrating_in_job: Mapping[str, int],
) -> list[migration.PodMigrationJob]:
    """The four stable sorts of §4.4. `pod_keys` and `batch_owners` map each job's name to its pod's sort key
    (None: the pod is missing) and to the uid of the batch Job controlling that pod; `migrating_in_job` counts
    migrating pods per such uid."""

    def key(job: migration.PodMigrationJob) -> tuple[PodKey, float]:
        pod_key = pod_keys.get(job.metadata.name)
        return (FIRST if pod_key is None else pod_key, -creation_seconds(job.metadata))

    return arrange(
        jobs, key=key, batch_owner=lambda job: batch_owners.get(job.metadata.name), migrating_in_job=migrating_in_job
    )


def arrange(
    items: Iterable[T],
    *,
    key: Callable[[T], tuple[Any, float]],
    batch_owner: Callable[[T], str | None],
    migrating_in_job: Mapping[str, int],
) -> list[T]:
    """§4.4's order of `items`. `key`: (the pod's sort key, or anything ordered the same way, FIRST-like for a
    missing pod; minus the job's creation seconds); `batch_owner`: the uid of the batch Job controlling the pod.

    The first two stable sorts (newer jobs first, then by pod) are one stable sort by (pod, newer job first): the
    ties the pod sort leaves keep the creation order, whose own ties keep the given order."""
    ordered = sorted(items, key=key)
    owners = [batch_owner(item) for item in ordered]
    if any(owner is not None for owner in owners):
        by_owner: dict[str, list[T]] = {}
        for item, owner in zip(ordered, owners, strict=True):
            if owner is not None:
                by_owner.setdefault(owner, []).append(item)
        grouped: list[T] = []
        for item, owner in zip(ordered, owners, strict=True):
            if owner is None:
                grouped.append(item)
            elif (group := by_owner.pop(owner, None)) is not None:  # the first of its Job: the whole group here
                grouped.extend(group)
        ordered = grouped
    if migrating_in_job:
        ordered.sort(key=lambda item: -migrating_in_job.get(batch_owner(item) or "", 0))
    return ordered
