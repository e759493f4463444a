"""The evidence the acceptance suite's CPU suppress test judges (spec §5.5.1), gathered so that the verdict does not
depend on this machine's other load.

The besteffort CFS quota follows `capacity × threshold − non-BE pods − system`, and "system" is everything else the
machine runs: comparing the quota file across time measures the neighbours as much as the agent. So the test reads
the agent's own account instead. Each quota write (`QuotaWrite`, from an ActuationApplied change) states its terms;
`Ticks` (from the agent's published NodeMetricsReported batches) finds the collection those terms came from, which
gives the exact window `[a, b]` the agent measured the pods over; `Counter` is the test's own reading of a cgroup's
cpuacct.usage every few milliseconds, and `Counter.bracket` bounds what that cgroup used over `[a, b]` from those
reads alone. `spec_problems` holds each write to spec §5.5.1 of its own terms; `Measured` sets a write's non-BE term
beside the test's own bounds on it. Used by tests/acceptance/test_node_acceptance.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported
from schemas.qos import ACTUATION_DECODER, ActuationApplied
from tests.acceptance.spec import spec_cfs_quota, spec_suppress

READ_DELAY = 0.05
"""Seconds after a collection's timestamp by which the agent has read every pod's counter: it takes the timestamp,
then reads /proc/stat, /proc/meminfo and four pods' cgroup files (a few milliseconds; 50 ms leaves room for the
agent being descheduled in between on a loaded machine)."""

LIST_DELAY = 5.0
"""Seconds the agent's QoS round may spend reading the kubelet's pod list (its timeout) between taking its time and
taking the latest collection: a write may state the terms of a collection newer than itself."""

_REASON = re.compile(
    r"BE may use (?P<capacity>\d+)m × (?P<threshold>[\d.]+)% − non-BE pods (?P<non_be>-?\d+)m − system "
    r"(?P<system>-?\d+)m = (?P<allowed>-?\d+)m(?:, raised to cpuSuppressMinPercent (?P<min>[\d.]+)% = (?P<floor>\d+)m)?"
    r": CFS quota (?P<quota>\d+) µs per 100 ms"
)


async def agent_account(nats_url: str, node: str) -> tuple[list[ActuationApplied], list[NodeMetricsReported]]:
    """`node`'s actuations and metric batches as the bus stores them."""
    bus = await JetStreamBus.connect(nats_url, name="acceptance-suppress-reader")
    try:
        actuations = await bus.read_recent(
            streams.KOORD_NODE, subjects.stored(subjects.node_actuation(node)), since=0, limit=10_000
        )
        metrics = await bus.read_recent(
            streams.KOORD_NODE, subjects.stored(subjects.node_metrics(node)), since=0, limit=10_000
        )
    finally:
        await bus.close()
    batches = [NODE_EVENT_DECODER.decode(d.data) for d in metrics]
    return (
        [ACTUATION_DECODER.decode(d.data) for d in actuations],
        [b for b in batches if isinstance(b, NodeMetricsReported)],
    )


@dataclass
class Counter:
    """One cgroup's cpuacct.usage as the test reads it: (read began, read ended, ns) in time order."""

    path: Path
    reads: list[tuple[float, float, int]] = field(default_factory=list)

    def read(self) -> None:
        began = time.time()
        ns = int(self.path.read_text())
        self.reads.append((began, time.time(), ns))

    def used_milli(self, start: float, end: float) -> float:
        """CPU used between the last read ending before `start` and the first beginning after `end`, per second."""
        before = [r for r in self.reads if r[1] <= start]
        after = [r for r in self.reads if r[0] >= end]
        if not before or not after:
            return 0.0
        return (after[0][2] - before[-1][2]) / 1e6 / (after[0][0] - before[-1][1])

    def bracket(self, a: float, b: float, *, delay: float = READ_DELAY) -> tuple[float, float] | None:
        """Bounds, in millicores over `b − a` seconds, on what a reader that read this counter at some instant of
        [a, a + delay] and again of [b, b + delay] measured: the counter only grows, so between the test's reads
        that surround those instants it lies between the values those reads saw. None when the test's reads do not
        surround both instants."""
        ended = [r for r in self.reads if r[1] <= a]
        start_high = next((r for r in self.reads if r[0] >= a + delay), None)
        end_low = [r for r in self.reads if r[1] <= b]
        end_high = next((r for r in self.reads if r[0] >= b + delay), None)
        if not ended or start_high is None or end_high is None:
            return None
        span = (b - a) * 1e6
        return (end_low[-1][2] - start_high[2]) / span, (end_high[2] - ended[-1][2]) / span


