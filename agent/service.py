"""The node agent's metrics loop: collect → Sampler → BatchBuilder → bounded Outbox → publish, plus node state.

Wired by the composition root (`koordbus agent`, `koordbus up`) with a bus.api.Bus as the publisher; tests
drive it with a fake publisher, an injected clock and sleep, and call `collect_once()` directly. Only the
`publish(subject, data, *, msg_id)` method of the publisher is used. While the bus is away, finished batches
wait in the Outbox (oldest dropped past the bound and counted); when it returns they go out oldest first,
each with its deterministic msg id, so a batch sent twice is stored once.

With a pod source (the kubelet's pod list, agent/pods.py: the list the QoS loops read, also when they are off), each
collection's pod samples are joined with the latest list (agent.batch.attribute_pods), read again every
`pods_poll_interval` seconds: a pod whose cgroup appears before the kubelet lists it is published by UID and named
by the first batch closed after a list names it, at most pods_poll_interval + publish_interval later (15 s by
default). A failed read keeps the last good list (it only names cgroups that exist) and is logged once per outage.
The NodeSLO's host applications are measured when given a source of them (`host_applications`: the composition root
hands it the NodeSLO the agent reads, agent/slo_watch.py). With `cpi_collect` on, `run` also runs the CPI rounds
(agent/cpi_collect.py) as a background task, cancelled (and awaited) when it returns; each collection attaches the
counts that finished since the previous one to the pods' samples, and so they reach the batch as `pod_cpi`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from agent import core
from agent.batch import BatchBuilder, Outbox, PodIdentities, PodListThinner, attach_cpi, attribute_pods
from agent.collect import Collector
from agent.cpi_collect import CpiCollector, CpiStats
from agent.pods import PodSource
from agent.settings import AgentSettings
from bus import api, subjects
from bus.errors import BusUnavailableError
from schemas.node import NodeMetricsReported, NodeStateReported, PodRef, encode_node_event

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"


class Publisher(Protocol):
    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object: ...


@dataclass
class AgentStats:
    """Counters exported on /metrics."""

    collections: int = 0
    collect_errors: int = 0
    batches_built: int = 0
    batches_sent: int = 0
    dropped_batches: int = 0
    """Batches dropped from the full outbox since start."""
    rejected_batches: int = 0
    """Batches the bus refused for a reason other than being unavailable (dropped, logged)."""
    buffered_batches: int = 0
    publish_failures: int = 0
    states_sent: int = 0
    pod_list_failures: int = 0
    """Reads of the kubelet's pod list that failed (the last good list stays in use)."""
    bus_available: bool = True
    last_error: str = ""


_StateKey = tuple[int, str, tuple[tuple[str, str], ...]]


