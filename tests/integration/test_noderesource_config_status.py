"""The noderesource service publishes the colocation ConfigMap's error status (ColocationConfigStatus) on its
last-value subject when the error differs from the last status there; on MemoryBus, with no nodes, so the stream
holds nothing else."""

from __future__ import annotations

from bus import streams, subjects
from bus.memory import MemoryBus
from schemas.noderesource import COLOCATION_CONFIG_STATUS_DECODER, ColocationConfigStatus
from tests.integration.test_noderesource_service import (
    Clock,
    eventually,
    memory_bus_with_streams,
    publish,
    service,
    stored_decisions,
)
from tests.unit.test_noderesource_state import T0, config_event


async def stored(bus: MemoryBus, wanted: int) -> bool:
    return await stored_decisions(bus) >= wanted


async def last_status(bus: MemoryBus) -> ColocationConfigStatus:
    stored = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_CONFIG_STATUS)
    assert stored is not None
    return COLOCATION_CONFIG_STATUS_DECODER.decode(stored.data)


async def test_the_config_status_is_published_when_its_error_changes_also_across_restarts(
    memory_bus: MemoryBus,
) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await publish(bus, config_event({"enable": True}, rv="1"))
    clock = Clock(T0 + 30)
    svc = service(bus, clock)
    await svc.start()
    try:
        assert svc.ready and await stored_decisions(bus) == 0  # a good config and no status before: nothing to tell

        await publish(bus, config_event({"enable": True, "midCPUThresholdPercent": 150}, rv="2"))
        await eventually(lambda: stored(bus, 1))
        bad = await last_status(bus)
        assert bad.error is not None and "midCPUThresholdPercent" in bad.error
        assert (bad.previous_error, bad.resource_version, bad.at) == (None, "2", T0 + 30)

        # Broken the same way at a new version: the error did not change, nothing is published.
        await publish(bus, config_event({"enable": True, "midCPUThresholdPercent": 150, "x": 1}, rv="3"))
        assert await svc.consumers[0].wait_idle(5)
        await svc.decide_pending()
        assert svc.state.config.error == bad.error
        assert await stored_decisions(bus) == 1
    finally:
        await svc.stop()

    # A restart with the same error reads the last status back and publishes nothing.
    svc = service(bus, clock)
    await svc.start()
    await svc.stop()
    assert await stored_decisions(bus) == 1

    # Fixed while the service was down: the next run tells the recovery, naming the old error, once.
    await publish(bus, config_event({"enable": True}, rv="4"))
    for _ in range(2):
        svc = service(bus, clock)
        await svc.start()
        await svc.stop()
    fixed = await last_status(bus)
    assert (fixed.error, fixed.previous_error, fixed.resource_version) == (None, bad.error, "4")
    assert await stored_decisions(bus) == 2
