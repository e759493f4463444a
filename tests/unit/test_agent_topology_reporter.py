"""The topology reporter's rounds (agent.topology_watch.TopologyReporter) with a scripted reader, a fake publisher
and an injected clock: what is published when (start, change, refresh), a failed publish retried at the next round,
and each problem logged once when it appears."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest

from agent.topology_watch import TopologyReporter
from bus import api, subjects
from bus.errors import BusUnavailableError
from schemas import node_topology as nt
from schemas.node_topology import TOPOLOGY_DECODER

NODE = "node-a"


class Publisher:
    def __init__(self) -> None:
        self.down = False
        self.hang = False
        self.sent: list[tuple[str, nt.NodeTopologyReported, str]] = []

    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object:
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise BusUnavailableError("connection refused")
        self.sent.append((subject, TOPOLOGY_DECODER.decode(data), msg_id))
        return None


class Machine:
    """What the reader finds: a report whose content tests change, read at the clock's time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.report = nt.NodeTopologyReported(
            node=NODE, at=0.0, zones=[nt.NumaZoneReport(numa=0, cpus="0-3", cpu_count=4, memory=8 << 30)]
        )

    def read(self, at: float) -> nt.NodeTopologyReported:
        return msgspec.structs.replace(self.report, at=at)


def reporter(machine: Machine, publisher: Publisher, **kw: float) -> TopologyReporter:
    return TopologyReporter(
        NODE, publisher, machine.read, interval=60.0, refresh=600.0, clock=lambda: machine.now, **kw
    )


async def test_published_at_start_on_change_and_at_every_refresh() -> None:
    machine, publisher = Machine(), Publisher()
    rounds = reporter(machine, publisher)
    assert await rounds.round()
    subject, report, msg_id = publisher.sent[0]
    assert subject == subjects.node_topology(NODE)
    assert report == machine.read(1000.0) and msg_id == api.msg_id(NODE, "topology", 1000.0)
    for _ in range(9):  # unchanged, within the refresh: nothing
        machine.now += 60.0
        assert not await rounds.round()
    machine.now += 60.0  # 600 s after the last one
    assert await rounds.round()
    assert publisher.sent[-1][1].at == 1600.0
    machine.now += 60.0
    machine.report = msgspec.structs.replace(machine.report, kubelet=nt.KubeletCpuManager(policy="static"))
    assert await rounds.round()
    assert publisher.sent[-1][1].kubelet.policy == "static"
    machine.now += 60.0
    assert not await rounds.round()
    assert rounds.stats.reports_sent == len(publisher.sent) == 3 and rounds.stats.reads == 13


async def test_a_failed_publish_is_retried_at_the_next_round_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    machine, publisher = Machine(), Publisher()
    rounds = reporter(machine, publisher, publish_timeout=0.05)
    publisher.down = True
    with caplog.at_level(logging.INFO, logger="agent.topology_watch"):
        assert not await rounds.round()
        machine.now += 60.0
        publisher.down, publisher.hang = False, True  # a bus that takes it and never answers
        assert not await rounds.round()
        machine.now += 60.0
        publisher.hang = False
        assert await rounds.round()
    assert [r.at for _, r, _ in publisher.sent] == [1120.0]
    assert rounds.stats.publish_failures == 2
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "cannot publish the topology report" in m]) == 1
    assert any("topology report published again" in m for m in messages)


async def test_each_problem_is_logged_when_it_first_appears(caplog: pytest.LogCaptureFixture) -> None:
    machine, publisher = Machine(), Publisher()
    rounds = reporter(machine, publisher)

    async def round_with(problems: list[str]) -> None:
        machine.report = msgspec.structs.replace(machine.report, problems=problems)
        machine.now += 60.0
        await rounds.round()

    with caplog.at_level(logging.WARNING, logger="agent.topology_watch"):
        await round_with(["/var/lib/kubelet/cpu_manager_state: not a CPU manager checkpoint"])
        await round_with(["/var/lib/kubelet/cpu_manager_state: not a CPU manager checkpoint"])
        await round_with(["/var/lib/kubelet/cpu_manager_state: not a CPU manager checkpoint", "/proc/cpuinfo: missing"])
        await round_with([])
        await round_with(["/proc/cpuinfo: missing"])
    logged = [r.getMessage().split(": ", 2)[-1] for r in caplog.records]
    assert logged == [
        "/var/lib/kubelet/cpu_manager_state: not a CPU manager checkpoint",
        "/proc/cpuinfo: missing",
        "/proc/cpuinfo: missing",  # gone, then back
    ]
    assert rounds.stats.report_problems == 1


async def test_run_reads_every_interval_until_cancelled() -> None:
    machine, publisher = Machine(), Publisher()
    slept: list[float] = []
    third_sleep = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        machine.now += seconds
        if len(slept) == 3:
            third_sleep.set()
        await asyncio.sleep(0)

    rounds = TopologyReporter(
        NODE, publisher, machine.read, interval=60.0, refresh=600.0, clock=lambda: machine.now, sleep=sleep
    )
    task = asyncio.create_task(rounds.run())
    async with asyncio.timeout(10):
        await third_sleep.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert slept[:3] == [60.0, 60.0, 60.0] and rounds.stats.reads >= 3
    assert len(publisher.sent) == 1
