"""How a passed job's pod is evicted (services.migration.evictors): the policy from the pod's or job's
`koordinator.sh/evict-policy` label or the args, the delete options from the job or the args' default (a job's
unusable ones refused with a message), and each policy's verb (Eviction, DELETE, the soft-eviction annotation)."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from schemas import k8s_verbs as verbs
from schemas import kube, migration
from services.migration import evictors
from services.migration.args import MigrationArgs
from tests.support.migration import job, pod

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def labelled(j: migration.PodMigrationJob, **meta: dict[str, str]) -> migration.PodMigrationJob:
    return msgspec.structs.replace(j, metadata=msgspec.structs.replace(j.metadata, **meta))


def with_options(j: migration.PodMigrationJob, options: dict[str, object]) -> migration.PodMigrationJob:
    return msgspec.structs.replace(j, spec=msgspec.structs.replace(j.spec, delete_options=options))


@pytest.mark.parametrize(
    ("default", "pod_label", "job_label", "expected"),
    [
        ("Eviction", None, None, "Eviction"),
        ("Delete", None, None, "Delete"),
        ("Eviction", None, "SoftEviction", "SoftEviction"),
        ("Eviction", "Delete", "SoftEviction", "Delete"),  # the pod's label first
        ("SoftEviction", "Bogus", "Delete", "SoftEviction"),  # an unknown label: the args' policy
        ("Delete", "", "Eviction", "Eviction"),  # an empty label is no label
    ],
)
def test_the_policy_is_the_pods_then_the_jobs_label_then_the_args(
    default: str, pod_label: str | None, job_label: str | None, expected: str
) -> None:
    p = pod("p", labels={evictors.LABEL_EVICT_POLICY: pod_label} if pod_label is not None else None)
    j = job("j", "p", passed=True)
    if job_label is not None:
        j = labelled(j, labels={evictors.LABEL_EVICT_POLICY: job_label})
    assert evictors.policy_for(j, p, args=MigrationArgs(eviction_policy=default)) == expected


def test_each_policy_asks_for_its_verb_with_the_delete_options() -> None:
    p = pod("p")
    j = with_options(job("j", "p", passed=True), {"gracePeriodSeconds": 5, "preconditions": {"uid": "uid-p"}})
    options = verbs.DeleteOptions(grace_period_seconds=5, preconditions=verbs.Preconditions(uid="uid-p"))
    evict = evictors.eviction(j, p, args=MigrationArgs(), now=NOW)
    assert evict == verbs.EvictPod(namespace="default", name="p", delete_options=options)
    delete = evictors.eviction(j, p, args=MigrationArgs(eviction_policy="Delete"), now=NOW)
    assert delete == verbs.DeletePod(namespace="default", name="p", delete_options=options)
    soft = evictors.eviction(j, p, args=MigrationArgs(eviction_policy="SoftEviction"), now=NOW)
    assert isinstance(soft, verbs.SoftEvictPod) and (soft.namespace, soft.name) == ("default", "p")
    assert soft.spec == verbs.SoftEvictionSpec(
        timestamp=NOW.replace(microsecond=0), delete_options=options, initiator="", reason="NotSet"
    )


def test_the_default_delete_options_apply_to_a_job_without_its_own() -> None:
    default = verbs.DeleteOptions(propagation_policy="Foreground")
    args = MigrationArgs(eviction_policy="Delete", default_delete_options=default)
    bare = evictors.eviction(job("j", "p", passed=True), pod("p"), args=args, now=NOW)
    assert isinstance(bare, verbs.DeletePod) and bare.delete_options == default
    own = with_options(job("j", "p", passed=True), {"gracePeriodSeconds": 0})
    given = evictors.eviction(own, pod("p"), args=args, now=NOW)
    assert isinstance(given, verbs.DeletePod) and given.delete_options == verbs.DeleteOptions(grace_period_seconds=0)
    nothing = evictors.eviction(job("j", "p", passed=True), pod("p"), args=MigrationArgs(), now=NOW)
    assert isinstance(nothing, verbs.EvictPod) and nothing.delete_options is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gracePeriodSeconds": -1}, "Expected `int` >= 0 - at `$.gracePeriodSeconds`"),
        ({"gracePeriodSeconds": "5"}, "Expected `int | null`, got `str`"),
        ({"ignoreStoreReadErrorWithClusterBreakingPotential": True}, "unknown field"),
        ({"propagationPolicy": "Everything"}, "Invalid enum value 'Everything'"),
        ({"orphanDependents": True, "propagationPolicy": "Orphan"}, "may not both be set"),
        ({"dryRun": ["Maybe"]}, "Invalid enum value 'Maybe'"),
        ({"preconditions": "uid-p"}, "Expected `object | null`, got `str`"),
    ],
)
def test_a_jobs_unusable_delete_options_are_refused_with_why(options: dict[str, object], message: str) -> None:
    refused = evictors.eviction(
        with_options(job("j", "p", passed=True), options), pod("p"), args=MigrationArgs(), now=NOW
    )
    assert isinstance(refused, evictors.Refusal)
    assert refused.message.startswith("spec.deleteOptions: ") and message in refused.message, refused.message


def test_soft_eviction_names_the_trigger_and_reason() -> None:
    args = MigrationArgs(eviction_policy="SoftEviction")
    annotated = labelled(
        job("j", "p", passed=True),
        annotations={evictors.ANNOTATION_EVICT_TRIGGER: "LowNodeLoad", evictors.ANNOTATION_EVICT_REASON: "hot node"},
    )
    soft = evictors.eviction(annotated, pod("p"), args=args, now=NOW)
    assert isinstance(soft, verbs.SoftEvictPod) and (soft.spec.initiator, soft.spec.reason) == (
        "LowNodeLoad",
        "hot node",
    )
    trigger_only = labelled(job("j", "p"), annotations={evictors.ANNOTATION_EVICT_TRIGGER: "LowNodeLoad"})
    assert evictors.trigger_and_reason(trigger_only) == ("LowNodeLoad", "LowNodeLoad")
    ours = labelled(job("j", "p"), annotations={evictors.ANNOTATION_DESCHEDULER_REASON: "node is overutilized"})
    assert evictors.trigger_and_reason(ours) == ("", "node is overutilized")
    # the annotation's value, as the bridge writes it: Koordinator's SoftEvictionSpec JSON
    encoded = msgspec.json.decode(msgspec.json.encode(soft.spec))
    assert encoded == {"timestamp": "2026-01-01T12:00:00Z", "initiator": "LowNodeLoad", "reason": "hot node"}


def test_a_verb_with_hostile_delete_options_does_not_decode() -> None:
    """The bridge decodes verbs strictly too: what the executor would never send is refused on arrival."""
    good = msgspec.json.encode(verbs.DeletePod(namespace="ns", name="p", delete_options=verbs.DeleteOptions()))
    assert isinstance(verbs.VERB_DECODER.decode(good), verbs.DeletePod)
    for body in (
        b'{"type": "k8s.pod.delete.v1", "namespace": "ns", "name": "p", "delete_options": {"gracePeriodSeconds": -5}}',
        b'{"type": "k8s.pod.evict.v1", "namespace": "ns", "name": "p", "delete_options": {"x": 1}}',
        b'{"type": "k8s.pod.softevict.v1", "namespace": "ns", "name": "p",'
        b' "spec": {"deleteOptions": {"dryRun": ["No"]}}}',
    ):
        with pytest.raises(msgspec.ValidationError):
            verbs.VERB_DECODER.decode(body)


def test_pods_are_unchanged_by_the_choice() -> None:
    p = pod("p")
    evictors.eviction(job("j", "p"), p, args=MigrationArgs(eviction_policy="SoftEviction"), now=NOW)
    assert p.metadata.annotations == {} and isinstance(p, kube.Pod)
