"""Object limiters (spec §4.7): token buckets that slow evictions per workload (or per namespace). Pure.

For each configured limiter type with a duration > 0 (default: `workload`, 5 minutes), a key — the pod's controller
uid for `workload` (pods without a controller are not limited), its namespace for `namespace` — gets a bucket on
its first eviction: rate = maxMigrating / duration tokens per second, capacity = burst (default 1), one token per
eviction. maxMigrating is the limiter's own (`namespace`: an integer) or, for `workload`, maxMigratingPerWorkload
scaled by the workload's expected replicas (GetMaxMigrating); 0 means no bucket. A key is exhausted while its
bucket holds less than one token; buckets are forgotten 1.5 × duration after their last eviction. Time (`now`,
seconds) is a parameter. Used by the intake (before a job is created) and the reconcile (before it evicts).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import kube
from services.migration.args import MigrationArgs, duration_seconds, get_max_unavailable, scaled


@dataclass
class _Bucket:
    tokens: float
    rate: float
    capacity: float
    updated: float
    last_eviction: float

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now


class ObjectLimiters:
    def __init__(self, args: MigrationArgs) -> None:
        self._args = args
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def _keys(self, pod: kube.Pod) -> list[tuple[str, str, float]]:
        """(limiter type, key, duration seconds) for every limiter that applies to the pod."""
        out = []
        for kind, limiter in sorted(self._args.object_limiters.items()):
            seconds = duration_seconds(limiter.duration)
            if seconds <= 0:
                continue
            if kind == "workload":
                owner = kube.controller_of(pod.metadata)
                if owner is not None:
                    out.append((kind, owner.uid, seconds))
            elif kind == "namespace":
                out.append((kind, pod.metadata.namespace, seconds))
        return out

    def exhausted(self, pod: kube.Pod, *, now: float) -> bool:
        """Whether any of the pod's buckets holds less than one token now."""
        self._forget(now)
        for kind, key, _ in self._keys(pod):
            bucket = self._buckets.get((kind, key))
            if bucket is not None:
                bucket.refill(now)
                if bucket.tokens - 1 < 0:
                    return True
        return False

    def evicted(self, pod: kube.Pod, *, now: float, replicas: int | None) -> None:
        """Take one token from each of the pod's buckets (made on the first eviction of their key)."""
        for kind, key, seconds in self._keys(pod):
            limiter = self._args.object_limiters[kind]
            if kind == "workload":
                if replicas is None:
                    continue
                value = limiter.max_migrating
                if value is None:
                    value = self._args.max_migrating_per_workload
                max_migrating = get_max_unavailable(replicas, value)
            else:
                max_migrating = scaled(limiter.max_migrating, 0) if isinstance(limiter.max_migrating, int) else 0
            if max_migrating <= 0:
                continue
            bucket = self._buckets.get((kind, key))
            capacity = float(limiter.burst or 1)
            if bucket is None:
                bucket = _Bucket(
                    tokens=capacity, rate=max_migrating / seconds, capacity=capacity, updated=now, last_eviction=now
                )
                self._buckets[(kind, key)] = bucket
            bucket.refill(now)
            bucket.tokens -= 1
            bucket.last_eviction = now

    def _forget(self, now: float) -> None:
        for (kind, key), bucket in list(self._buckets.items()):
            seconds = duration_seconds(self._args.object_limiters[kind].duration)
            if now - bucket.last_eviction > 1.5 * seconds:
                del self._buckets[(kind, key)]

    def __len__(self) -> int:
        return len(self._buckets)


class EvictionRate:
    """evictQPS / evictBurst (spec §4.3): a token bucket over every eviction the executor makes."""

    def __init__(self, qps: float, burst: int, *, now: float) -> None:
        self._bucket = _Bucket(tokens=float(burst), rate=qps, capacity=float(burst), updated=now, last_eviction=now)

    def take(self, *, now: float) -> bool:
        """True (and one token spent) when an eviction may go out now."""
        self._bucket.refill(now)
        if self._bucket.tokens < 1:
            return False
        self._bucket.tokens -= 1
        return True