async def sample(counters: Iterable[Counter], *, period: float) -> None:
    """Read every counter each `period` seconds until cancelled."""
    while True:
        for counter in counters:
            with contextlib.suppress(OSError):
                counter.read()
        await asyncio.sleep(period)


@dataclass(frozen=True, kw_only=True)
class QuotaWrite:
    """One write of the besteffort CFS quota the agent reported, with the terms its reason states (None for a write
    that states none, e.g. one releasing the quota)."""

    at: float
    loop: str
    before: int
    after: int
    reason: str
    capacity: int | None = None
    threshold: float | None = None
    min_percent: float | None = None
    non_be: int = 0
    system: int = 0
    allowed: int = 0
    stated_quota: int = 0

    def line(self) -> str:
        return f"{self.at:.2f} {self.loop}: {self.before} → {self.after} ({self.reason})"


def quota_writes(events: Iterable[ActuationApplied], *, path_suffix: str) -> list[QuotaWrite]:
    """Every change to the file ending in `path_suffix`, in time order."""
    out: list[QuotaWrite] = []
    for event in events:
        for change in event.changes:
            if not change.path.endswith(path_suffix):
                continue
            terms = _REASON.search(change.reason)
            base = QuotaWrite(
                at=event.at, loop=event.loop, before=int(change.before), after=int(change.after), reason=change.reason
            )
            if terms is None:
                out.append(base)
                continue
            out.append(
                QuotaWrite(
                    at=base.at,
                    loop=base.loop,
                    before=base.before,
                    after=base.after,
                    reason=base.reason,
                    capacity=int(terms["capacity"]),
                    threshold=float(terms["threshold"]),
                    min_percent=float(terms["min"]) if terms["min"] else None,
                    non_be=int(terms["non_be"]),
                    system=int(terms["system"]),
                    allowed=int(terms["allowed"]),
                    stated_quota=int(terms["quota"]),
                )
            )
    return sorted(out, key=lambda w: w.at)


@dataclass(frozen=True, kw_only=True)
class Tick:
    """One collection of the agent as its batches carry it: node CPU and each sampled pod's CPU, in millicores as
    CPU suppress truncates them."""

    at: float
    previous: float
    """The collection before it: the agent measured [previous, at]."""
    node: int
    pods: dict[str, int]

    def terms(self, be_uids: set[str]) -> tuple[int, int]:
        """(non-BE pods, system) as spec §5.5.1 computes them from this collection (no reserved CPU here)."""
        non_be = sum(used for uid, used in self.pods.items() if uid not in be_uids)
        return non_be, max(self.node - sum(self.pods.values()), 0)


class Ticks:
    """The agent's collections, from its published batches (pod lists left out of a batch are the last one sent)."""

    def __init__(self, batches: Sequence[NodeMetricsReported]) -> None:
        pod_lists: dict[int, list[str]] = {}
        node: dict[float, int] = {}
        pods: dict[float, dict[str, int]] = {}
        for batch in sorted(batches, key=lambda b: b.window_start):
            if batch.pods:
                pod_lists[batch.pods_digest] = [p.uid for p in batch.pods]
            uids = pod_lists.get(batch.pods_digest, [])
            for at, cores, _ in batch.node_samples:
                node[at] = int(cores * 1000)
            columns = batch.pod_samples.arrays()
            for index, at, cores in zip(columns.index, columns.t, columns.cpu, strict=True):
                if index < len(uids):
                    pods.setdefault(float(at), {})[uids[index]] = int(float(cores) * 1000)
        times = sorted(node)
        self.ticks = [
            Tick(at=at, previous=prev, node=node[at], pods=pods.get(at, {})) for prev, at in itertools.pairwise(times)
        ]

    @property
    def last(self) -> float:
        return self.ticks[-1].at if self.ticks else 0.0

    def near(self, at: float, *, be_uids: set[str], max_age: float) -> list[tuple[float, int, int, int]]:
        """(time, non-BE, system, pods sampled) of the collections a write at `at` may have used, for a failure
        message."""
        return [(round(t.at, 2), *t.terms(be_uids), len(t.pods)) for t in self._around(at, max_age)]

    def stated_by(self, write: QuotaWrite, *, be_uids: set[str], max_age: float) -> Tick | None:
        """The collection whose terms are the ones the write states, of those it may have used: at most `max_age`
        s older than the write, or newer by up to LIST_DELAY (the agent's round takes its time before it reads the
        kubelet's pod list, and the latest collection after); the nearest in time when several match."""
        matches = [t for t in self._around(write.at, max_age) if t.terms(be_uids) == (write.non_be, write.system)]
        return min(matches, key=lambda t: abs(t.at - write.at), default=None)

    def _around(self, at: float, max_age: float) -> list[Tick]:
        return [t for t in self.ticks if at - max_age <= t.at <= at + LIST_DELAY]


