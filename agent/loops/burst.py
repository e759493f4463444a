"""The cpu-burst loop (spec §5.6): CFS burst values from the CPU limits (on static passes), and every round the CFS
quota of each limited container scaled with its throttling and the shared pool's state (agent.burst), the pod's
quota moved by the same amount in a safe order."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from agent import actuate, burst, collect
from agent.core import AgentNameError, Tick
from agent.files import PathRejected
from agent.loops.base import Actuator, LoopResult, Round
from schemas import quantity, vocab
from schemas.qos import Change, Problem


@dataclass(frozen=True)
class _Target:
    pod: actuate.NodePod
    pod_dir: str
    config: dict[str, Any]
    containers: tuple[tuple[str, str, int], ...]
    """(container id, directory, CPU limit in millicores) of each running container with a limit."""


class CpuBurst:
    def __init__(self, *, cpus: int) -> None:
        self._cpus = cpus
        self._ticks: collections.deque[Tick] = collections.deque(maxlen=5)
        self._throttling: dict[str, tuple[float, int, int]] = {}
        """container id → (when, nr_periods, nr_throttled) of its last cpu.stat reading."""
        self._buckets: dict[str, burst.TokenBucket] = {}
        self._quota_seen: dict[str, int] = {}
        """container id → its CFS quota as last read or written (-1: none to burst)."""
        self._targets: list[_Target] = []
        """Per eligible pod: its directory, config and limited containers (rebuilt on static passes)."""
        self._static_problems: list[Problem] = []
        """What the last static pass met (kept in the events of the rounds in between)."""

    def run(self, act: Actuator, rnd: Round) -> LoopResult:
        result = LoopResult()
        node_config = rnd.slo["cpuBurstStrategy"]
        tick = rnd.tick
        if tick is not None and (not self._ticks or self._ticks[-1].at != tick.at):
            self._ticks.append(tick)
        state = self._pool_state(rnd.pods, node_config)
        static_result = LoopResult()
        if rnd.static:
            self._rebuild(act, rnd, node_config, static_result)
        latest = self._ticks[-1] if self._ticks else None
        usage = {c.container_id: c.sample[1] for p in (latest.pods if latest else ()) for c in p.containers}
        for target in self._targets:
            self._quota_burst(act, rnd, target, state, usage, result)
        if rnd.static:
            self._static_problems = static_result.problems
            running = {cid for p in rnd.pods for _, cid in p.containers.values()}
            self._quota_seen = {k: v for k, v in self._quota_seen.items() if k in running}
            self._throttling = {k: v for k, v in self._throttling.items() if k in running}
        result.changes = static_result.changes + result.changes
        result.problems = self._static_problems + result.problems
        # a container's budget is forgotten after 2 periods unused (it left, or its pod's policy changed)
        period = node_config.get("cfsQuotaBurstPeriodSeconds", -1)
        self._buckets = {k: b for k, b in self._buckets.items() if rnd.now - b.last_used <= 2 * max(period, 1)}
        return result

    def _rebuild(self, act: Actuator, rnd: Round, node_config: dict[str, Any], result: LoopResult) -> None:
        """The eligible pods' targets, and their CFS burst values written (static passes)."""
        layout = rnd.layout
        burst_file = "cpu.max.burst" if layout.version == 2 else "cpu.cfs_burst_us"
        kernel_has_burst = act.cgroups.exists(layout.file("cpu", layout.qos_dir(vocab.KUBE_QOS_BURSTABLE), burst_file))
        wants: list[actuate.Want] = []
        self._targets = []
        for node_pod in rnd.pods:
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
                result.problems.append(Problem(target=node_pod.key, reason=str(e)))
                continue
            self._targets.append(_Target(node_pod, pod_dir, config, containers))
            wants += _cfs_burst_wants(node_pod, pod_dir, config, layout, burst_file)
        if not kernel_has_burst:
            if {t.config.get("policy", "none") for t in self._targets} & {"cpuBurstOnly", "auto"}:
                reason = "this kernel has no CFS burst (Linux ≥ 5.14): not applied"
                result.problems.append(Problem(target=burst_file, reason=reason))
            return
        act.apply_wants(wants, result, rnd)

    def _pool_state(self, pods: list[actuate.NodePod], config: dict[str, Any]) -> burst.PoolState:
        ticks = [t for t in self._ticks if t.node is not None]
        if not ticks:
            return "unknown"
        exclusive = {p.uid for p in pods if p.koord_qos in (vocab.QOS_LSE, vocab.QOS_LSR)}
        others = exclusive | {p.uid for p in pods if p.koord_qos == vocab.QOS_BE}
        reserved = 0
        for p in pods:
            if p.uid in exclusive:
                for c in p.pod.spec.containers or ():
                    reserved += quantity.amount("cpu", (c.resources.requests or {}).get("cpu", "0"))
        total = self._cpus - reserved / 1000
        node_avg = sum(t.node[1] for t in ticks if t.node is not None) / len(ticks)
        others_avg = sum(s.sample[1] for t in ticks for s in t.pods if s.pod.uid in others) / len(ticks)
        return burst.pool_state(total, node_avg - others_avg, config.get("sharePoolThresholdPercent", 50))

    def _quota_burst(
        self,
        act: Actuator,
        rnd: Round,
        target: _Target,
        state: burst.PoolState,
        usage: dict[str, float],
        result: LoopResult,
    ) -> None:
        """A container's quota is read on static passes and remembered in between (what we wrote is what it holds,
        unless the kubelet reset it: then the next static pass sees it); cpu.stat is read every round."""
        layout, now = rnd.layout, rnd.now
        quota_file = "cpu.max" if layout.version == 2 else "cpu.cfs_quota_us"
        config = target.config
        on = config.get("policy", "none") in ("cfsQuotaBurstOnly", "auto")
        percent = config.get("cfsQuotaBurstPercent", 300)
        period = config.get("cfsQuotaBurstPeriodSeconds", -1)
        pod_quota_path = layout.file("cpu", target.pod_dir, quota_file)
        for container_id, directory, limit in target.containers:
            if rnd.budget < 2:
                return
            path = layout.file("cpu", directory, quota_file)
            known = None if rnd.static else self._quota_seen.get(container_id)
            if known == -1:
                continue  # no quota to burst (unlimited or missing): looked at again on the next static pass
            try:
                text = str(known) if known is not None else actuate.normalize(path, act.cgroups.read(path))
                if text is None or text in ("-1", "max"):
                    self._quota_seen[container_id] = -1
                    continue
                stat = act.cgroups.read(layout.file("cpu", directory, "cpu.stat")) or ""
            except (OSError, PathRejected) as e:
                result.problems.append(Problem(target=path, reason=f"cannot read: {e}"))
                continue
            current = int(text)
            self._quota_seen[container_id] = current
            counters = dict(collect.keyed_ints(stat))
            reading = (counters.get("nr_periods", 0), counters.get("nr_throttled", 0))
            previous = self._throttling.get(container_id)
            self._throttling[container_id] = (now, *reading)
            recent = previous[1:] if previous is not None and now - previous[0] <= 2 else None
            ratio = burst.throttled_ratio(recent, reading)
            allows = True
            if on and period >= 0:
                bucket = self._buckets.get(container_id)
                if bucket is None:
                    bucket = burst.TokenBucket.start(
                        period_seconds=period, burst_percent=percent, now=now, seed=container_id
                    )
                    self._buckets[container_id] = bucket
                used = usage.get(container_id, 0.0)
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
            pod_text = actuate.normalize(pod_quota_path, act.cgroups.read(pod_quota_path))
            if pod_text is not None and pod_text not in ("-1", "max") and int(pod_text) > 0:
                pod_write = (pod_quota_path, int(pod_text), int(pod_text) + delta)
                writes = [pod_write, *writes] if delta > 0 else [*writes, pod_write]  # a parent never below a child
            for file, before, after in writes:
                if act.write(act.cgroups, file, str(after), result):
                    result.changes.append(Change(path=file, before=str(before), after=str(after), reason=reason))
                    rnd.budget -= 1
                    if file == path:
                        self._quota_seen[container_id] = after


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
            path = layout.file("cpu", layout.container_dir(pod_dir, runtime, container_id), burst_file)
            wants.append(actuate.Want(path=path, value=str(values[name] if on else 0), reason=reason, depth=1))
    return wants
