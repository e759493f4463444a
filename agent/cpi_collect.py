"""The agent's CPI rounds (issue 23, point 6): every `cpi_interval` seconds, cycles and instructions of each pod's
cgroup counted on every online CPU for `cpi_window` seconds (koordlet's CPICollector, per pod rather than per
container), handed to agent.service, which puts them beside the pods' next samples and so into the batch.

`run()` first probes whether this kernel lets the agent count hardware events at all (agent.perf.probe). Where it
does not (a VM without a PMU, a seccomp profile, kernel.perf_event_paranoid without CAP_PERFMON) it logs one warning
naming the reason, sets `CpiStats.cpi_unavailable` (exported as koordbus_agent_cpi_unavailable) and returns: nothing
is counted and nothing reported, no zeros. Otherwise each round lists the pod cgroups of the perf_event hierarchy
(agent.collect.perf_event_pod_dirs), opens and enables their counter groups in a worker thread, waits out the window
on the event loop, and reads and closes them in a worker thread again; a round never blocks the loop, and a
cancelled round closes every descriptor it opened, also one opened by a thread that finishes after the cancel. A
pod whose cgroup the kernel refuses is left out and the reason logged when it changes; when no pod could be counted
for a reason (not merely because the pods went away), the agent counts as unavailable until a round counts one
again. Descriptors are bounded: a round opens at most a quarter of the process's budget (agent.collect.
descriptor_budget) and counts the other pods in the next rounds, in turn (agent.cpi.plan_round).

Built by agent.service.AgentService when `cpi_collect` is on; the tests build it with another probe, other events
(software ones, on machines without a PMU), a clock and a sleep.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agent import collect, cpi, cpus, perf
from agent.settings import AgentSettings
from schemas.cpi import MAX_WINDOW_SECONDS

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass
class CpiStats:
    """The CPI rounds' counters, exported on /metrics with the agent's (agent.metrics)."""

    cpi_unavailable: bool = False
    """True while CPI is on but the kernel does not let the agent count (see `cpi_reason`)."""
    cpi_rounds: int = 0
    """Counting windows completed."""
    cpi_pods: int = 0
    """Pods counted in the last round."""
    cpi_pod_failures: int = 0
    """Pods whose counters the kernel refused to open or read."""
    cpi_reason: str = ""
    """Why CPI is unavailable ("" while it is not)."""


async def in_thread(call: Callable[[], _T], *, if_abandoned: Callable[[_T], object]) -> _T:
    """`call()` in a worker thread. When the caller is cancelled meanwhile the thread still runs to its end (a
    thread cannot be stopped), and then `if_abandoned` gets what it returned, so descriptors it opened get closed."""
    future = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def cleanup(done: asyncio.Future[_T]) -> None:
            if not done.cancelled() and done.exception() is None:
                if_abandoned(done.result())

        future.add_done_callback(cleanup)
        raise


def _close_all(opened: Mapping[str, perf.CounterGroups]) -> None:
    for groups in opened.values():
        groups.close()


class CpiCollector:
    """The CPI rounds of one agent: `run()` in a background task, `take()` from the collection loop."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        probe: Callable[[], str | None] | None = None,
        events: Sequence[cpi.Event] = cpi.CPI_EVENTS,
        max_descriptors: int | None = None,
    ) -> None:
        """`probe`: None when counting `events` is allowed, else why not (default: agent.perf.probe of `events`);
        `events`: what is counted, leader first, reported as cycles and instructions."""
        self.settings = settings
        self.stats = CpiStats()
        self._clock = clock
        self._sleep = sleep
        self._events = tuple(events)
        self._probe = probe if probe is not None else (lambda: perf.probe(self._events, proc_root=settings.proc_root))
        self._max_descriptors = max_descriptors if max_descriptors is not None else collect.descriptor_budget(share=4)
        self._offset = 0
        self._pending: dict[str, cpi.CpiCount] = {}
        self._problem = ""
        self._partial = ""

    def take(self) -> dict[str, cpi.CpiCount]:
        """The counts finished since the last call, by pod uid (agent.service attaches them to the pods' samples)."""
        taken, self._pending = self._pending, {}
        return taken

    async def run(self) -> None:
        """Probe, then count a round every `cpi_interval` seconds until cancelled; returns at once when the probe says
        the kernel does not allow it."""
        node = self.settings.node_name
        reason = self._probe()
        if reason is not None:
            self.stats.cpi_unavailable, self.stats.cpi_reason = True, reason
            log.warning("node %s: CPI not available: %s; no CPI is reported", node, reason)
            return
        log.info(
            "node %s: CPI on: %s of every pod counted for %g s every %g s",
            node,
            " and ".join(e.name for e in self._events),
            self.settings.cpi_window,
            self.settings.cpi_interval,
        )
        next_at = self._clock()
        failed = ""
        while True:
            try:
                await self.round_once()
            except Exception as e:  # a round that fails costs that round's counts, not the rounds after it
                if repr(e) != failed:
                    log.warning("node %s: a CPI round failed: %r", node, e)
                failed = repr(e)
            else:
                failed = ""
            next_at += self.settings.cpi_interval
            now = self._clock()
            if next_at < now:  # a round longer than the interval: the next starts now, missed ones are skipped
                next_at = now
            await self._sleep(next_at - now)

    async def round_once(self) -> dict[str, cpi.CpiCount]:
        """One counting window over the pods this round holds; the counts are also kept for `take()`."""
        settings = self.settings
        layout = collect.detect_layout(settings)
        pods, layout_problem = collect.perf_event_pod_dirs(settings, layout)
        try:
            online = cpus.online_cpus(settings.sys_root)
        except (OSError, ValueError):
            online = list(range(os.cpu_count() or 1))
        chosen, self._offset = cpi.plan_round(
            pods,
            fds_per_pod=len(self._events) * len(online),
            max_fds=self._max_descriptors,
            offset=self._offset,
        )
        partial = f"{len(chosen)} of {len(pods)}" if len(chosen) < len(pods) else ""
        if partial != self._partial and partial:
            log.info(
                "node %s: CPI counts %s pods per round (%d descriptors each, at most %d open); the others in turn",
                settings.node_name,
                partial,
                len(self._events) * len(online),
                self._max_descriptors,
            )
        self._partial = partial
        if not chosen:  # nothing to count: no window either
            self._note({}, {}, layout_problem)
            return {}

        opened, failures = await in_thread(
            lambda: self._open(chosen, online), if_abandoned=lambda result: _close_all(result[0])
        )
        start = self._clock()
        try:
            await self._sleep(settings.cpi_window)
        except BaseException:
            _close_all(opened)
            raise
        end = self._clock()
        reads, read_failures = await in_thread(lambda: self._read_and_close(opened), if_abandoned=lambda _: None)
        failures |= read_failures
        seconds = end - start if end > start else settings.cpi_window
        counts = {uid: cpi.count_of(r, t=end, seconds=min(seconds, MAX_WINDOW_SECONDS)) for uid, r in reads.items()}
        self._pending.update(counts)
        self.stats.cpi_rounds += 1
        self.stats.cpi_pods = len(counts)
        self.stats.cpi_pod_failures += len(failures)
        self._note(counts, failures, layout_problem)
        return counts

    def _open(
        self, pods: Sequence[tuple[str, str]], online: Sequence[int]
    ) -> tuple[dict[str, perf.CounterGroups], dict[str, str]]:
        """Open and enable each pod's groups (worker thread). A pod whose cgroup is gone is skipped silently, one the
        kernel refuses is in the failures with the reason; out of descriptors, the round stops opening."""
        opened: dict[str, perf.CounterGroups] = {}
        failures: dict[str, str] = {}
        try:
            for uid, directory in pods:
                try:
                    groups = perf.CounterGroups.open_cgroup(directory, online, self._events)
                except FileNotFoundError:
                    continue  # the pod went away since it was listed
                except OSError as e:
                    paranoid = perf.paranoid(self.settings.proc_root)
                    failures[uid] = cpi.explain_errno(e.errno or 0, paranoid=paranoid, cgroup=True)
                    if e.errno in (errno.EMFILE, errno.ENFILE):
                        break
                    continue
                opened[uid] = groups
            for uid, groups in list(opened.items()):
                try:
                    groups.enable()
                except OSError as e:
                    groups.close()
                    del opened[uid]
                    failures[uid] = f"enabling its counters failed: {e}"
        except BaseException:
            _close_all(opened)
            raise
        return opened, failures

    def _read_and_close(
        self, opened: Mapping[str, perf.CounterGroups]
    ) -> tuple[dict[str, list[cpi.GroupRead]], dict[str, str]]:
        """Stop, read and close each pod's groups (worker thread); every group is closed whatever happens."""
        reads: dict[str, list[cpi.GroupRead]] = {}
        failures: dict[str, str] = {}
        try:
            for uid, groups in opened.items():
                try:
                    reads[uid] = groups.read()
                except (OSError, cpi.PerfReadError) as e:
                    failures[uid] = f"reading its counters failed: {e}"
        finally:
            _close_all(opened)
        return reads, failures

    def _note(self, counts: Mapping[str, cpi.CpiCount], failures: Mapping[str, str], layout_problem: str) -> None:
        """Log what keeps pods from being counted when that changes; unavailable while a reason keeps every pod out."""
        node = self.settings.node_name
        reasons = sorted(set(failures.values()))
        problem = layout_problem or "; ".join(reasons)
        if problem != self._problem:
            if problem and not counts:
                log.warning("node %s: CPI not counted for any pod: %s", node, problem)
            elif problem:
                log.warning("node %s: CPI not counted for %d pods: %s", node, len(failures), problem)
            else:
                log.info("node %s: CPI counted again", node)
        self._problem = problem
        unavailable = bool(problem) and not counts
        self.stats.cpi_unavailable = unavailable
        self.stats.cpi_reason = problem if unavailable else ""