class AgentService:
    def __init__(
        self,
        settings: AgentSettings,
        publisher: Publisher,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        collector: Callable[[float], core.NodeReading] | None = None,
        pods: PodSource | None = None,
        pods_poll_interval: float = 5.0,
        host_applications: Callable[[], object] | None = None,
        cpi: CpiCollector | None = None,
    ) -> None:
        """`host_applications`: the `hostApplications` of the NodeSLO in effect (None: none), measured by the
        collector built here (a `collector` given instead reads what it reads). `cpi`: the CPI rounds to run (default:
        built here when `cpi_collect` is on)."""
        self.settings = settings
        self.stats = AgentStats()
        self._publisher = publisher
        self._clock = clock
        self._sleep = sleep
        self._collect = collector if collector is not None else Collector(settings, host_applications=host_applications)
        self._sampler = core.Sampler()
        self._builder = BatchBuilder(settings.node_name, interval=settings.publish_interval)
        self._thinner = PodListThinner(settings.pod_list_resend_batches)
        self._outbox: Outbox[NodeMetricsReported] = Outbox(settings.max_buffered_batches)
        self._dropped_unreported = 0
        self._state: NodeStateReported | None = None
        self._state_key: _StateKey | None = None
        self._state_pending = False
        self._stopping = False
        self._failure_streak = 0
        self._pods = pods
        self._pods_poll_interval = pods_poll_interval
        self._listed: PodIdentities | None = None
        self._listed_at: float | None = None
        self._pods_failing = False
        self.latest_tick: core.Tick | None = None
        """The samples of the latest collection (the QoS loops read current usage from it)."""
        self._cpi = cpi if cpi is not None else (CpiCollector(settings) if settings.cpi_collect else None)
        self.cpi_stats = self._cpi.stats if self._cpi is not None else CpiStats()
        """The CPI rounds' counters (all zero while CPI is off)."""

    async def stop(self) -> None:
        """Ask `run` to return after the current iteration. The open window is not published: a partial batch
        would take the window's msg id and make the full batch of a quickly restarted agent a duplicate."""
        self._stopping = True

    async def run(self) -> None:
        """Collect every collect interval until `stop()`; missed ticks are skipped, not caught up."""
        interval = self.settings.collect_interval
        cpi_task = asyncio.create_task(self._cpi.run(), name="agent-cpi") if self._cpi is not None else None
        try:
            next_at = self._clock()
            while not self._stopping:
                await self.collect_once()
                next_at += interval
                now = self._clock()
                if next_at < now:
                    next_at = now
                await self._sleep(next_at - now)
        finally:
            if cpi_task is not None:
                cpi_task.cancel()
                await asyncio.gather(cpi_task, return_exceptions=True)  # its failure, if any, was logged by run()
            close = getattr(self._collect, "close", None)
            if close is not None:
                close()  # the collector's open cgroup files

    async def collect_once(self) -> None:
        """One iteration: read the node, sample, close a finished window, then publish what is due."""
        now = self._clock()
        reading = await self._read(now)
        if reading is not None:
            tick = self._sampler.observe(reading)
            listed = await self._list_pods(now)
            if listed is not None and tick.pods:
                tick = msgspec.structs.replace(tick, pods=attribute_pods(tick.pods, listed))
            if self._cpi is not None and (counts := self._cpi.take()):
                tick = msgspec.structs.replace(tick, pods=attach_cpi(tick.pods, counts))
            self.latest_tick = tick
            self._enqueue(self._builder.add(tick, dropped_batches=self._dropped_unreported))
            self._note_state(reading)
        elif self._builder.due(now):
            self._enqueue(self._builder.close(sent_at=now, dropped_batches=self._dropped_unreported))
        await self._send()

    async def _list_pods(self, now: float) -> PodIdentities | None:
        """The kubelet's pods, read again once pods_poll_interval has passed; None before the first good read."""
        if self._pods is None:
            return None
        if self._listed_at is not None and now - self._listed_at < self._pods_poll_interval:
            return self._listed
        self._listed_at = now  # a failed read is retried after the interval too, not every collection
        try:
            listed = await self._pods.list()
        except Exception as e:  # the kubelet away or answering garbage: pods stay named by the last good list
            self.stats.pod_list_failures += 1
            if not self._pods_failing:
                log.warning("node %s: cannot list pods from the kubelet: %s", self.settings.node_name, e)
            self._pods_failing = True
            return self._listed
        if self._pods_failing:
            log.info("node %s: the kubelet's pod list is readable again", self.settings.node_name)
        self._pods_failing = False
        self._listed = PodIdentities(listed.pods)
        return self._listed

    async def _read(self, now: float) -> core.NodeReading | None:
        """One collection, on the event loop's thread (a few milliseconds at 200 pods; see agent.loops.runner on why
        not a worker thread)."""
        try:
            reading = self._collect(now)
        except (OSError, ValueError, KeyError) as e:
            self.stats.collect_errors += 1
            log.warning("node %s: collection failed: %s", self.settings.node_name, e)
            return None
        self.stats.collections += 1
        return reading

    def _enqueue(self, batch: NodeMetricsReported | None) -> None:
        if batch is None:
            return
        self._dropped_unreported = 0
        self.stats.batches_built += 1
        dropped = self._outbox.push(self._thinner.thin(batch))
        if dropped:
            self._dropped_unreported += dropped
            self.stats.dropped_batches += dropped
        self.stats.buffered_batches = len(self._outbox)

    def _note_state(self, reading: core.NodeReading) -> None:
        pods = sorted((p.uid, p.kube_qos) for p in reading.pods)
        key: _StateKey = (reading.cgroup_version, reading.cgroup_driver, tuple(pods))
        stale = self._state is None or reading.at - self._state.at >= self.settings.state_interval
        if key == self._state_key and not stale and not self._state_pending:
            return
        self._state_key = key
        self._state_pending = True
        self._state = NodeStateReported(
            node=self.settings.node_name,
            at=reading.at,
            agent_version=AGENT_VERSION,
            cpu_cores=float(reading.cpu_count),
            memory_total=reading.memory.total_kb * 1024,
            cgroup_version=reading.cgroup_version,
            cgroup_driver=reading.cgroup_driver,
            pods=[PodRef(uid=uid, kube_qos=qos) for uid, qos in pods],
        )

    async def _send(self) -> None:
        """State first, then the backlog oldest first; while the bus is away, one probe per iteration."""
        if self._state_pending and self._state is not None:
            state = self._state
            msg_id = api.msg_id(state.node, "state", state.at)
            if not await self._publish(subjects.node_state(state.node), encode_node_event(state), msg_id):
                return
            self._state_pending = False
            self.stats.states_sent += 1
        while (batch := self._outbox.peek()) is not None:
            msg_id = api.msg_id(batch.node, "metrics", batch.window_start)
            sent = await self._publish(subjects.node_metrics(batch.node), encode_node_event(batch), msg_id)
            if sent is False:
                break
            self._outbox.pop()
            if sent:
                self.stats.batches_sent += 1
            else:
                self.stats.rejected_batches += 1
        self.stats.buffered_batches = len(self._outbox)

    async def _publish(self, subject: str, data: bytes, msg_id: str) -> bool | None:
        """True when stored; False when the bus is away (keep it); None when refused for good (drop it)."""
        try:
            await asyncio.wait_for(
                self._publisher.publish(subject, data, msg_id=msg_id), timeout=self.settings.publish_timeout
            )
        except (BusUnavailableError, TimeoutError) as e:
            self._on_failure(e)
            return False
        except Exception as e:
            # A message the bus will never take must not block the backlog behind it.
            log.error(
                "node %s: bus refused %s (msg id %s), dropping it: %r", self.settings.node_name, subject, msg_id, e
            )
            self.stats.last_error = repr(e)
            return None
        self._on_success()
        return True

    def _on_failure(self, error: BaseException) -> None:
        self.stats.publish_failures += 1
        self.stats.last_error = repr(error) if str(error) else type(error).__name__
        if self._failure_streak == 0:
            log.warning(
                "node %s: bus unavailable (%s); buffering up to %d batches",
                self.settings.node_name,
                self.stats.last_error,
                self._outbox.max_batches,
            )
        self._failure_streak += 1
        self.stats.bus_available = False

    def _on_success(self) -> None:
        if self._failure_streak:
            log.info(
                "node %s: bus back after %d failed attempts; sending %d buffered batches",
                self.settings.node_name,
                self._failure_streak,
                len(self._outbox),
            )
        self._failure_streak = 0
        self.stats.bus_available = True
