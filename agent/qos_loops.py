"""The agent's QoS loops (issue 6): every round, the node's NodeSLO and pods in, cgroup and resctrl writes out.

A round (every `round_interval`, koordlet's 1 s): re-read this node's NodeSLO key when due (agent/slo_watch.py),
merge it onto the agent defaults (agent/slo.py), list the pods from the kubelet, then run each loop — plan with
agent/actuate.py from the files' current values, write only the differences, at most `max_writes_per_round` files
per round across loops — and publish what each loop did as an ActuationApplied on `koord.v1.node.<node>.actuation`:

* be-cgroup: BE pods' and containers' cpu shares/weight, CFS quota and memory limit (§5.7);
* resctrl: the LSR/LS/BE groups' L3 masks and MBA (written only when different) and the pods' threads into their
  group's `tasks` (§5.4), when any class enables resctrl QoS and resctrl is mounted at the configured root;
* failsafe: after `failsafe_after` seconds without a readable NodeSLO, the besteffort CFS quota is pinned at the
  minimum (max(2000 µs, cpuSuppressMinPercent of the node)) until the control plane is back, then released.

In dry-run nothing is written: the plan is logged and published (dry_run=true). An event is published when a loop
wrote something, or when what it would write or the problems it met differ from its last event — so a steady
dry-run or a pod whose cgroup is not there yet does not repeat itself every second. Bad input (a pod with a broken
annotation, a missing directory, a read-only file, a path outside the root) becomes a Problem for that object; a
loop never raises out of a round, and no value is written partially or out of range (agent/actuate.py checks).
File I/O runs in a worker thread so the event loop (and the metrics half of the agent) is never blocked.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from agent import actuate, burst, collect, evict, qos, suppress
from agent.core import AgentNameError, Tick
from agent.cpus import read_cpus
from agent.files import PathRejected, RootedFiles
from agent.pods import PodList
from agent.settings import AgentSettings, QosSettings
from agent.slo import effective_slo
from agent.slo_watch import KeyReader, SloSource
from bus import api, subjects
from schemas import quantity, vocab
from schemas.qos import ActuationApplied, ActuationLoop, Change, PodEvictionRequested, Problem

log = logging.getLogger(__name__)

MEMORY_EVICT_COOLDOWN_SECONDS = 4.0
CPU_EVICT_COOLDOWN_SECONDS = 20.0
"""After a round that evicted, the loop waits this long (koordlet's cool-downs)."""
MIN_SUPPRESS_QUOTA_US = 2000
"""The smallest besteffort CFS quota the cfsQuota suppress policy writes (spec §5.5.1), and the fail-safe's."""


def _pod_identity(node_pod: actuate.NodePod) -> tuple[object, ...]:
    """What of a pod the static loops read: a change of it makes them run at once."""
    meta = node_pod.pod.metadata
    return (
        meta.uid,
        meta.resource_version,
        frozenset(meta.labels.items()),
        frozenset(meta.annotations.items()),
        node_pod.pod.status.phase,
        frozenset(node_pod.containers.items()),
    )


def _spelled(resource: str, values: dict[int, int]) -> str:
    spelled = "{}={:d}" if resource == "MB" else "{}={:x}"
    return f"{resource}:" + ";".join(spelled.format(k, v) for k, v in sorted(values.items()))


class PodSource(Protocol):
    async def list(self) -> PodList: ...


class BusLike(KeyReader, Protocol):
    async def publish(self, subject: str, data: bytes, *, msg_id: str) -> object: ...


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


@dataclass
class _LoopResult:
    changes: list[Change] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    deferred: int = 0
    victims: list[evict.Victim] = field(default_factory=list)


@dataclass(frozen=True)
class _BurstTarget:
    pod: actuate.NodePod
    pod_dir: str
    config: dict[str, Any]
    containers: tuple[tuple[str, str, int], ...]
    """(container id, directory, CPU limit in millicores) of each running container with a limit."""


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
        self._agent_settings = agent_settings
        self._bus = bus
        self._pods = pods
        self._clock = clock
        self._sleep = sleep
        self._cpus = cpu_count or os.cpu_count() or 1
        self._cgroups = RootedFiles(agent_settings.cgroup_root)
        self._resctrl = RootedFiles(settings.resctrl_root)
        self._next_slo_read = 0.0
        self._last_event: dict[str, tuple[Any, ...]] = {}
        self._failsafe_active = False
        self._stopping = False
        self._said_resctrl_absent = False
        self._usage = usage or (lambda: None)
        self._pending_evictions: dict[str, float] = {}
        """uid → when its eviction was requested: counted as released, not asked for again, for a while."""
        self._cooldown_until: dict[str, float] = {}
        self._cpu_window: collections.deque[evict.CpuSample] = collections.deque()
        self._burst_ticks: collections.deque[Tick] = collections.deque(maxlen=5)
        self._throttling: dict[str, tuple[float, int, int]] = {}
        """container id → (when, nr_periods, nr_throttled) of its last cpu.stat reading."""
        self._buckets: dict[str, burst.TokenBucket] = {}
        self._be_request: int | None = None
        self._cpus_seen: list[suppress.Cpu] | None = None
        self._burst_targets: list[_BurstTarget] = []
        """Per eligible pod: its directory, config and containers with a CPU limit (rebuilt on static passes)."""
        self._quota_seen: dict[str, int] = {}
        """container id → its CFS quota as last read or written by the quota burst."""
        self._reconciled: tuple[int, int] | None = None
        """(NodeSLO revision, pod list digest) of the last full pass of the static loops."""
        self._next_reconcile = 0.0
        self._effective: tuple[int, dict[str, Any]] | None = None
        """(NodeSLO revision, the spec merged onto the defaults): merged again only when the revision moves."""
        self._burst_static_problems: list[Problem] = []
        """What the last CFS burst pass met (kept in the cpu-burst events of the rounds in between)."""

    @property
    def dry_run(self) -> bool:
        return self.settings.qos_mode != "apply"

    async def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        while not self._stopping:
            started = self._clock()
            try:
                await self.round()
            except Exception:  # a round must never end the loop; the next one starts from a fresh read
                log.exception("node %s: QoS round failed", self.node)
            await self._sleep(max(self.settings.round_interval - (self._clock() - started), 0.0))

    async def round(self) -> list[ActuationApplied]:
        """One round of every loop; returns the events it published."""
        now = self._clock()
        if now >= self._next_slo_read:
            await self.slo.refresh(now)
            self._next_slo_read = now + self.settings.slo_poll_interval
        if self._effective is None or self._effective[0] != self.slo.revision:
            self._effective = (self.slo.revision, effective_slo(self.slo.spec))
        slo = self._effective[1]
        pods = await self._list_pods()
        results = await asyncio.to_thread(self._run_loops, pods, slo, now, self._usage())
        events: list[ActuationApplied] = []
        for loop, result in results:
            if result.victims:
                await self._request_evictions(loop, result, now)
            event = self._event_for(loop, result, now)
            if event is not None and await self._publish(event):
                events.append(event)
        self.stats.rounds += 1
        self.stats.last_round_seconds = self._clock() - now
        return events

    async def _list_pods(self) -> list[actuate.NodePod] | None:
        if self._pods is None:
            return []
        try:
            listed = await self._pods.list()
        except Exception as e:  # the kubelet away or answering garbage: pod loops wait, node loops go on
            self.stats.pod_list_failures += 1
            log.warning("node %s: cannot list pods from the kubelet: %s", self.node, e)
            return None
        return listed.pods

    # --- the loops (worker thread)

    def _run_loops(
        self, pods: list[actuate.NodePod] | None, slo: dict[str, Any], now: float, tick: Tick | None
    ) -> list[tuple[ActuationLoop, _LoopResult]]:
        budget = [self.settings.max_writes_per_round]
        self._cgroups.new_round()
        self._resctrl.new_round()
        layout = self._layout()
        out: list[tuple[ActuationLoop, _LoopResult]] = []
        static = pods is not None and self._reconcile_due(pods, now)

        def run(loop: ActuationLoop, step: Callable[[], _LoopResult]) -> None:
            """One loop; a bug or an input nobody foresaw fails that loop for this round, never the others."""
            try:
                out.append((loop, step()))
            except Exception as e:
                log.exception("node %s: %s failed this round", self.node, loop)
                out.append((loop, _LoopResult(problems=[Problem(target=loop, reason=f"{type(e).__name__}: {e}")])))

        if pods is not None and layout is not None and static:
            run("be-cgroup", lambda: self._be_cgroups(pods, layout, slo, budget))
        if pods is not None and static:
            run("resctrl", lambda: self._resctrl_loop(pods, layout, slo, budget))
        if layout is not None:
            run("failsafe", lambda: self._failsafe(layout, slo, now, budget))
        if layout is not None and pods is not None and not self._failsafe_active:
            run("cpu-suppress", lambda: self._cpu_suppress(pods, layout, slo, now, tick, budget, static=static))
            try:
                out.extend(self._evictions(pods, layout, slo, now, tick, static=static))
            except Exception as e:
                log.exception("node %s: evictions failed this round", self.node)
                out.append(("memory-evict", _LoopResult(problems=[Problem(target="evictions", reason=repr(e))])))
        if layout is not None and pods is not None:
            run("cpu-burst", lambda: self._cpu_burst(pods, layout, slo, now, tick, budget, static=static))
        if static:
            # a pass cut short by the round's bound is finished next round, not in reconcile_interval
            self._next_reconcile = now + (self.settings.reconcile_interval if budget[0] > 0 else 0.0)
        return out

    def _reconcile_due(self, pods: list[actuate.NodePod], now: float) -> bool:
        key = (self.slo.revision, hash(tuple(_pod_identity(p) for p in pods)))
        if key != self._reconciled or now >= self._next_reconcile:
            self._reconciled = key
            return True
        return False

    def _layout(self) -> actuate.Layout | None:
        found = collect.detect_layout(self._agent_settings)
        if not found.driver:
            return None
        driver: Any = found.driver
        return actuate.Layout(version=found.version, driver=driver, parent=self._agent_settings.kubepods_parent)

    def _be_cgroups(
        self, pods: list[actuate.NodePod], layout: actuate.Layout, slo: dict[str, Any], budget: list[int]
    ) -> _LoopResult:
        wants, problems = actuate.be_cgroup_wants(pods, layout, slo)
        result = _LoopResult(problems=[Problem(target=p.target, reason=p.reason) for p in problems])
        self._apply_wants(wants, result, budget)
        return result

    def _apply_wants(self, wants: Sequence[actuate.Want], result: _LoopResult, budget: list[int]) -> None:
        current: dict[str, str | None] = {}
        for want in wants:
            try:
                current[want.path] = actuate.normalize(want.path, self._cgroups.read(want.path))
            except (OSError, PathRejected) as e:
                result.problems.append(Problem(target=want.path, reason=f"cannot read: {e}"))
        readable = [w for w in wants if w.path in current]
        planned = actuate.plan(readable, current, limit=budget[0])
        result.deferred += planned.deferred
        for want in planned.missing:
            result.problems.append(Problem(target=want.path, reason="cgroup file missing (not created yet or gone)"))
        for want, before in planned.writes:
            if self._write(self._cgroups, want.path, want.value, result):
                result.changes.append(Change(path=want.path, before=before, after=want.value, reason=want.reason))
                budget[0] -= 1

    def _write(self, files: RootedFiles, path: str, value: str, result: _LoopResult, *, append: bool = False) -> bool:
        if self.dry_run:
            return True
        try:
            (files.append if append else files.write)(path, value)
        except (OSError, PathRejected) as e:
            self.stats.write_failures += 1
            result.problems.append(Problem(target=path, reason=f"write of {value!r} refused: {e}"))
            return False
        self.stats.writes += 1
        return True

    def _resctrl_loop(
        self,
        pods: list[actuate.NodePod],
        layout: actuate.Layout | None,
        slo: dict[str, Any],
        budget: list[int],
    ) -> _LoopResult:
        result = _LoopResult()
        classes = slo["resourceQOSStrategy"]
        if not any(classes[c]["resctrlQOS"].get("enable") for c in ("lsrClass", "lsClass", "beClass")):
            return result
        try:
            info = self._resctrl_info()
        except (OSError, qos.QoSError, PathRejected) as e:
            if not self._said_resctrl_absent:
                log.warning("node %s: resctrl QoS is enabled but not usable here: %s", self.node, e)
                self._said_resctrl_absent = True
            result.problems.append(Problem(target=self._resctrl.root, reason=f"resctrl not usable: {e}"))
            return result
        try:
            wanted = actuate.resctrl_schemata(slo, info)
        except qos.QoSError as e:
            result.problems.append(Problem(target="resourceQOSStrategy", reason=str(e)))
            return result
        for group, lines in wanted.items():
            if not self._resctrl.exists(group):
                if self.dry_run:
                    current: dict[str, dict[int, int]] = {}
                else:
                    try:
                        self._resctrl.mkdir(group)
                    except OSError as e:
                        result.problems.append(Problem(target=group, reason=f"cannot create the group: {e}"))
                        continue
            current = actuate.parse_schemata(self._resctrl.read(f"{group}/schemata") or "")
            differing = [resource for resource, line in lines.items() if actuate.schemata_differs(line, current)]
            if not differing:
                continue
            if budget[0] <= 0:
                result.deferred += 1
                continue
            # every line of the group in one write: the kernel takes several lines at once, and a group is never
            # left with a new L3 mask but an old MBA value between two rounds
            text = "".join(line + "\n" for line in lines.values())
            if self._write(self._resctrl, f"{group}/schemata", text, result):
                result.changes.append(
                    Change(
                        path=f"{group}/schemata",
                        before=";".join(_spelled(resource, current.get(resource, {})) for resource in differing),
                        after=" ".join(lines[resource] for resource in differing),
                        reason=f"{group} {'/'.join(differing)} from the class's resctrlQOS (§5.4)",
                    )
                )
                budget[0] -= 1
        if layout is not None:
            self._assign_tasks(pods, layout, slo, result, budget)
        return result

    def _resctrl_info(self) -> actuate.ResctrlInfo:
        cbm_text = self._resctrl.read("info/L3/cbm_mask")
        root_schemata = self._resctrl.read("schemata")
        if cbm_text is None or root_schemata is None:
            raise qos.QoSError(f"no resctrl filesystem at {self._resctrl.root} (info/L3/cbm_mask, schemata)")
        vendor = ""
        try:
            with open(os.path.join(self._agent_settings.proc_root, "cpuinfo")) as f:
                for line in f:
                    if line.startswith("vendor_id"):
                        vendor = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return actuate.ResctrlInfo(
            cbm=qos.parse_cbm(cbm_text.strip()),
            cache_ids=actuate.cache_ids_of(root_schemata),
            mba=self._resctrl.exists("info/MB"),
            vendor=vendor,
        )

    def _assign_tasks(
        self,
        pods: list[actuate.NodePod],
        layout: actuate.Layout,
        slo: dict[str, Any],
        result: _LoopResult,
        budget: list[int],
    ) -> None:
        threads_file = "cgroup.threads" if layout.version == 2 else "tasks"
        by_group: dict[str, set[int]] = {}
        for node_pod in pods:
            group = actuate.group_of(node_pod, slo)
            if group is None or node_pod.pod.status.phase not in ("Running", "Pending"):
                continue
            try:
                pod_dir = layout.pod_dir(node_pod.pod.status.qos_class or vocab.KUBE_QOS_BESTEFFORT, node_pod.uid)
                for runtime, container_id in node_pod.containers.values():
                    rel = layout.file("cpu", layout.container_dir(pod_dir, runtime, container_id), threads_file)
                    text = self._cgroups.read(rel) or ""
                    by_group.setdefault(group, set()).update(int(t) for t in text.split() if t.isdigit())
            except (OSError, PathRejected, ValueError) as e:
                result.problems.append(Problem(target=node_pod.key, reason=f"cannot read its threads: {e}"))
        for group, threads in sorted(by_group.items()):
            present = {int(t) for t in (self._resctrl.read(f"{group}/tasks") or "").split() if t.isdigit()}
            missing = sorted(threads - present)
            moved = 0
            for tid in missing:
                if budget[0] <= 0:
                    result.deferred += len(missing) - moved
                    break
                # a thread that exited meanwhile is refused by the kernel: tolerated, as koordlet does
                if self.dry_run or self._try_append(f"{group}/tasks", str(tid)):
                    moved += 1
                    budget[0] -= 1
            if moved:
                result.changes.append(
                    Change(
                        path=f"{group}/tasks",
                        before=f"{len(present)} threads",
                        after=f"+{moved} threads",
                        reason=f"threads of {group} pods' containers join their resctrl group (§5.4)",
                    )
                )

    def _try_append(self, path: str, value: str) -> bool:
        try:
            self._resctrl.append(path, value)
        except OSError:
            return False
        self.stats.writes += 1
        return True

    def _cpu_suppress(
        self,
        pods: list[actuate.NodePod],
        layout: actuate.Layout,
        slo: dict[str, Any],
        now: float,
        tick: Tick | None,
        budget: list[int],
        *,
        static: bool,
    ) -> _LoopResult:
        """§5.5.1: the besteffort cgroup's CFS quota or cpuset follows what BE may use now; when the strategy is
        off, both are released (quota unlimited, every CPU). The pods' and containers' cpusets are checked when the
        besteffort one moves and on the static passes (new pods start with the kubelet's full set)."""
        result = _LoopResult()
        threshold = slo["resourceUsedThresholdWithBE"]
        quota_name = "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us"
        be_dir = layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT)
        quota_path = layout.file("cpu", be_dir, quota_name)
        unlimited = "max" if layout.version == 2 else "-1"
        try:
            all_cpus = self._cpu_topology(static)
        except (OSError, ValueError) as e:
            result.problems.append(Problem(target=self.settings.sys_root, reason=f"cannot read the CPUs: {e}"))
            return result
        every_cpu = {cpu.id for cpu in all_cpus}
        if not threshold.get("enable"):
            released = "CPU suppress is off: BE quota unlimited and every CPU (§5.5.1)"
            self._apply_wants([actuate.Want(path=quota_path, value=unlimited, reason=released)], result, budget)
            self._set_be_cpuset(layout, every_cpu, released, result, budget, full=static)
            return result
        if tick is None or tick.node is None or now - tick.at > self.settings.usage_max_age:
            result.problems.append(Problem(target="usage", reason="no fresh CPU usage sample: BE CPU left as is"))
            return result
        allowance = suppress.be_allowance(
            capacity_milli=len(all_cpus) * 1000,
            node_used_milli=int(tick.node[1] * 1000),
            pod_used_milli={p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods},
            pods=pods,
            threshold_percent=threshold.get("cpuSuppressThresholdPercent", 65),
            min_percent=threshold.get("cpuSuppressMinPercent"),
            node_reserved_milli=self.settings.reserved_cpu_milli,
        )
        if threshold.get("cpuSuppressPolicy") == "cfsQuota":
            current_text = actuate.normalize(quota_path, self._cgroups.read(quota_path))
            if current_text is None:
                result.problems.append(Problem(target=quota_path, reason="cgroup file missing"))
                return result
            current = -1 if current_text in ("-1", "max") else int(current_text)
            target = suppress.cfs_quota_target(allowance.milli, current=current, cpus=len(all_cpus))
            if target is not None:
                reason = f"BE may use {allowance.explanation}: CFS quota {target} µs per 100 ms (§5.5.1)"
                self._apply_wants([actuate.Want(path=quota_path, value=str(target), reason=reason)], result, budget)
            self._set_be_cpuset(
                layout, every_cpu, "cfsQuota policy: BE cpuset is every CPU", result, budget, full=static
            )
            return result
        old = self._read_cpuset(layout.file("cpuset", be_dir, "cpuset.cpus")) or every_cpu
        size = suppress.cpuset_size(allowance.milli, old_size=len(old), logical_cpus=len(all_cpus))
        chosen = set(suppress.pick_cpus(all_cpus, size))
        reason = f"BE may use {allowance.explanation}: {size} CPUs (§5.5.1)"
        self._set_be_cpuset(layout, chosen, reason, result, budget, full=static)
        quota_reason = "cpuset policy: BE CFS quota unlimited"
        self._apply_wants([actuate.Want(path=quota_path, value=unlimited, reason=quota_reason)], result, budget)
        return result

    def _cpu_topology(self, refresh: bool) -> list[suppress.Cpu]:
        """The node's CPUs, read again on static passes (CPU hot-plug is rare; sysfs is not free)."""
        if refresh or self._cpus_seen is None:
            self._cpus_seen = read_cpus(self.settings.sys_root)
        return self._cpus_seen

    def _read_cpuset(self, path: str) -> set[int] | None:
        try:
            text = self._cgroups.read(path)
            return suppress.parse_cpuset(text) if text is not None and text.strip() else None
        except (OSError, ValueError, PathRejected):
            return None

    def _set_be_cpuset(
        self, layout: actuate.Layout, cpus: set[int], reason: str, result: _LoopResult, budget: list[int], *, full: bool
    ) -> None:
        """Every cpuset cgroup under besteffort gets `cpus`: first the union of old and new, top down, then the new
        set, bottom up, so no child ever holds a CPU its parent lacks. Unless `full`, nothing below besteffort is
        read when besteffort already holds `cpus`."""
        top = layout.file("cpuset", layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT), "").rstrip("/")
        if not full and self._read_cpuset(f"{top}/cpuset.cpus") in (cpus, None):
            return
        dirs = self._subtree(top, depth=2)
        current = {d: self._read_cpuset(f"{d}/cpuset.cpus") for d in dirs}
        stale = [d for d in dirs if current[d] is not None and current[d] != cpus]
        if not stale:
            return
        if len(stale) * 2 > budget[0]:
            result.deferred += len(stale)
            return
        for d in dirs:  # top down
            have = current[d]
            if have is not None and have | cpus != have:
                self._write(self._cgroups, f"{d}/cpuset.cpus", suppress.format_cpuset(have | cpus), result)
        for d in reversed(dirs):  # bottom up
            have = current[d]
            if have is not None and have != cpus:
                path = f"{d}/cpuset.cpus"
                if self._write(self._cgroups, path, suppress.format_cpuset(cpus), result):
                    after = suppress.format_cpuset(cpus)
                    result.changes.append(
                        Change(path=path, before=suppress.format_cpuset(have), after=after, reason=reason)
                    )
        budget[0] -= len(stale) * 2

    def _subtree(self, top: str, *, depth: int) -> list[str]:
        """`top` and its subdirectories down to `depth` levels, parents before children (relative paths)."""
        out = [top]
        frontier = [top]
        for _ in range(depth):
            children: list[str] = []
            for directory in frontier:
                try:
                    with os.scandir(self._cgroups.path(f"{directory}/cpuset.cpus").rsplit("/", 1)[0]) as it:
                        names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
                except (OSError, PathRejected):
                    continue
                children += [f"{directory}/{name}" for name in names]
            out += children
            frontier = children
        return out

    # --- CPU burst (§5.6)

    def _cpu_burst(
        self,
        pods: list[actuate.NodePod],
        layout: actuate.Layout,
        slo: dict[str, Any],
        now: float,
        tick: Tick | None,
        budget: list[int],
        *,
        static: bool,
    ) -> _LoopResult:
        """CFS quota burst every round; CFS burst values (which only change with the pods or the NodeSLO) when
        `static`."""
        result = _LoopResult()
        node_config = slo["cpuBurstStrategy"]
        if tick is not None and (not self._burst_ticks or self._burst_ticks[-1].at != tick.at):
            self._burst_ticks.append(tick)
        state = self._pool_state(pods, node_config)
        burst_file = "cpu.max.burst" if layout.version == 2 else "cpu.cfs_burst_us"
        wants: list[actuate.Want] = []
        static_result = _LoopResult()
        latest = self._burst_ticks[-1] if self._burst_ticks else None
        container_usage = {c.container_id: c.sample[1] for p in (latest.pods if latest else ()) for c in p.containers}
        if static:
            burstable = layout.qos_dir(vocab.KUBE_QOS_BURSTABLE)
            kernel_has_burst = self._cgroups.exists(layout.file("cpu", burstable, burst_file))
            self._burst_targets = []
            for node_pod in pods:
                if not burst.eligible(node_pod):
                    continue
                config = burst.pod_config(node_config, node_pod)
                try:
                    pod_dir = layout.pod_dir(node_pod.pod.status.qos_class or vocab.KUBE_QOS_BURSTABLE, node_pod.uid)
                    limits = {c.name: burst.cpu_limit_milli(c) for c in node_pod.pod.spec.containers or ()}
                    containers = tuple(
                        (cid, layout.container_dir(pod_dir, runtime, cid), limits[name])
                        for name, (runtime, cid) in sorted(node_pod.containers.items())
                        if limits.get(name, 0) > 0
                    )
                except (AgentNameError, ValueError) as e:
                    static_result.problems.append(Problem(target=node_pod.key, reason=str(e)))
                    continue
                self._burst_targets.append(_BurstTarget(node_pod, pod_dir, config, containers))
                wants += self._cfs_burst_wants(node_pod, pod_dir, config, layout, burst_file)
            policies = {t.config.get("policy", "none") for t in self._burst_targets}
            if not kernel_has_burst and policies & {"cpuBurstOnly", "auto"}:
                reason = "this kernel has no CFS burst (Linux ≥ 5.14): not applied"
                static_result.problems.append(Problem(target=burst_file, reason=reason))
            if not kernel_has_burst:
                wants = []
        for target in self._burst_targets:
            self._quota_burst(target, layout, state, now, container_usage, result, budget, static=static)
        if static:
            self._apply_wants(wants, static_result, budget)
            self._burst_static_problems = static_result.problems
        result.changes = static_result.changes + result.changes
        result.problems = self._burst_static_problems + result.problems
        # a container's budget is forgotten after 2 periods unused (it left, or its pod's policy changed)
        period = node_config.get("cfsQuotaBurstPeriodSeconds", -1)
        self._buckets = {k: b for k, b in self._buckets.items() if now - b.last_used <= 2 * max(period, 1)}
        if static:
            running = {cid for p in pods for _, cid in p.containers.values()}
            self._quota_seen = {k: v for k, v in self._quota_seen.items() if k in running}
            self._throttling = {k: v for k, v in self._throttling.items() if k in running}
        return result

    @staticmethod
    def _cfs_burst_wants(
        node_pod: actuate.NodePod, pod_dir: str, config: dict[str, Any], layout: actuate.Layout, burst_file: str
    ) -> list[actuate.Want]:
        policy = config.get("policy", "none")
        on = policy in ("cpuBurstOnly", "auto")
        pod_value, values = burst.cfs_burst_values(node_pod, config)
        reason = f"cfs burst ({policy}): CPU limit × cpuBurstPercent {config.get('cpuBurstPercent')}% (§5.6)"
        wants = [
            actuate.Want(path=layout.file("cpu", pod_dir, burst_file), value=str(pod_value if on else 0), reason=reason)
        ]
        for name, (runtime, container_id) in node_pod.containers.items():
            if name in values:
                directory = layout.container_dir(pod_dir, runtime, container_id)
                value = str(values[name] if on else 0)
                wants.append(
                    actuate.Want(path=layout.file("cpu", directory, burst_file), value=value, reason=reason, depth=1)
                )
        return wants

    def _pool_state(self, pods: list[actuate.NodePod], config: dict[str, Any]) -> burst.PoolState:
        ticks = [t for t in self._burst_ticks if t.node is not None]
        if not ticks:
            return "unknown"
        exclusive = {p.uid for p in pods if p.koord_qos in (vocab.QOS_LSE, vocab.QOS_LSR)}
        others = exclusive | {p.uid for p in pods if p.koord_qos == vocab.QOS_BE}
        reserved = 0
        for p in pods:
            if p.uid in exclusive:
                reserved += sum(
                    quantity.amount("cpu", (c.resources.requests or {}).get("cpu", "0"))
                    for c in p.pod.spec.containers or ()
                )
        total = self._cpus - reserved / 1000
        node_avg = sum(t.node[1] for t in ticks if t.node is not None) / len(ticks)
        others_avg = sum(s.sample[1] for t in ticks for s in t.pods if s.pod.uid in others) / len(ticks)
        return burst.pool_state(total, node_avg - others_avg, config.get("sharePoolThresholdPercent", 50))

    def _quota_burst(
        self,
        target: _BurstTarget,
        layout: actuate.Layout,
        state: burst.PoolState,
        now: float,
        container_usage: dict[str, float],
        result: _LoopResult,
        budget: list[int],
        *,
        static: bool,
    ) -> None:
        """A container's quota is read on static passes and remembered in between (what we wrote is what it holds,
        unless the kubelet reset it: then the next static pass sees it); cpu.stat is read every round."""
        quota_file = "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us"
        config = target.config
        on = config.get("policy", "none") in ("cfsQuotaBurstOnly", "auto")
        percent = config.get("cfsQuotaBurstPercent", 300)
        period = config.get("cfsQuotaBurstPeriodSeconds", -1)
        pod_quota_path = layout.file("cpu", target.pod_dir, quota_file)
        for container_id, directory, limit in target.containers:
            if budget[0] < 2:
                return
            path = layout.file("cpu", directory, quota_file)
            known = None if static else self._quota_seen.get(container_id)
            if known == -1:
                continue  # no quota to burst (unlimited or missing): looked at again on the next static pass
            try:
                text = str(known) if known is not None else actuate.normalize(path, self._cgroups.read(path))
                if text is None or text in ("-1", "max"):
                    self._quota_seen[container_id] = -1
                    continue
                stat = self._cgroups.read(layout.file("cpu", directory, "cpu.stat")) or ""
            except (OSError, PathRejected) as e:
                result.problems.append(Problem(target=path, reason=f"cannot read: {e}"))
                continue
            current = int(text)
            self._quota_seen[container_id] = current
            counters = dict(collect.keyed_ints(stat))
            reading = (counters.get("nr_periods", 0), counters.get("nr_throttled", 0))
            previous = self._throttling.get(container_id)
            self._throttling[container_id] = (now, *reading)
            ratio = burst.throttled_ratio(
                previous[1:] if previous is not None and now - previous[0] <= 2 else None, reading
            )
            allows = True
            if on and period >= 0:
                bucket = self._buckets.get(container_id)
                if bucket is None:
                    bucket = burst.TokenBucket.start(
                        period_seconds=period, burst_percent=percent, now=now, seed=container_id
                    )
                    self._buckets[container_id] = bucket
                used = container_usage.get(container_id, 0.0)
                allows = bucket.allows(now=now, usage_percent=burst.usage_percent(used, limit))
            decision = burst.decide(quota_burst_on=on, limiter_allows=allows, throttled_ratio=ratio, state=state)
            base, ceil = burst.quota_bounds(limit, percent)
            wanted = burst.quota_target(current, decision, base, ceil)
            delta = wanted - current
            if delta == 0:
                continue
            reason = (
                f"cfs quota burst: {decision} (throttled {ratio if ratio is not None else 'n/a'}, pool {state}), "
                f"within [{base}, {ceil}] µs (§5.6)"
            )
            writes = [(path, current, wanted)]
            pod_text = actuate.normalize(pod_quota_path, self._cgroups.read(pod_quota_path))
            if pod_text not in (None, "-1", "max"):
                assert pod_text is not None
                pod_current = int(pod_text)
                if pod_current > 0:
                    pod_write = (pod_quota_path, pod_current, pod_current + delta)
                    writes = [pod_write, *writes] if delta > 0 else [*writes, pod_write]
            for file, before, after in writes:
                if self._write(self._cgroups, file, str(after), result):
                    result.changes.append(Change(path=file, before=str(before), after=str(after), reason=reason))
                    budget[0] -= 1
                    if file == path:
                        self._quota_seen[container_id] = after

    # --- evictions (§5.5.2, §5.5.3)

    def _evictions(
        self,
        pods: list[actuate.NodePod],
        layout: actuate.Layout,
        slo: dict[str, Any],
        now: float,
        tick: Tick | None,
        *,
        static: bool,
    ) -> list[tuple[ActuationLoop, _LoopResult]]:
        features = self.settings.evict_feature_set
        threshold = slo["resourceUsedThresholdWithBE"]
        present = {p.uid for p in pods}
        horizon = now - self.settings.eviction_pending_seconds
        self._pending_evictions = {
            uid: at for uid, at in self._pending_evictions.items() if uid in present and at > horizon
        }
        if not features or not threshold.get("enable"):
            self._cpu_window.clear()
            return []
        fresh = tick is not None and tick.node is not None and now - tick.at <= self.settings.usage_max_age
        out: list[tuple[ActuationLoop, _LoopResult]] = []
        if fresh and features & {evict.BE_MEMORY, evict.MEMORY}:
            assert tick is not None
            out.append(("memory-evict", self._memory_evict(pods, threshold, features, now, tick)))
        if fresh and evict.BE_CPU in features:
            assert tick is not None
            out.append(("cpu-evict", self._cpu_evict(pods, layout, threshold, now, tick, static=static)))
        return out

    def _memory_evict(
        self, pods: list[actuate.NodePod], threshold: dict[str, Any], features: frozenset[str], now: float, tick: Tick
    ) -> _LoopResult:
        result = _LoopResult()
        if now < self._cooldown_until.get("memory-evict", 0.0):
            return result
        try:
            capacity = collect.read_meminfo(self._agent_settings.proc_root).total_kb * 1024
        except (OSError, KeyError, ValueError) as e:
            result.problems.append(Problem(target="meminfo", reason=f"cannot read the memory total: {e}"))
            return result
        assert tick.node is not None
        victims, _ = evict.memory_victims(
            features=features,
            capacity=capacity,
            node_used=tick.node[2],
            pod_memory={p.pod.uid: p.sample[2] for p in tick.pods},
            pods=pods,
            threshold_percent=int(threshold.get("memoryEvictThresholdPercent", 70)),
            lower_percent=threshold.get("memoryEvictLowerPercent"),
            priority_threshold=threshold.get("evictEnabledPriorityThreshold"),
            pending=self._pending_evictions,
        )
        result.victims = victims
        if victims:
            self._cooldown_until["memory-evict"] = now + MEMORY_EVICT_COOLDOWN_SECONDS
        return result

    def _cpu_evict(
        self,
        pods: list[actuate.NodePod],
        layout: actuate.Layout,
        threshold: dict[str, Any],
        now: float,
        tick: Tick,
        *,
        static: bool,
    ) -> _LoopResult:
        result = _LoopResult()
        lower = threshold.get("cpuEvictBESatisfactionLowerPercent")
        upper = threshold.get("cpuEvictBESatisfactionUpperPercent")
        if lower is None or upper is None:
            return result  # BECPUEvict needs both (§5.5)
        if threshold.get("cpuEvictPolicy", "evictByRealLimit") != "evictByRealLimit":
            result.problems.append(
                Problem(target="cpuEvictPolicy", reason="only evictByRealLimit is supported by the agent")
            )
            return result
        limit = self._be_real_limit(layout)
        if limit is None:
            result.problems.append(Problem(target="besteffort", reason="cannot read the BE cpuset or CFS quota"))
            return result
        be_usage = sum(int(p.sample[1] * 1000) for p in tick.pods if p.pod.kube_qos == vocab.KUBE_QOS_BESTEFFORT)
        if static or self._be_request is None:
            self._be_request = evict.be_request_milli(pods)  # changes only with the pods: a static pass follows
        self._cpu_window.append(evict.CpuSample(at=tick.at, usage=be_usage, request=self._be_request, limit=limit))
        window_seconds = max(float(threshold.get("cpuEvictTimeWindowSeconds") or 1), 1.0)
        while self._cpu_window and self._cpu_window[0].at <= tick.at - window_seconds:
            self._cpu_window.popleft()
        if now < self._cooldown_until.get("cpu-evict", 0.0):
            return result
        release, explanation = evict.cpu_satisfaction_release(
            list(self._cpu_window),
            window_seconds=window_seconds,
            collect_interval=self._agent_settings.collect_interval,
            lower_percent=lower,
            upper_percent=upper,
            usage_threshold_percent=threshold.get("cpuEvictBEUsageThresholdPercent")
            or evict.DEFAULT_BE_USAGE_THRESHOLD,
        )
        if release > 0:
            pod_cpu = {p.pod.uid: int(p.sample[1] * 1000) for p in tick.pods}
            result.victims = evict.cpu_victims(
                pods, pod_cpu, release, pending=self._pending_evictions, reason=explanation
            )
            if result.victims:
                self._cooldown_until["cpu-evict"] = now + CPU_EVICT_COOLDOWN_SECONDS
        return result

    def _be_real_limit(self, layout: actuate.Layout) -> int | None:
        be_dir = layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT)
        cpus = self._read_cpuset(layout.file("cpuset", be_dir, "cpuset.cpus"))
        if cpus is None:
            try:
                cpus = {c.id for c in self._cpu_topology(False)}
            except (OSError, ValueError):
                return None
        limit = len(cpus) * 1000
        quota_path = layout.file("cpu", be_dir, "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us")
        try:
            quota = actuate.normalize(quota_path, self._cgroups.read(quota_path))
        except (OSError, PathRejected):
            quota = None
        if quota not in (None, "-1", "max"):
            assert quota is not None
            limit = min(limit, int(quota) * 1000 // qos.QUOTA_PERIOD_US)
        return limit

    async def _request_evictions(self, loop: ActuationLoop, result: _LoopResult, now: float) -> None:
        """Publish each victim's PodEvictionRequested (nothing in dry-run); if the bus is away and local kills are
        on, kill its containers here."""
        for victim in result.victims:
            meta = victim.pod.pod.metadata
            target = f"pods/{meta.namespace}/{meta.name}"
            if self.dry_run:
                outcome = "eviction would be requested"
            else:
                request = PodEvictionRequested(
                    node=self.node,
                    at=now,
                    namespace=meta.namespace,
                    name=meta.name,
                    uid=meta.uid,
                    feature=victim.feature,
                    reason=victim.reason,
                )
                try:
                    await self._bus.publish(
                        subjects.node_eviction(self.node),
                        msgspec.json.encode(request),
                        msg_id=api.msg_id(self.node, "eviction", meta.uid, now),
                    )
                    outcome = "eviction requested"
                    self.stats.evictions_requested += 1
                except Exception as e:
                    if not self.settings.evict_locally:
                        result.problems.append(Problem(target=target, reason=f"eviction request not sent: {e}"))
                        continue
                    killed = await asyncio.to_thread(self._kill_locally, victim.pod)
                    outcome = f"killed locally ({killed} processes; the bus is away: {e})"
                    self.stats.evictions_killed_locally += 1
                self._pending_evictions[meta.uid] = now
            result.changes.append(Change(path=target, before="running", after=outcome, reason=victim.reason))

    def _kill_locally(self, node_pod: actuate.NodePod) -> int:
        """SIGKILL every process of the pod's containers (read from their cgroup.procs); returns how many."""
        layout = self._layout()
        if layout is None:
            return 0
        killed = 0
        pod_dir = layout.pod_dir(node_pod.pod.status.qos_class or vocab.KUBE_QOS_BESTEFFORT, node_pod.uid)
        for runtime, container_id in node_pod.containers.values():
            procs = layout.file("cpu", layout.container_dir(pod_dir, runtime, container_id), "cgroup.procs")
            for pid in (self._cgroups.read(procs) or "").split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, ValueError):
                    pass
        return killed

    def _failsafe(self, layout: actuate.Layout, slo: dict[str, Any], now: float, budget: list[int]) -> _LoopResult:
        result = _LoopResult()
        silent = self.slo.silent_for(now) > self.settings.failsafe_after
        if not silent and not self._failsafe_active:
            return result
        name = "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us"
        path = layout.file("cpu", layout.qos_dir(vocab.KUBE_QOS_BESTEFFORT), name)
        if silent:
            min_percent = slo["resourceUsedThresholdWithBE"].get("cpuSuppressMinPercent") or 0
            value = str(max(MIN_SUPPRESS_QUOTA_US, self._cpus * qos.QUOTA_PERIOD_US * int(min_percent) // 100))
            silent_for, limit = self.slo.silent_for(now), self.settings.failsafe_after
            reason = (
                f"fail-safe: no NodeSLO readable for {silent_for:.0f} s (> {limit:g} s): BE CPU pinned at its "
                "minimum, no new evictions"
            )
        else:
            value = "max" if layout.version == 2 else "-1"
            reason = "fail-safe over: the control plane is back, BE CPU quota released"
        want = actuate.Want(path=path, value=value, reason=reason)
        self._apply_wants([want], result, budget)
        if not any(p.target == path for p in result.problems):
            if silent and not self._failsafe_active:
                log.warning("node %s: %s", self.node, reason)
            self._failsafe_active = silent
            self.stats.failsafe_active = silent
        return result

    @property
    def failsafe_active(self) -> bool:
        return self._failsafe_active

    # --- events

    def _event_for(self, loop: ActuationLoop, result: _LoopResult, now: float) -> ActuationApplied | None:
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

    async def _publish(self, event: ActuationApplied) -> bool:
        try:
            await self._bus.publish(
                subjects.node_actuation(self.node),
                msgspec.json.encode(event),
                msg_id=api.msg_id(self.node, "actuation", event.loop, event.at),
            )
        except Exception as e:  # the record is lost, the actuation is not: logged above
            self.stats.publish_failures += 1
            log.warning("node %s: cannot publish the %s actuation: %s", self.node, event.loop, e)
            return False
        self.stats.events_published += 1
        return True
