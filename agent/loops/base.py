"""What every QoS loop shares: one round's inputs (`Round`), its outcome (`LoopResult`), and the `Actuator` that
reads and writes the cgroup and resctrl files (confined to their roots by agent.files.RootedFiles), honours dry-run,
counts writes and failures, and caches what only changes on static passes (the CPU topology); and the wire form of
a round's ActuationApplied (`actuation_message`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agent import actuate, evict, suppress
from agent.collect import descriptor_budget
from agent.core import Tick
from agent.cpus import read_cpus
from agent.files import PathRejected, RootedFiles
from bus import api, subjects
from schemas.qos import ActuationApplied, Change, Problem


def actuation_message(event: ActuationApplied) -> tuple[str, bytes, str]:
    """(subject, payload, message id) an ActuationApplied is published as (agent.loops.runner; simulated nodes'
    evictions, koordbus.simulation): one per node, loop and round."""
    return (
        subjects.node_actuation(event.node),
        msgspec.json.encode(event),
        api.msg_id(event.node, "actuation", event.loop, event.at),
    )


@dataclass
class QosStats:
    """Counters exported on /metrics."""

    rounds: int = 0
    writes: int = 0
    write_failures: int = 0
    problems: int = 0
    events_published: int = 0
    publish_failures: int = 0
    pod_list_failures: int = 0
    evictions_requested: int = 0
    evictions_killed_locally: int = 0
    failsafe_active: bool = False
    last_round_seconds: float = 0.0
    cgroup_wakeups: int = 0
    """Rounds started early because a pod's cgroup appeared (agent.cgroup_watch)."""


@dataclass
class LoopResult:
    changes: list[Change] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    deferred: int = 0
    victims: list[evict.Victim] = field(default_factory=list)


@dataclass
class Round:
    """One round's inputs, shared by the loops; `budget` is what is left of max_writes_per_round."""

    pods: list[actuate.NodePod]
    pods_known: bool
    """False when the kubelet's pod list could not be read this round (`pods` is then empty)."""
    layout: actuate.Layout
    slo: dict[str, Any]
    now: float
    tick: Tick | None
    static: bool
    """The static loops' pass is due (pods, NodeSLO or the batch/mid decision changed, or reconcile_interval passed)."""
    budget: int
    cpu_normalization_ratio: float | None = None
    """The node's CPU normalization ratio (agent.allocatable_watch); BE CFS quotas are divided by it when above 1."""


class Actuator:
    def __init__(self, *, cgroup_root: str, resctrl_root: str, sys_root: str, dry_run: bool, stats: QosStats) -> None:
        self.cgroups = RootedFiles(cgroup_root, max_open=descriptor_budget(share=4))
        self.resctrl = RootedFiles(resctrl_root, max_open=64)
        self.sys_root = sys_root
        self.dry_run = dry_run
        self.stats = stats
        self._cpus: list[suppress.Cpu] | None = None
        self.be_cpuset_settled = False
        """False while the cpu-suppress loop's cpuset change under besteffort is unfinished (agent.loops.suppress)."""
        self.memory_qos_applied = False
        """The memory-qos loop wrote values and has not yet given them all back (agent.loops.cgroups)."""
        self.be_cpu_pools: suppress.BeCpuPools | None = None
        """The CPUs BE may have as the last readable pod list said (agent.loops.suppress)."""

    def new_round(self, *, static: bool) -> None:
        """Path verdicts are forgotten every round; kept descriptors not read since the last static pass are closed
        at the next one."""
        for files in (self.cgroups, self.resctrl):
            files.new_round()
            if static:
                files.sweep()

    def close(self) -> None:
        self.cgroups.close()
        self.resctrl.close()

    def apply_wants(self, wants: Sequence[actuate.Want], result: LoopResult, rnd: Round) -> None:
        """Read the wanted cgroup files, write the differences in a safe order within the round's budget."""
        current: dict[str, str | None] = {}
        for want in wants:
            try:
                current[want.path] = actuate.normalize(want.path, self.cgroups.read(want.path))
            except (OSError, PathRejected) as e:
                result.problems.append(Problem(target=want.path, reason=f"cannot read: {e}"))
        readable = [w for w in wants if w.path in current]
        planned = actuate.plan(readable, current, limit=rnd.budget)
        result.deferred += planned.deferred
        for want in planned.missing:
            result.problems.append(Problem(target=want.path, reason="cgroup file missing (not created yet or gone)"))
        for want, before in planned.writes:
            if self.write(self.cgroups, want.path, want.value, result):
                result.changes.append(Change(path=want.path, before=before, after=want.value, reason=want.reason))
                rnd.budget -= 1

    def write(self, files: RootedFiles, path: str, value: str, result: LoopResult) -> bool:
        """Write one value (nothing in dry-run); a refusal becomes a Problem. True when written (or planned)."""
        if self.dry_run:
            return True
        try:
            files.write(path, value)
        except (OSError, PathRejected) as e:
            self.stats.write_failures += 1
            result.problems.append(Problem(target=path, reason=f"write of {value!r} refused: {e}"))
            return False
        self.stats.writes += 1
        return True

    def try_append(self, files: RootedFiles, path: str, value: str) -> bool:
        """Append one value; a refusal is tolerated (a thread that exited meanwhile). True in dry-run."""
        if self.dry_run:
            return True
        try:
            files.append(path, value)
        except OSError:
            return False
        self.stats.writes += 1
        return True

    def read_cpuset(self, path: str) -> set[int] | None:
        try:
            text = self.cgroups.read(path)
            return suppress.parse_cpuset(text) if text is not None and text.strip() else None
        except (OSError, ValueError, PathRejected):
            return None

    def cpu_topology(self, refresh: bool) -> list[suppress.Cpu]:
        """The node's CPUs, read again when `refresh` (static passes: CPU hot-plug is rare, sysfs is not free)."""
        if refresh or self._cpus is None:
            self._cpus = read_cpus(self.sys_root)
        return self._cpus

    def subdirs(self, directory: str, *, depth: int) -> list[str]:
        """`directory` (relative to the cgroup root) and its subdirectories down to `depth` levels, parents first."""
        out = [directory]
        frontier = [directory]
        for _ in range(depth):
            children: list[str] = []
            for parent in frontier:
                try:
                    with os.scandir(self.cgroups.path(f"{parent}/x").rsplit("/", 1)[0]) as it:
                        names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
                except (OSError, PathRejected):
                    continue
                children += [f"{parent}/{name}" for name in names]
            out += children
            frontier = children
        return out
