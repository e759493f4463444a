"""The agent's topology reporter (issue 23.4): reads the node's topology and publishes it as NodeTopologyReported on
`koord.v1.node.<node>.topology` (stream KOORD_NODE), for the bridge's NodeResourceTopology.

`read_topology` is the thin I/O edge of agent.topology: it lists the NUMA node directories, reads the CPUs
(agent.cpus.read_cpus) and the first bytes of every file `Layout.files` names, and hands them to the pure
`build_report`. `TopologyReporter` (started by the composition root, `koordbus agent` and `koordbus up`, unless
`topology_report` is off) reads every `topology_interval_seconds` and publishes at start, whenever the report says
something new (`at` aside), and every `topology_refresh_seconds` even when it does not, so the newest report in
KOORD_NODE (2 h of age) is never older than the refresh. A publish that fails (the bus away) is retried at the next
round; a problem of the report is logged when it first appears, not every round. Reads run on the event loop's
thread, as the collector's do: a few hundred small sysfs files a minute.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent import topology
from agent.cpus import read_cpus
from agent.settings import AgentSettings
from agent.suppress import Cpu
from bus import api, subjects
from schemas.node_topology import NodeTopologyReported, encode_topology

log = logging.getLogger(__name__)


class Publisher(Protocol):
    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object: ...


def reporter_for(settings: AgentSettings, publisher: Publisher, *, reserved_cpus: str = "") -> TopologyReporter:
    """The reporter of a real node, reading under the agent's roots (`reserved_cpus`: the QoS settings' list)."""

    def read(at: float) -> NodeTopologyReported:
        return read_topology(
            node=settings.node_name,
            at=at,
            sys_root=settings.sys_root,
            proc_root=settings.proc_root,
            kubelet_root_dir=settings.kubelet_root_dir,
            reserved_cpus=reserved_cpus,
        )

    return TopologyReporter(
        settings.node_name,
        publisher,
        read,
        interval=settings.topology_interval_seconds,
        refresh=settings.topology_refresh_seconds,
        publish_timeout=settings.publish_timeout,
    )


def read_topology(
    *, node: str, at: float, sys_root: str, proc_root: str, kubelet_root_dir: str, reserved_cpus: str = ""
) -> NodeTopologyReported:
    """The node's topology as its files say now (never raises for what the files hold: see agent.topology)."""
    layout = topology.Layout(sys_root=sys_root, proc_root=proc_root, kubelet_root_dir=kubelet_root_dir)
    problems: list[str] = []
    cpus: Sequence[Cpu] = ()
    try:
        cpus = read_cpus(sys_root)
    except (OSError, ValueError) as e:
        problems.append(f"the CPUs under {sys_root}/devices/system/cpu: {e}")
    node_ids = _node_ids(layout.node_dir, problems)
    files: dict[str, bytes | topology.Unreadable] = {}
    for path, limit in layout.files(node_ids):
        data = _read(path, limit)
        if data is not None:
            files[path] = data
    return topology.build_report(
        node=node,
        at=at,
        layout=layout,
        cpus=cpus,
        node_ids=node_ids,
        files=files,
        reserved_cpus=reserved_cpus,
        problems=problems,
    )


def _node_ids(node_dir: str, problems: list[str]) -> list[int]:
    """The ids of the `nodeN` directories; none when the directory is absent (a machine without NUMA in sysfs)."""
    try:
        names = os.listdir(node_dir)
    except FileNotFoundError:
        return []
    except OSError as e:
        problems.append(f"{node_dir}: cannot list: {e}")
        return []
    return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isascii() and n[4:].isdigit())


def _read(path: str, limit: int) -> bytes | topology.Unreadable | None:
    """At most `limit` bytes of a file; None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        return topology.Unreadable(e.strerror or type(e).__name__)


@dataclass
class TopologyStats:
    """Counters exported on /metrics."""

    reads: int = 0
    reports_sent: int = 0
    publish_failures: int = 0
    report_problems: int = 0
    """Problems the latest report names."""


class TopologyReporter:
    def __init__(
        self,
        node: str,
        publisher: Publisher,
        read: Callable[[float], NodeTopologyReported],
        *,
        interval: float,
        refresh: float,
        publish_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        """`read(at)`: the report as of `at` (read_topology with the agent's roots, or a simulated node's)."""
        self.node = node
        self.stats = TopologyStats()
        self._publisher = publisher
        self._read = read
        self._interval = interval
        self._refresh = refresh
        self._publish_timeout = publish_timeout
        self._clock = clock
        self._sleep = sleep
        self._published: NodeTopologyReported | None = None
        """The last report the bus took."""
        self._logged: frozenset[str] = frozenset()
        self._failing = False

    async def run(self) -> None:
        """A round every interval, until cancelled."""
        while True:
            await self.round()
            await self._sleep(self._interval)

    async def round(self) -> bool:
        """Read, and publish when due; True when a report was published."""
        now = self._clock()
        report = self._read(now)
        self.stats.reads += 1
        self._note_problems(report.problems)
        sent = self._published
        if sent is not None and topology.same_topology(sent, report) and now - sent.at < self._refresh:
            return False
        if not await self._publish(report):
            return False
        self._published = report
        self.stats.reports_sent += 1
        return True

    def _note_problems(self, problems: list[str]) -> None:
        self.stats.report_problems = len(problems)
        current = frozenset(problems)
        for problem in problems:
            if problem not in self._logged:
                log.warning("node %s: topology report: %s", self.node, problem)
        self._logged = current  # a problem that went away is logged again if it comes back

    async def _publish(self, report: NodeTopologyReported) -> bool:
        msg_id = api.msg_id(report.node, "topology", report.at)
        try:
            async with asyncio.timeout(self._publish_timeout):
                await self._publisher.publish(
                    subjects.node_topology(report.node), encode_topology(report), msg_id=msg_id
                )
        except Exception as e:  # the bus away, slow or refusing: the next round tries again
            self.stats.publish_failures += 1
            if not self._failing:
                log.warning("node %s: cannot publish the topology report (retried every round): %r", self.node, e)
            self._failing = True
            return False
        if self._failing:
            log.info("node %s: topology report published again", self.node)
        self._failing = False
        return True
