"""Rounds over one kept ClusterView give what a fresh, memo-free round gives (spec §4.4–4.5).

The arbiter keeps per-job work between rounds on the view (each job's facts, its place in the order, its static
verdict). `reference_round` here is the round written out plainly: the four stable sorts of §4.4 one after the
other and every filter evaluated afresh. Random sequences of job changes (new, gone, re-created under the same name,
phase and annotation changes, pause) must never make the kept view's round differ from it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import kube, migration
from services.migration import arbiter, filters, order
from services.migration.args import MigrationArgs
from tests.support.migration import job, pod, workload

NODES = ["n1", "n2", "n3"]
NAMESPACES = ["a", "b"]
OWNERS: list[tuple[str | None, str]] = [
    ("rs-1", "ReplicaSet"),
    ("rs-2", "ReplicaSet"),
    ("job-x", "Job"),
    ("job-y", "Job"),
    ("gone-rs", "ReplicaSet"),  # no such workload: the pod fails ExpectedReplicas
    (None, "ReplicaSet"),  # bare
]
WORKLOADS = [workload("rs-1", 10), workload("rs-2", 3), workload("job-x", 4), workload("job-y", 6)]
ANNOTATIONS: list[dict[str, str]] = [
    {},
    {},
    {},
    {migration.ANNOTATION_EVICT: "true"},  # skips every filter
    {migration.ANNOTATION_EVICTION_COST: "2147483647"},  # never evicted: the job fails
]
CREATED = ["2026-01-01T11:00:00Z", "2026-01-01T11:30:00Z", "2026-01-01T11:59:00Z"]


def reference_round(
    jobs: list[migration.PodMigrationJob],
    pods: list[kube.Pod],
    workloads: list[migration.Workload],
    args: MigrationArgs,
) -> arbiter.Round:
    """One round with nothing kept: pods looked up, sorted and filtered from scratch (nodeFit off)."""
    by_key = {kube.pod_key(p): p for p in pods}
    by_uid = {p.metadata.uid: p for p in by_key.values() if p.metadata.uid}
    known = {w.uid: w for w in workloads}
    views = filters.workload_views(known, by_key, args)

    def pod_of(j: migration.PodMigrationJob) -> kube.Pod | None:
        ref = j.spec.pod_ref
        if ref is None:
            return None
        if ref.uid and ref.uid in by_uid:
            return by_uid[ref.uid]
        return by_key.get(f"{ref.namespace}/{ref.name}")

    def key_of(j: migration.PodMigrationJob) -> str:
        found = pod_of(j)
        if found is not None:
            return kube.pod_key(found)
        ref = j.spec.pod_ref
        return f"{ref.namespace}/{ref.name}" if ref is not None else ""

    def owner_of(j: migration.PodMigrationJob) -> kube.OwnerReference | None:
        found = pod_of(j)
        return kube.controller_of(found.metadata) if found is not None else None

    migrating = filters.Migrating()
    in_batch_job: dict[str, int] = {}
    waiting = []
    for j in jobs:
        if migration.is_migrating(j):
            ref = j.spec.pod_ref
            migrating.add(key_of(j), pod_of(j), ref.namespace if ref else "", owner=owner_of(j))
            batch = order.batch_job_owner(owner_of(j))
            if batch is not None:
                in_batch_job[batch] = in_batch_job.get(batch, 0) + 1
        elif migration.is_waiting(j):
            waiting.append(j)
        elif (
            j.status.phase == migration.PHASE_SUCCEEDED
            and j.status.reason != "DryRun"
            and j.spec.pod_ref is not None
            and j.spec.pod_ref.uid
            and (gone := by_uid.get(j.spec.pod_ref.uid)) is not None
            and filters.active(gone)
        ):
            owner = kube.controller_of(gone.metadata)
            if owner is not None:
                migrating.by_workload.setdefault(owner.uid, set()).add(kube.pod_key(gone))

    def pod_key(j: migration.PodMigrationJob) -> order.PodKey:
        found = pod_of(j)
        return order.pod_sort_key(found) if found is not None else order.FIRST

    def batch(j: migration.PodMigrationJob) -> str | None:
        return order.batch_job_owner(owner_of(j))

    # §4.4: four stable sorts, the last dominating
    ordered = sorted(waiting, key=lambda j: -order.creation_seconds(j.metadata))
    ordered = sorted(ordered, key=pod_key)
    grouped: list[migration.PodMigrationJob] = []
    for j in ordered:
        if j in grouped:
            continue
        owner = batch(j)
        grouped += [j] if owner is None else [o for o in ordered if batch(o) == owner]
    grouped = sorted(grouped, key=lambda j: -in_batch_job.get(batch(j) or "", 0))

    result = arbiter.Round()
    for j in grouped:
        name = j.metadata.name
        result.order.append(name)
        found, owner, key = pod_of(j), owner_of(j), key_of(j)
        if found is None:
            result.decisions.append(arbiter.Decision(name, "passed", message="pod not found: the reconcile fails it"))
            migrating.add(key, None, j.spec.pod_ref.namespace if j.spec.pod_ref else "", owner=None)
            continue
        workload_view = views.get(owner.uid) if owner is not None else None
        owner_known = owner is None or owner.uid in known
        verdict = filters.non_retryable(found, args, workload_view, owner=owner, owner_known=owner_known)
        if verdict is not None:
            result.decisions.append(arbiter.Decision(name, "failed", verdict.filter, verdict.message))
            continue
        verdict = filters.retryable(found, args, migrating, workload_view, owner=owner, owner_known=owner_known)
        if verdict is not None:
            result.decisions.append(arbiter.Decision(name, "waiting", verdict.filter, verdict.message))
            continue
        result.decisions.append(arbiter.Decision(name, "passed"))
        migrating.add(key, found, found.metadata.namespace, owner=owner)
    return result


@st.composite
def pods_of(draw: st.DrawFn) -> list[kube.Pod]:
    pods = []
    for i in range(draw(st.integers(1, 14))):
        owner, kind = draw(st.sampled_from(OWNERS))
        pods.append(
            pod(
                f"p{i}",
                namespace=draw(st.sampled_from(NAMESPACES)),
                node=draw(st.sampled_from(NODES)),
                owner=owner,
                owner_kind=kind,
                ready=draw(st.booleans()),
                phase=draw(st.sampled_from(["Running", "Running", "Running", "Succeeded"])),
                priority=draw(st.sampled_from([None, 5500, 9100])),
                created=draw(st.sampled_from(["2026-01-01T09:00:00Z", "2026-01-01T10:00:00Z"])),
                annotations=draw(st.sampled_from(ANNOTATIONS)),
            )
        )
    return pods


def new_job(draw: st.DrawFn, name: str, pod_count: int) -> migration.PodMigrationJob:
    target = draw(st.integers(0, pod_count))  # pod_count: a pod that does not exist
    namespace = draw(st.sampled_from(NAMESPACES))
    made = job(name, f"p{target}", namespace=namespace, created=draw(st.sampled_from(CREATED)))
    if draw(st.booleans()):  # a reference by name only (no uid)
        ref = msgspec.structs.replace(made.spec.pod_ref, uid="")  # type: ignore[type-var]
        made = msgspec.structs.replace(made, spec=msgspec.structs.replace(made.spec, pod_ref=ref))
    return made


def changed(draw: st.DrawFn, current: migration.PodMigrationJob) -> migration.PodMigrationJob:
    how = draw(st.sampled_from(["phase", "passed", "paused", "created", "same"]))
    if how == "phase":
        phase = draw(st.sampled_from(["", "Pending", "Running", "Succeeded", "Failed"]))
        reason = draw(st.sampled_from(["", "DryRun"]))
        return msgspec.structs.replace(current, status=migration.PodMigrationJobStatus(phase=phase, reason=reason))
    if how == "passed":
        annotations = dict(current.metadata.annotations)
        annotations[migration.ANNOTATION_PASSED_ARBITRATION] = draw(st.sampled_from(["true", "false"]))
        return msgspec.structs.replace(
            current, metadata=msgspec.structs.replace(current.metadata, annotations=annotations)
        )
    if how == "paused":
        spec = msgspec.structs.replace(current.spec, paused=not current.spec.paused)
        return msgspec.structs.replace(current, spec=spec)
    if how == "created":
        stamp = dt.datetime.fromisoformat(draw(st.sampled_from(CREATED)))
        return msgspec.structs.replace(
            current, metadata=msgspec.structs.replace(current.metadata, creation_timestamp=stamp)
        )
    return msgspec.structs.replace(current)  # equal, but another object


LIMITS: dict[str, list[Any]] = {
    "maxMigratingGlobally": [None, 0, 2, 5],
    "maxMigratingPerNode": [None, 1, 2],
    "maxMigratingPerNamespace": [None, 1, 4],
    "maxMigratingPerWorkload": [None, 1, 2, "50%"],
    "maxUnavailablePerWorkload": [None, 1, 3, "50%"],
    "skipEvictionGates": [[], ["MaxMigratingPerNode"], ["ExpectedReplicas", "MaxUnavailablePerWorkload"]],
}


def draw_args(draw: st.DrawFn) -> MigrationArgs:
    given = {name: draw(st.sampled_from(choices)) for name, choices in LIMITS.items()}
    given["evictAllBarePods"] = draw(st.booleans())
    given["skipCheckExpectedReplicas"] = draw(st.sampled_from([None, True]))
    return msgspec.convert({k: v for k, v in given.items() if v is not None}, MigrationArgs)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), pods=pods_of())
def test_rounds_over_a_kept_view_match_a_fresh_round(data: st.DataObject, pods: list[kube.Pod]) -> None:
    draw = data.draw
    args = draw_args(draw)
    view = arbiter.ClusterView.build(pods, WORKLOADS, args)  # the view holds workload limits of its args
    jobs: dict[str, migration.PodMigrationJob] = {}
    serial = 0
    for _ in range(draw(st.integers(1, 6))):
        for _ in range(draw(st.integers(0, 8))):
            action = draw(st.sampled_from(["new", "new", "change", "change", "drop", "recreate"]))
            if action == "new" or not jobs:
                jobs[f"j{serial}"] = new_job(draw, f"j{serial}", len(pods))
                serial += 1
                continue
            name = draw(st.sampled_from(sorted(jobs)))
            if action == "change":
                jobs[name] = changed(draw, jobs[name])
            elif action == "drop":
                del jobs[name]
            else:  # the same name, another pod: dropped and created again (it goes last)
                del jobs[name]
                jobs[name] = new_job(draw, name, len(pods))
        kept = arbiter.arbitrate(list(jobs.values()), view, args)
        fresh = reference_round(list(jobs.values()), pods, WORKLOADS, args)
        assert kept.order == fresh.order
        assert kept.decisions == fresh.decisions
        # What the service does next: the passed jobs carry the annotation in the next round.
        for name in kept.names("passed"):
            passed = jobs[name]
            annotations = {**passed.metadata.annotations, migration.ANNOTATION_PASSED_ARBITRATION: "true"}
            jobs[name] = msgspec.structs.replace(
                passed, metadata=msgspec.structs.replace(passed.metadata, annotations=annotations)
            )


def test_the_kept_order_follows_a_change_of_the_migrating_counts_alone() -> None:
    """The waiting jobs are the very same objects in both rounds; only a migrating job of batch Job job-y finishes
    in between, so job-y's waiting job no longer goes first (the fourth sort)."""
    pods = [
        pod("px", owner="job-x", owner_kind="Job", priority=5500),
        pod("py", owner="job-y", owner_kind="Job", priority=9100),
        pod("pm", owner="job-y", owner_kind="Job", node="n2"),
    ]
    args = MigrationArgs()
    view = arbiter.ClusterView.build(pods, WORKLOADS, args)
    waiting = [job("wx", "px"), job("wy", "py")]
    running = job("m", "pm", phase="Running")
    first = arbiter.arbitrate([*waiting, running], view, args)
    assert first.order == reference_round([*waiting, running], pods, WORKLOADS, args).order == ["wy", "wx"]
    done = msgspec.structs.replace(running, status=migration.PodMigrationJobStatus(phase="Succeeded"))
    second = arbiter.arbitrate([*waiting, done], view, args)
    assert second.order == reference_round([*waiting, done], pods, WORKLOADS, args).order == ["wx", "wy"]
