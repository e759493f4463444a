"""The arbiter's folded state and the intake pre-checks: passes are remembered (never arbitrated again), failures
and rejections end jobs with Koordinator's reasons, waiting jobs are told only when their filter changes, a replay
of the events gives the same state, and intake refuses duplicates, bad pod references and foreign schedulers."""

from __future__ import annotations

import datetime as dt

import msgspec

from schemas import migration
from schemas import migration_events as ev
from services.migration import arbiter
from services.migration.args import MigrationArgs
from services.migration.state import MigrationState, intake
from tests.support.migration import job, pod, workload

NOW = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)


def requested(name: str, pod_name: str) -> ev.MigrationRequested:
    return ev.MigrationRequested(job=job(name, pod_name), source="api", actor="alice", time=NOW)


def test_a_round_is_told_once_and_folded_back() -> None:
    state = MigrationState()
    for i in range(4):
        state.apply(requested(f"j{i}", f"p{i}"))
    pods = [pod(f"p{i}", node="n1") for i in range(4)]
    args = MigrationArgs()
    first = arbiter.arbitrate_objects(state.jobs.values(), pods, [workload()], args)
    told = state.to_tell(first)
    assert sorted(d.outcome for d in told) == ["passed", "passed", "waiting", "waiting"]
    event = ev.MigrationRound(round=1, decisions=told, time=NOW)
    state.apply(event)
    log: list[ev.MigrationEvent] = [*(requested(f"j{i}", f"p{i}") for i in range(4)), event]
    assert len(state.passed()) == 2 and len(state.waiting()) == 2
    second = arbiter.arbitrate_objects(state.jobs.values(), pods, [workload()], args)
    assert set(second.order) == set(state.waiting())  # passed jobs are never considered again
    assert state.to_tell(second) == []  # still waiting on the same filters: nothing new to tell
    replayed = MigrationState()
    for event in log:
        replayed.apply(ev.decode_migration_event(ev.encode_migration_event(event)))
    assert replayed.jobs == state.jobs and replayed.waiting_filter == state.waiting_filter and replayed.round == 1


def test_failures_rejections_and_aborts_end_jobs() -> None:
    state = MigrationState()
    for name in ("a", "b", "c"):
        state.apply(requested(name, f"p-{name}"))
    decisions = [
        ev.JobDecision(job="a", outcome="failed", filter="BarePods", reason="ForbiddenMigratePod", message="bare"),
        ev.JobDecision(job="b", outcome="rejected", reason=migration.REASON_INVALID_POD_REF, message="x"),
    ]
    state.apply(ev.MigrationRound(round=1, decisions=decisions, time=NOW))
    state.apply(ev.MigrationAborted(job="c", actor="bob", time=NOW))
    late = [ev.JobDecision(job="c", outcome="passed")]  # too late: c is aborted
    state.apply(ev.MigrationRound(round=2, decisions=late, time=NOW))
    phases = {name: (j.status.phase, j.status.reason) for name, j in state.jobs.items()}
    assert phases == {
        "a": ("Failed", "ForbiddenMigratePod"),
        "b": ("Failed", "InvalidPodRef"),
        "c": ("Aborted", "Aborted"),
    }
    assert state.waiting() == [] and state.passed() == set()


def test_a_collected_job_is_forgotten_and_its_name_may_be_asked_for_again() -> None:
    state = MigrationState()
    log: list[ev.MigrationEvent] = [
        requested("done", "p1"),
        requested("busy", "p2"),
        ev.MigrationRound(round=1, decisions=[ev.JobDecision(job="done", outcome="passed")], time=NOW),
        ev.MigrationPhaseChanged(job="done", phase=migration.PHASE_SUCCEEDED, time=NOW),
        ev.MigrationCollected(job="done", time=NOW),
        ev.MigrationCollected(job="busy", time=NOW),  # not finished: kept
        ev.MigrationRound(round=2, decisions=[ev.JobDecision(job="done", outcome="waiting")], time=NOW),  # late
        requested("done", "p1"),  # the same name again: a new job, new to the arbiter
    ]
    for event in log:
        state.apply(event)
    assert set(state.jobs) == {"done", "busy"}
    assert migration.phase_of(state.jobs["done"]) == migration.PHASE_PENDING
    assert not migration.passed_arbitration(state.jobs["done"])
    assert state.new_jobs() == ["busy", "done"] and "done" not in state.told  # in the order they arrived
    replayed = MigrationState()
    for event in log:
        replayed.apply(ev.decode_migration_event(ev.encode_migration_event(event)))
    assert (replayed.jobs, replayed.requested_at, replayed.told) == (state.jobs, state.requested_at, state.told)


def test_collected_jobs_leave_nothing_behind() -> None:
    state = MigrationState()
    for i in range(1000):
        name = f"j{i}"
        state.apply(requested(name, f"p{i}"))
        state.apply(ev.MigrationRound(round=i, decisions=[ev.JobDecision(job=name, outcome="waiting")], time=NOW))
        state.apply(ev.MigrationAborted(job=name, actor="test", time=NOW))
        state.apply(ev.MigrationCollected(job=name, time=NOW))
    assert (state.jobs, state.requested_at, state.waiting_filter, state.told) == ({}, {}, {}, set())


def test_intake_pre_checks() -> None:
    args = MigrationArgs()
    p = pod("p")
    held = [job("old", "p", phase="Running")]
    assert intake(job("new", "p"), p, held, args) == (
        "ForbiddenMigratePod",
        "pod default/p already has an active migration job old",
    )
    assert intake(job("new", "p"), p, [job("old", "p", phase="Succeeded")], args) is None
    other_scheduler = pod("q", schedulerName="default-scheduler")
    reason, message = intake(job("j", "q"), other_scheduler, [], args) or ("", "")
    assert reason == "ForbiddenMigratePod" and "default-scheduler" in message
    evict_directly = msgspec.structs.replace(
        job("j", "q"), spec=msgspec.structs.replace(job("j", "q").spec, mode="EvictDirectly")
    )
    assert intake(evict_directly, other_scheduler, [], args) is None
    no_ref = msgspec.structs.replace(job("j", "q"), spec=migration.PodMigrationJobSpec())
    assert intake(no_ref, None, [], args) == ("InvalidPodRef", "spec.podRef needs the pod's namespace and name")
    assert intake(job("j", "ghost"), None, [], args) is None  # a missing pod fails later, with MissingPod
