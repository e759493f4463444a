"""The executor's next step for a passed job (spec §4.6, EvictDirectly): timeout, missing pod, run, evict, done,
ReservationFirst not executed yet; and the evictQPS/evictBurst bucket."""

from __future__ import annotations

import datetime as dt

import msgspec

from schemas import migration
from services.migration.args import MigrationArgs
from services.migration.limiter import EvictionRate
from services.migration.reconcile import NOT_YET, Step, next_step, with_condition
from tests.support.migration import job, pod

ARGS = MigrationArgs(default_job_mode="EvictDirectly")
NOW = 1_000_000.0


def passed(phase: str = "", **spec: object) -> migration.PodMigrationJob:
    j = job("j", "p", phase=phase, passed=True)
    return msgspec.structs.replace(j, spec=msgspec.structs.replace(j.spec, **spec)) if spec else j


def step(
    j: migration.PodMigrationJob, *, alive: bool = True, requested: float = NOW - 10, args: MigrationArgs = ARGS
) -> Step | None:
    return next_step(j, pod("p") if alive else None, now=NOW, requested_at=requested, args=args)


def test_the_path_of_an_evict_directly_job() -> None:
    first = step(passed())
    assert first is not None and (first.action, first.phase) == ("run", "Running")
    evict = step(passed("Running"))
    assert evict is not None and evict.action == "evict"
    stamp = dt.datetime.fromtimestamp(NOW, dt.UTC)
    conditions = with_condition(passed("Running"), "Eviction", "False", "Evicting", "x", now=stamp)
    evicting = msgspec.structs.replace(
        passed("Running"), status=msgspec.structs.replace(passed("Running").status, conditions=conditions)
    )
    assert step(evicting) is None  # still there: wait
    done = step(evicting, alive=False)
    assert done is not None and (done.action, done.phase, done.message) == ("succeed", "Succeeded", "Complete")
    assert done.conditions[-1].status == "True" and done.conditions[-1].reason == "EvictComplete"


def test_failures_and_what_is_left_alone() -> None:
    missing = step(passed(), alive=False)
    assert missing is not None and (missing.phase, missing.reason) == ("Failed", "MissingPod")
    late = step(passed("Running"), requested=NOW - 301)  # default TTL 5m
    assert late is not None and (late.phase, late.reason) == ("Failed", "Timeout")
    assert step(passed("Running", ttl="1h"), requested=NOW - 301) is not None  # its own TTL is longer
    assert step(job("j", "p")) is None  # not passed
    assert step(passed("Succeeded")) is None
    reservation = step(passed(), args=MigrationArgs())
    assert reservation is not None and reservation.action == "note" and reservation.message == NOT_YET


def test_eviction_rate() -> None:
    rate = EvictionRate(2.0, 1, now=0.0)
    assert rate.take(now=0.0) and not rate.take(now=0.1)
    assert rate.take(now=0.5) and not rate.take(now=0.6)
    burst = EvictionRate(1.0, 3, now=0.0)
    assert [burst.take(now=0.0) for _ in range(4)] == [True, True, True, False]
