"""`koordbus calc arbitrate` and `koordbus calc arbitrate-math` (../shared/design/CALC-CONTRACT.md, spec §4.3–4.5).

Registered in koordbus.calc.CALCULATORS; runs the same pure arbitration the migration service runs
(services.migration.arbiter) on the jobs, pods and workloads given, with MigrationControllerArgs in Koordinator's
JSON names (an omitted limit takes Koordinator's default, an explicit 0 disables it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import msgspec

from koordbus.calc_errors import InputError
from schemas import kube, migration
from services.common.args import ArgsError
from services.migration import arbiter
from services.migration.args import IntOrPercent, MigrationArgs, check_args, get_max_unavailable


class ArbitrateInput(msgspec.Struct, frozen=True, kw_only=True):
    now: dt.datetime | None = None
    args: MigrationArgs = msgspec.field(default_factory=MigrationArgs)
    jobs: list[migration.PodMigrationJob] = []
    pods: list[kube.Pod] = []
    workloads: list[migration.Workload] = []


def arbitrate(inp: ArbitrateInput) -> dict[str, Any]:
    try:
        check_args(inp.args)
    except ArgsError as err:
        raise InputError(f"$.args: {err}") from None
    for i, job in enumerate(inp.jobs):
        if not job.metadata.name:
            raise InputError(f"$.jobs[{i}].metadata.name: every job needs a name")
    result = arbiter.arbitrate_objects(inp.jobs, inp.pods, inp.workloads, inp.args)
    return {
        "order": result.order,
        "passed": result.names("passed"),
        "failed": result.names("failed"),
        "waiting": result.names("waiting"),
        "decisions": [
            {"job": d.job, "outcome": d.outcome, "filter": d.filter, "message": d.message} for d in result.decisions
        ],
    }


class ArbitrateMathInput(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["getMaxUnavailable", "getMaxMigrating"]
    replicas: int
    value: IntOrPercent | None = None


def arbitrate_math(inp: ArbitrateMathInput) -> dict[str, Any]:
    if inp.replicas < 0:
        raise InputError(f"$.replicas: must not be negative, got {inp.replicas}")
    try:
        return {"value": get_max_unavailable(inp.replicas, inp.value)}
    except ArgsError as err:
        raise InputError(f"$.value: {err}") from None