def spec_problems(
    writes: Sequence[QuotaWrite], *, cpus: int, threshold_percent: float, probes: Sequence[float]
) -> list[str]:
    """What is wrong with `writes`: a stated capacity or threshold that is not the node's, an allowance or a quota
    that is not spec §5.5.1 of the terms stated (written where the spec skips the move included), or a write that
    read something other than what the previous write left (only the test's probes set the file to -1)."""
    problems: list[str] = []
    for previous, write in zip([None, *writes], writes, strict=False):
        if previous is not None and write.before != previous.after:
            probed = write.before == -1 and any(previous.at < p <= write.at + 1 for p in probes)
            if not probed:
                problems.append(f"read {write.before} but the last write was {previous.after}: {write.line()}")
        if write.capacity is None:
            continue
        allowed = spec_suppress(
            capacity_milli=write.capacity,
            threshold_percent=write.threshold or 0,
            min_percent=write.min_percent,
            non_be=write.non_be,
            system=write.system,
        )
        quota = spec_cfs_quota(allowed, current=write.before, cpus=cpus)
        if (write.capacity, write.threshold) != (cpus * 1000, threshold_percent):
            problems.append(f"not this node's capacity {cpus * 1000}m × {threshold_percent:g}%: {write.line()}")
        elif (write.allowed, write.after, write.stated_quota) != (allowed, quota, quota):
            problems.append(f"spec §5.5.1 gives {allowed}m, quota {quota} (None: no write) for {write.line()}")
    return problems


@dataclass(frozen=True, kw_only=True)
class Measured:
    """A write's non-BE term beside what the test measured over the same collection window: `low`..`high` bound the
    non-BE pods' usage the agent could have measured (the pods' own load plus the extra load, each bracketed, less
    the agent's truncation to whole millicores, up to 1m per pod); `extra` brackets the extra load alone."""

    write: QuotaWrite
    tick: Tick
    low: float
    high: float
    own: float
    """Midpoint of the non-BE pods' own load (without the extra one)."""
    extra: tuple[float, float]

    @property
    def agrees(self) -> bool:
        return self.low <= self.write.non_be <= self.high

    def line(self) -> str:
        return (
            f"[{self.tick.previous:.2f}, {self.tick.at:.2f}] non-BE {self.write.non_be}m, measured "
            f"[{self.low:.0f}, {self.high:.0f}]m; above the pods' own load {self.write.non_be - self.own:.0f}m, "
            f"the extra load used [{self.extra[0]:.0f}, {self.extra[1]:.0f}]m ({self.write.line()})"
        )


def measure(write: QuotaWrite, tick: Tick, *, own: Sequence[Counter], extra: Counter) -> Measured | None:
    """`write` judged against the test's counters of the non-BE pods (`own`: their cgroups without the extra load;
    `extra`: its cgroup); None when the test's reads do not surround the tick's window."""
    brackets = [c.bracket(tick.previous, tick.at) for c in (*own, extra)]
    known = [b for b in brackets if b is not None]
    if len(known) < len(brackets):
        return None
    pods = 2  # the prod and LS pods: the extra load runs in the LS pod
    return Measured(
        write=write,
        tick=tick,
        low=sum(lo for lo, _ in known) - pods,
        high=sum(hi for _, hi in known),
        own=sum(lo + hi for lo, hi in known[:-1]) / 2,
        extra=known[-1],
    )
