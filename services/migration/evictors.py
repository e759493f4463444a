"""How a passed job's pod is evicted (spec §4.6 step 9, Koordinator's migration evictors): pure.

`eviction(job, pod, args=, now=)` answers the cluster verb the executor (services.migration.executor) asks the
bridge for: the policy is the pod's `koordinator.sh/evict-policy` label, else the job's, else args.evictionPolicy
(an unknown label value falls back to the args', as Koordinator's interpreter does), and the delete options are the
job's spec.deleteOptions, else args.defaultDeleteOptions:

* `Eviction` — a policy/v1 Eviction with the delete options (PodDisruptionBudgets hold);
* `Delete` — a DELETE of the pod with the delete options (no budget is asked);
* `SoftEviction` — the pod's `scheduling.koordinator.sh/soft-eviction` annotation set to {timestamp, deleteOptions,
  initiator: the job's evict-trigger annotation, reason: its evict-reason (else the descheduler reason koordbus's
  own round writes, else the trigger, else "NotSet")}; the
  pod goes when whatever watches for the annotation deletes it.

A job's deleteOptions come from the cluster or the API as written, so they are decoded strictly here: unusable ones
(an unknown field, a negative grace period, …) are a `Refusal` whose message says why; the executor fails the job
with Koordinator's reason FailedEvict rather than send them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Final

import msgspec

from schemas import k8s_verbs as verbs
from schemas import kube, migration
from services.migration.args import EVICTION_POLICIES, MigrationArgs

LABEL_EVICT_POLICY: Final = "koordinator.sh/evict-policy"
ANNOTATION_EVICT_TRIGGER: Final = "koordinator.sh/evict-trigger"
ANNOTATION_EVICT_REASON: Final = "koordinator.sh/evict-reason"
ANNOTATION_DESCHEDULER_REASON: Final = "descheduler.koordinator.sh/reason"
"""Where koordbus's own descheduling round writes its reason (services.migration.service)."""
REASON_FAILED_EVICT: Final = "FailedEvict"


@dataclass(frozen=True)
class Refusal:
    """Why the pod cannot be evicted as the job says."""

    message: str


def policy_for(job: migration.PodMigrationJob, pod: kube.Pod, *, args: MigrationArgs) -> str:
    """The eviction policy for this job: the pod's label, the job's label, args.evictionPolicy."""
    for labels in (pod.metadata.labels, job.metadata.labels):
        chosen = labels.get(LABEL_EVICT_POLICY, "")
        if chosen:
            return chosen if chosen in EVICTION_POLICIES else args.eviction_policy
    return args.eviction_policy


def delete_options_for(job: migration.PodMigrationJob, *, args: MigrationArgs) -> verbs.DeleteOptions | Refusal | None:
    """The job's deleteOptions decoded strictly, else the args' default (None: the API server's defaults)."""
    if job.spec.delete_options is None:
        return args.default_delete_options
    try:
        return msgspec.convert(job.spec.delete_options, verbs.DeleteOptions)
    except (msgspec.ValidationError, ValueError) as err:
        return Refusal(f"spec.deleteOptions: {err}")


def trigger_and_reason(job: migration.PodMigrationJob) -> tuple[str, str]:
    annotations = job.metadata.annotations
    trigger = annotations.get(ANNOTATION_EVICT_TRIGGER, "")
    reason = annotations.get(ANNOTATION_EVICT_REASON, "") or annotations.get(ANNOTATION_DESCHEDULER_REASON, "")
    return trigger, reason or trigger or "NotSet"


def eviction(
    job: migration.PodMigrationJob, pod: kube.Pod, *, args: MigrationArgs, now: dt.datetime
) -> verbs.EvictPod | verbs.DeletePod | verbs.SoftEvictPod | Refusal:
    """The verb that evicts `pod` for `job`, or why it cannot be asked for."""
    options = delete_options_for(job, args=args)
    if isinstance(options, Refusal):
        return options
    namespace, name = pod.metadata.namespace, pod.metadata.name
    match policy_for(job, pod, args=args):
        case "Delete":
            return verbs.DeletePod(namespace=namespace, name=name, delete_options=options)
        case "SoftEviction":
            trigger, reason = trigger_and_reason(job)
            spec = verbs.SoftEvictionSpec(
                timestamp=now.replace(microsecond=0), delete_options=options, initiator=trigger, reason=reason
            )
            return verbs.SoftEvictPod(namespace=namespace, name=name, spec=spec)
        case _:
            return verbs.EvictPod(namespace=namespace, name=name, delete_options=options)
