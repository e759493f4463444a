"""The executor's next step for a passed job (spec §4.6, EvictDirectly): timeout, missing pod, run, evict, done,
ReservationFirst not executed yet; and the evictQPS/evictBurst bucket."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pytest

from schemas import migration
from services.migration.args import MigrationArgs
from services.migration.limiter import EvictionRate
from services.migration.reconcile import (
    Step,
    next_step,
    reservation_for,
    reservation_name,
    reservation_problem,
    reservation_ref,
    with_condition,
)
from tests.support.crd import crd_errors, crd_validator
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
    reservation_first = step(passed(), args=MigrationArgs())
    assert reservation_first is not None and reservation_first.action == "run"  # then the reservation steps


def test_eviction_rate() -> None:
    rate = EvictionRate(2.0, 1, now=0.0)
    assert rate.take(now=0.0) and not rate.take(now=0.1)
    assert rate.take(now=0.5) and not rate.take(now=0.6)
    burst = EvictionRate(1.0, 3, now=0.0)
    assert [burst.take(now=0.0) for _ in range(4)] == [True, True, True, False]


# --- ReservationFirst


def running_with(*conditions: tuple[str, str, str]) -> migration.PodMigrationJob:
    stamp = dt.datetime.fromtimestamp(NOW, dt.UTC)
    j = passed("Running")
    for kind, status, reason in conditions:
        updated = with_condition(j, kind, status, reason, "", now=stamp)
        j = msgspec.structs.replace(j, status=msgspec.structs.replace(j.status, conditions=updated))
    return j


def rstep(j: migration.PodMigrationJob, reservation: dict[str, object] | None, *, alive: bool = True) -> Step | None:
    return next_step(
        j, pod("p", node="n1") if alive else None, now=NOW, requested_at=NOW - 10, args=MigrationArgs(),
        reservation=reservation,
    )  # fmt: skip


def test_the_reservation_first_path() -> None:
    first = rstep(passed("Running"), None)
    assert first is not None and first.action == "reserve" and first.conditions[-1].type == "ReservationCreated"
    created = running_with(("ReservationCreated", "True", "ReservationCreated"))
    assert rstep(created, {"status": {}}) is None  # not scheduled yet
    scheduled = rstep(created, {"status": {"nodeName": "n7", "phase": "Available"}})
    assert scheduled is not None and scheduled.action == "evict"
    assert [c.type for c in scheduled.conditions] == ["ReservationCreated", "ReservationScheduled"]
    evicting = running_with(
        ("ReservationCreated", "True", "ReservationCreated"),
        ("ReservationScheduled", "True", "ReservationScheduled"),
        ("Eviction", "False", "Evicting"),
    )
    waiting = rstep(evicting, {"status": {"nodeName": "n7"}}, alive=False)
    assert waiting is not None and waiting.conditions[-1].reason == "WaitForPodBindReservation"
    bound = rstep(evicting, {"status": {"nodeName": "n7", "currentOwners": [{"name": "p-new"}]}}, alive=False)
    assert bound is not None and (bound.phase, bound.message) == ("Succeeded", "Complete")


@pytest.mark.parametrize(
    ("reservation", "reason"),
    [
        (None, "MissingReservation"),
        ({"status": {"phase": "Expired"}}, "ReservationExpired"),
        (
            {"status": {"conditions": [{"type": "Scheduled", "reason": "Unschedulable", "message": "0/3"}]}},
            "Unschedulable",
        ),
        ({"status": {"nodeName": "n1"}}, "ForbiddenMigratePod"),  # the pod's own node
    ],
)
def test_reservations_that_fail_the_job(reservation: dict[str, object] | None, reason: str) -> None:
    created = running_with(("ReservationCreated", "True", "ReservationCreated"))
    failed = rstep(created, reservation)
    assert failed is not None and (failed.phase, failed.reason) == ("Failed", reason)


def test_the_default_reservation_template_is_crd_valid() -> None:
    p = pod("p", node="n1", labels={"app": "web"}, containers=[{"name": "c", "resources": {"requests": {"cpu": "1"}}}])
    body = reservation_for(passed(), p, ttl="5m")
    assert crd_errors(crd_validator("scheduling.koordinator.sh_reservations.yaml"), body) == []
    spec: Any = body["spec"]
    assert "nodeName" not in spec["template"]["spec"]
    term = spec["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0] == {
        "key": "metadata.name",
        "operator": "NotIn",
        "values": ["n1"],
    }
    assert spec["owners"] == [{"object": {"namespace": "default", "name": "p", "uid": "uid-p"}}]


def with_ref(ref: object) -> migration.PodMigrationJob:
    j = passed("Running", mode="ReservationFirst")
    return msgspec.structs.replace(j, spec=msgspec.structs.replace(j.spec, reservation_options={"reservationRef": ref}))


def test_a_jobs_reservation_ref_is_used_instead_of_a_new_reservation() -> None:
    j = with_ref({"apiVersion": "v1alpha1", "kind": "Reservation", "name": "spare-7"})
    assert reservation_ref(j) == ("spare-7", "") and reservation_name(j) == "spare-7"
    assert reservation_name(passed()) == "j" and reservation_ref(passed()) == ("", "")
    missing = rstep(j, None)
    assert missing is not None and (missing.phase, missing.reason) == ("Failed", "MissingReservation")
    assert "spare-7" in missing.message
    assert rstep(j, {"status": {}}) is None  # never "reserve": it waits for the given one to be scheduled
    scheduled = rstep(j, {"status": {"nodeName": "n7", "phase": "Available"}})
    assert scheduled is not None and scheduled.action == "evict"
    assert [(c.type, c.message) for c in scheduled.conditions] == [
        ("ReservationCreated", "uses Reservation spare-7"),
        ("ReservationScheduled", "n7"),
    ]


@pytest.mark.parametrize("ref", ["spare-7", {"name": ""}, {"name": 7}, {"name": "../pods/x"}, {"name": "A" * 300}])
def test_an_unusable_reservation_ref_fails_the_job(ref: object) -> None:
    j = with_ref(ref)
    name, problem = reservation_ref(j)
    assert name == "" and problem.startswith("spec.reservationOptions.reservationRef")
    assert reservation_name(j) == "j"
    failed = rstep(j, {"status": {"nodeName": "n7"}})
    assert failed is not None and (failed.phase, failed.reason, failed.message) == (
        "Failed",
        "MissingReservation",
        problem,
    )


def with_template(template: object) -> migration.PodMigrationJob:
    j = passed("Running", mode="ReservationFirst")
    return msgspec.structs.replace(j, spec=msgspec.structs.replace(j.spec, reservation_options={"template": template}))


def test_a_jobs_reservation_template_is_filled_in_as_koordinator_does() -> None:
    p = pod("p", node="n1", labels={"app": "web"})
    own_pod = {
        "metadata": {"labels": {"tier": "gold"}},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "image": "web"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                        ]
                    }
                }
            },
        },
    }
    j = with_template(
        {
            "metadata": {"name": "spare-for-p", "labels": {"team": "x"}},
            "spec": {"template": own_pod, "expires": "2026-01-02T00:00:00Z", "allocatePolicy": "Restricted"},
        }
    )
    assert reservation_problem(j) == "" and reservation_name(j) == "spare-for-p"
    body: Any = reservation_for(j, p, ttl="5m")
    assert crd_errors(crd_validator("scheduling.koordinator.sh_reservations.yaml"), body) == []
    assert body["metadata"] == {"name": "spare-for-p", "labels": {"team": "x", "koordbus.io/migration-job": "j"}}
    spec = body["spec"]
    assert spec["allocatePolicy"] == "Restricted" and spec["allocateOnce"] is True
    assert "ttl" not in spec  # the template sets expires
    assert spec["owners"] == [{"object": {"namespace": "default", "name": "p", "uid": "uid-p"}}]
    assert spec["template"]["metadata"] == {"labels": {"tier": "gold"}} and "nodeName" not in spec["template"]["spec"]
    terms = spec["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    away = {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}
    assert [t["matchFields"] for t in terms["nodeSelectorTerms"]] == [[away], [away]]  # every term avoids n1
    assert own_pod["spec"]["nodeName"] == "n1"  # the job's template itself is left as it was
    plain: Any = reservation_for(with_template({"spec": {"ttl": "1h"}}), p, ttl="5m")
    assert plain["metadata"]["name"] == "j" and plain["spec"]["ttl"] == "1h"
    assert plain["spec"]["template"]["metadata"] == {"namespace": "default", "labels": {"app": "web"}}


@pytest.mark.parametrize(
    "template",
    [
        "spare",
        {"metadata": "x"},
        {"spec": ["x"]},
        {"metadata": {"name": "Not_A_Name"}},
        {"metadata": {"name": 5}},
        {"metadata": {"labels": {"a": 1}}},
    ],
)
def test_an_unusable_reservation_template_fails_the_job(template: object) -> None:
    j = with_template(template)
    problem = reservation_problem(j)
    assert problem.startswith("spec.reservationOptions.template") and reservation_name(j) == "j"
    failed = rstep(j, None)
    assert failed is not None and (failed.phase, failed.reason, failed.message) == (
        "Failed",
        "MissingReservation",
        problem,
    )
