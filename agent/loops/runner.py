"""The agent's QoS loops (issue 6): every round, the node's NodeSLO and pods in, cgroup and resctrl writes out.

A round (every `round_interval`, koordlet's 1 s): re-read this node's NodeSLO key when due (agent/slo_watch.py),
merge it onto the agent defaults (agent/slo.py), list the pods from the kubelet, then run each loop — plan with
agent/actuate.py from the files' current values, write only the differences, at most `max_writes_per_round` files
per round across loops — and publish what each loop did as an ActuationApplied on `koord.v1.node.<node>.actuation`.
The loops: be-cgroup and failsafe (agent/loops/cgroups.py), resctrl (agent/loops/resctrl.py), cpu-suppress
(agent/loops/suppress.py), memory-evict and cpu-evict (agent/loops/evict.py), cpu-burst
(agent/loops/burst.py). The static loops (be-cgroup, resctrl, CFS burst values) run when the pods or the
NodeSLO change, or every `reconcile_interval`; the usage-driven ones every round. No suppress and no new eviction
while the fail-safe holds.

In dry-run nothing is written: the plan is logged and published (dry_run=true). An event is published when a loop
wrote something, or when what it would write or the problems it met differ from its last event — so a steady
dry-run or a pod whose cgroup is not there yet does not repeat itself every second. Bad input (a pod with a broken
annotation, a missing directory, a read-only file, a path outside the root) becomes a Problem for that object; a
loop never raises out of a round, and no value is written partially or out of range (agent/actuate.py checks).
The loops' file I/O runs on the event loop's own thread, as the collector's does: cgroup and resctrl files answer in
microseconds, a whole round takes about a millisecond (a static pass at 200 pods about 25 ms), and handing each round
to a worker thread cost a fifth of the agent's CPU (bench/agent.py). A filesystem that hung would stop the agent's
/healthz too, which is the right signal for the kubelet to restart it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agent import actuate, collect, suppress
from agent.allocatable_watch import AllocatableSource
from agent.cgroup_watch import CgroupWatch
from agent.core import Tick
from agent.loops.base import Actuator, LoopResult, QosStats, Round, actuation_message
from agent.loops.burst import CpuBurst
from agent.loops.cgroups import Failsafe, be_cgroups, memory_qos_loop
from agent.loops.evict import Evictions
from agent.loops.resctrl import Resctrl
from agent.loops.suppress import cpu_suppress
from agent.loops.system import SystemConfig
from agent.pods import PodSource
from agent.settings import AgentSettings, QosSettings
from agent.slo import effective_slo
from agent.slo_watch import KeyReader, SloSource
from schemas import vocab
from schemas.qos import ActuationApplied, ActuationLoop, Problem

log = logging.getLogger(__name__)

FRESH_PODS_SECONDS = 3.0
"""After a pod's cgroup appeared, the pod list is read every round for this long (its containers' IDs follow)."""


def _pod_identity(node_pod: actuate.NodePod) -> tuple[object, ...]:
    """What of a pod the static loops read: a change of it makes them run at once. The kubelet's pods carry a
    resourceVersion that moves with any change of the object; the containers' IDs come from its status too."""
    meta = node_pod.pod.metadata
    if meta.resource_version:
        return (meta.uid, meta.resource_version, node_pod.pod.status.phase, frozenset(node_pod.containers.items()))
    return (
        meta.uid,
        meta.resource_version,
        frozenset(meta.labels.items()),
        frozenset(meta.annotations.items()),
        node_pod.pod.status.phase,
        frozenset(node_pod.containers.items()),
    )


class BusLike(KeyReader, Protocol):
    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object: ...


