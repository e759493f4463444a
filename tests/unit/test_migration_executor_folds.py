"""The executor's pass over the jobs while its consumer folds events: a job forgotten (MigrationCollected, e.g. by
another executor replica's garbage collection) while the pass awaits a cluster verb is skipped, not a KeyError that
fails the whole pass."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bus import streams
from bus.memory import MemoryBus
from schemas import migration
from schemas import migration_events as ev
from services.common.metrics import new_registry
from services.migration.args import MigrationArgs
from services.migration.executor import MigrationExecutor
from tests.support.migration import job

NOW = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)


async def test_a_job_collected_while_a_pass_awaits_is_skipped(memory_bus: MemoryBus) -> None:
    await memory_bus.ensure_streams(streams.all_streams())
    args = MigrationArgs(default_job_mode="EvictDirectly")
    executor = MigrationExecutor(memory_bus, args, registry=new_registry(), clock=lambda: NOW.timestamp() + 1)
    passed = [ev.JobDecision(job=name, outcome="passed") for name in ("a", "b")]
    for event in (
        ev.MigrationRequested(job=job("a", "web-a"), source="api", actor="alice", time=NOW),
        ev.MigrationRequested(job=job("b", "web-b"), source="api", actor="alice", time=NOW),
        ev.MigrationRound(round=1, decisions=passed, time=NOW),
        ev.MigrationPhaseChanged(job="b", phase=migration.PHASE_SUCCEEDED, time=NOW),
    ):
        executor._fold(event)

    async def pod_read_while_b_is_collected(_: Any) -> None:
        executor._fold(ev.MigrationCollected(job="b", time=NOW))  # what the consumer folds meanwhile
        return None  # a's pod is gone: a fails with MissingPod

    executor._pod = pod_read_while_b_is_collected  # type: ignore[method-assign]
    assert await executor.reconcile() == 1
    assert set(executor.state.jobs) == {"a"}
    assert executor.state.jobs["a"].status.reason == migration.REASON_MISSING_POD