class QosLoops:
    def __init__(
        self,
        agent_settings: AgentSettings,
        settings: QosSettings,
        bus: BusLike,
        *,
        pods: PodSource | None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        cpu_count: int | None = None,
        usage: Callable[[], Tick | None] | None = None,
    ) -> None:
        """`usage`: the metrics half's latest samples (AgentService.latest_tick); without it CPU suppress waits."""
        self.node = agent_settings.node_name
        self.settings = settings
        self.stats = QosStats()
        self.slo = SloSource(bus, self.node, state_dir=settings.state_dir, now=clock())
        self.allocatable = AllocatableSource(bus, self.node)
        """The node's batch/mid allocatable and CPU normalization ratio, read with the NodeSLO."""
        self._agent_settings = agent_settings
        self._bus = bus
        self._pods = pods
        self._listed: tuple[float, list[actuate.NodePod]] | None = None
        """(when, pods) of the last good pod list: read again after pods_poll_interval."""
        self._refused: list[str] = []
        """The pod list's refused items, as last logged (logged again only when they change)."""
        self._clock = clock
        self._sleep = sleep
        self._usage = usage or (lambda: None)
        cpus = cpu_count or os.cpu_count() or 1
        self._actuator = Actuator(
            cgroup_root=agent_settings.cgroup_root,
            resctrl_root=settings.resctrl_root,
            sys_root=settings.sys_root,
            dry_run=settings.qos_mode != "apply",
            stats=self.stats,
        )
        self._failsafe = Failsafe(after=settings.failsafe_after, cpus=cpus)
        self._be_quota_unlimited = False
        """Whether the last be-cgroup pass lifted the BE pods' quotas for the fail-safe."""
        self._resctrl = Resctrl(proc_root=agent_settings.proc_root)
        self._evictions = Evictions(
            settings, proc_root=agent_settings.proc_root, collect_interval=agent_settings.collect_interval
        )
        self._burst = CpuBurst(cpus=cpus)
        self._system = SystemConfig(
            enabled=settings.system_config,
            proc_root=agent_settings.proc_root,
            sys_root=settings.sys_root,
            state_dir=settings.state_dir,
        )
        self._next_slo_read = 0.0
        self._layout_found: tuple[float, actuate.Layout] | None = None
        self._last_event: dict[str, tuple[Any, ...]] = {}
        self._stopping = False
        self._reconciled: tuple[int, int, int] | None = None
        """(NodeSLO revision, pod list digest) of the last full pass of the static loops."""
        self._next_reconcile = 0.0
        self._fresh_pods_until = 0.0
        """Until then every round reads the pod list (a pod's cgroup appeared: its container IDs follow shortly)."""
        self._watch_refused = False
        self._effective: tuple[int, dict[str, Any]] | None = None
        """(NodeSLO revision, the spec merged onto the defaults): merged again only when the revision moves."""

    @property
    def dry_run(self) -> bool:
        return self._actuator.dry_run

    @property
    def failsafe_active(self) -> bool:
        return self._failsafe.active

    async def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        watch: CgroupWatch | None = None
        try:
            while not self._stopping:
                started = self._clock()
                try:
                    await self.round()
                except Exception:  # a round must never end the loop; the next one starts from a fresh read
                    log.exception("node %s: QoS round failed", self.node)
                watch = watch or self._start_watch()
                await self._wait(max(self.settings.round_interval - (self._clock() - started), 0.0), watch)
        finally:
            if watch is not None:
                watch.close()
            self._actuator.close()  # the cgroup files kept open between rounds

    def _start_watch(self) -> CgroupWatch | None:
        """Watch the besteffort directories for new pod cgroups once kubepods is found (agent.cgroup_watch); None
        while it is not, or with apply_at_pod_start off. A watch that cannot be had is said once: the poll goes on."""
        if not self.settings.apply_at_pod_start or self._watch_refused:
            return None
        layout = self._layout()
        if layout is None:
            return None
        be_dir = layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT)
        controllers = ("cpu", "memory") if layout.version == 1 else ("",)
        root = self._agent_settings.cgroup_root
        watch = CgroupWatch(os.path.join(root, layout.file(c, be_dir, "")) for c in controllers)
        if not watch.available:
            self._watch_refused = True
            log.info("node %s: new BE pods wait for the pod poll (%s)", self.node, watch.reason)
            return None
        watch.start(asyncio.get_running_loop())
        return watch

    async def _wait(self, seconds: float, watch: CgroupWatch | None) -> None:
        """Sleep until the next round, or less when a pod's cgroup appeared: the pod list is then read again for
        the next few rounds and the static pass runs, so its limits are written within a round."""
        if watch is None or not watch.available:
            await self._sleep(seconds)
            return
        if not watch.created.is_set():
            sleeper = asyncio.ensure_future(self._sleep(seconds))
            waker = asyncio.ensure_future(watch.created.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # an asyncio.sleep and an Event.wait: both end at their first cancellation
                sleeper.cancel()
                waker.cancel()
                await asyncio.gather(sleeper, waker, return_exceptions=True)
        if watch.created.is_set():
            watch.created.clear()
            self.stats.cgroup_wakeups += 1
            self._fresh_pods_until = self._clock() + FRESH_PODS_SECONDS
            self._next_reconcile = 0.0

    async def round(self) -> list[ActuationApplied]:
        """One round of every loop; returns the events it published."""
        now = self._clock()
        if now >= self._next_slo_read:
            await self.slo.refresh(now)
            # the allocatable evictions and BECPUEvict's evictByAllocatable read the allocatable; the be-cgroup loop
            # the CPU normalization ratio
            await self.allocatable.refresh()
            self._next_slo_read = now + self.settings.slo_poll_interval
        if self._effective is None or self._effective[0] != self.slo.revision:
            self._effective = (self.slo.revision, effective_slo(self.slo.spec))
        pods = await self._list_pods()
        layout = self._layout()
        if layout is None:  # no kubepods on this node: nothing to act on
            self.stats.rounds += 1
            return []
        rnd = Round(
            pods=pods or [],
            pods_known=pods is not None,
            layout=layout,
            slo=self._effective[1],
            now=now,
            tick=self._usage(),
            # without the kubelet's pods the per-pod loops wait; the node-level ones (fail-safe, suppress) go on
            static=pods is not None and self._reconcile_due(pods, now),
            budget=self.settings.max_writes_per_round,
            cpu_normalization_ratio=self.allocatable.cpu_normalization_ratio,
        )
        results = self._run_loops(rnd)
        events: list[ActuationApplied] = []
        for loop, result in results:
            if result.victims:
                await self._evictions.request(
                    result, node=self.node, now=now, act=self._actuator, layout=layout, publish=self._publish_raw
                )
            event = self._event_for(loop, result, now)
            if event is not None and await self._publish(event):
                events.append(event)
        self.stats.rounds += 1
        self.stats.last_round_seconds = self._clock() - now
        return events

    async def _list_pods(self) -> list[actuate.NodePod] | None:
        if self._pods is None:
            return []
        now = self._clock()
        polled = self._listed is not None and now - self._listed[0] < self.settings.pods_poll_interval
        if self._listed is not None and polled and now >= self._fresh_pods_until:
            return self._listed[1]
        try:
            listed = await self._pods.list()
        except Exception as e:  # the kubelet away or answering garbage: pod loops wait, node loops go on
            self.stats.pod_list_failures += 1
            log.warning("node %s: cannot list pods from the kubelet: %s", self.node, e)
            self._listed = None
            return None
        if listed.refused != self._refused:
            for reason in listed.refused:
                log.warning("node %s: pod skipped by the QoS loops: %s", self.node, reason)
            self._refused = listed.refused
        self._listed = (now, listed.pods)
        return listed.pods

    def _node_memory(self) -> int:
        """MemTotal in bytes (the kubelet's memory capacity), for a container without a memory limit; 0 unread."""
        try:
            return collect.read_meminfo(self._agent_settings.proc_root).total_kb * 1024
        except (OSError, KeyError, ValueError):
            return 0

    def _layout(self) -> actuate.Layout | None:
        """Where kubepods is, looked up again every reconcile_interval (or while it is not there)."""
        now = self._clock()
        if self._layout_found is not None and now - self._layout_found[0] < self.settings.reconcile_interval:
            return self._layout_found[1]
        found = collect.detect_layout(self._agent_settings)
        driver: Any = found.driver
        layout = (
            actuate.Layout(version=found.version, driver=driver, parent=self._agent_settings.kubepods_parent)
            if found.driver
            else None
        )
        self._layout_found = (now, layout) if layout is not None else None
        return layout

    def _reconcile_due(self, pods: list[actuate.NodePod], now: float) -> bool:
        key = (self.slo.revision, self.allocatable.revision, hash(tuple(_pod_identity(p) for p in pods)))
        if key != self._reconciled or now >= self._next_reconcile:
            self._reconciled = key
            return True
        return False

    # --- the loops

    def _run_loops(self, rnd: Round) -> list[tuple[ActuationLoop, LoopResult]]:
        act = self._actuator
        act.new_round(static=rnd.static)
        out: list[tuple[ActuationLoop, LoopResult]] = []

        def run(loop: ActuationLoop, step: Callable[[], LoopResult | list[tuple[ActuationLoop, LoopResult]]]) -> None:
            """One loop; a bug or an input nobody foresaw fails that loop for this round, never the others."""
            try:
                done = step()
            except Exception as e:
                log.exception("node %s: %s failed this round", self.node, loop)
                out.append((loop, LoopResult(problems=[Problem(target=loop, reason=f"{type(e).__name__}: {e}")])))
                return
            out.extend(done if isinstance(done, list) else [(loop, done)])

        silent_for = self.slo.silent_for(rnd.now)
        quota_unlimited = self._failsafe.pins_quota(silent_for)
        if rnd.static or quota_unlimited != self._be_quota_unlimited:  # the fail-safe turning: at once
            self._be_quota_unlimited = quota_unlimited
            run("be-cgroup", lambda: be_cgroups(act, rnd, quota_unlimited=quota_unlimited))
        if rnd.static:
            run("system-config", lambda: self._system.run(act, rnd))
            run("memory-qos", lambda: memory_qos_loop(act, rnd, node_memory=self._node_memory()))
            run("resctrl", lambda: self._resctrl.run(act, rnd))
        run("failsafe", lambda: self._failsafe.run(act, rnd, silent_for=silent_for, node=self.node))
        self.stats.failsafe_active = self._failsafe.active
        if not self._failsafe.active:
            settings = self.settings
            psi_rule = (
                suppress.PsiRule(
                    threshold=settings.psi_suppress_threshold, step_percent=settings.psi_suppress_step_percent
                )
                if settings.psi_suppress_threshold > 0
                else None
            )
            run(
                "cpu-suppress",
                lambda: cpu_suppress(
                    act,
                    rnd,
                    usage_max_age=settings.usage_max_age,
                    reserved_cpu_milli=settings.reserved_cpu_milli,
                    reserved_cpus=settings.reserved_cpu_ids,
                    psi_rule=psi_rule,
                ),
            )
            if rnd.pods_known:  # no victims can be picked without the pods
                run("memory-evict", lambda: self._evictions.run(act, rnd, allocatable=self.allocatable.allocatable))
        run("cpu-burst", lambda: self._burst.run(act, rnd))
        if rnd.static:
            # a pass cut short by the round's bound is finished next round, not in reconcile_interval
            self._next_reconcile = rnd.now + (self.settings.reconcile_interval if rnd.budget > 0 else 0.0)
        return out

    # --- events

    def _event_for(self, loop: ActuationLoop, result: LoopResult, now: float) -> ActuationApplied | None:
        self.stats.problems += len(result.problems)
        wrote = bool(result.changes) and not self.dry_run
        # what a steady state repeats every round: a dry-run plan, problems, deferred work
        signature = (tuple(result.changes) if self.dry_run else (), tuple(result.problems), result.deferred)
        if not wrote and signature == self._last_event.get(loop, ((), (), 0)):
            return None
        self._last_event[loop] = signature
        for problem in result.problems:
            log.warning("node %s: %s: %s: %s", self.node, loop, problem.target, problem.reason)
        for change in result.changes:
            log.info(
                "node %s: %s%s: %s %s → %s (%s)",
                self.node,
                loop,
                " (dry run)" if self.dry_run else "",
                change.path,
                change.before,
                change.after,
                change.reason,
            )
        return ActuationApplied(
            node=self.node,
            loop=loop,
            at=now,
            dry_run=self.dry_run,
            changes=result.changes,
            problems=result.problems,
            deferred=result.deferred,
            slo_revision=self.slo.revision,
        )

    async def _publish_raw(self, subject: str, data: bytes, msg_id: str) -> object:
        return await self._bus.publish(subject, data, msg_id=msg_id)

    async def _publish(self, event: ActuationApplied) -> bool:
        subject, payload, msg_id = actuation_message(event)
        try:
            await self._bus.publish(subject, payload, msg_id=msg_id)
        except Exception as e:  # the record is lost, the actuation is not: logged above
            self.stats.publish_failures += 1
            log.warning("node %s: cannot publish the %s actuation: %s", self.node, event.loop, e)
            return False
        self.stats.events_published += 1
        return True
