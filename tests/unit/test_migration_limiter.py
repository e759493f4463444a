"""Object limiters (spec §4.7): per-workload token buckets at maxMigrating per duration, burst, namespace
limiters, pods without a controller, and buckets forgotten 1.5 durations after the last eviction."""

from __future__ import annotations

from typing import Any

import msgspec

from services.migration.args import MigrationArgs
from services.migration.limiter import ObjectLimiters
from tests.support.migration import pod


def limiters(**given: Any) -> ObjectLimiters:
    return ObjectLimiters(msgspec.convert(given, MigrationArgs))


def test_the_default_workload_limiter_refills_at_max_migrating_per_duration() -> None:
    limit = limiters()  # workload, 5 minutes; 10 replicas → maxMigrating 2 → one token per 150 s
    p = pod("p")
    assert not limit.exhausted(p, now=0)
    limit.evicted(p, now=0, replicas=10)
    assert limit.exhausted(p, now=1)
    assert limit.exhausted(p, now=149)
    assert not limit.exhausted(p, now=150)
    assert not limit.exhausted(pod("other", owner="rs-2"), now=1)  # another workload has its own bucket


def test_burst_lets_several_go_at_once() -> None:
    limit = limiters(objectLimiters={"workload": {"duration": "1m", "burst": 3}})
    p = pod("p")
    for second in range(3):
        assert not limit.exhausted(p, now=second * 0.001)
        limit.evicted(p, now=second * 0.001, replicas=10)
    assert limit.exhausted(p, now=0.01)


def test_namespace_limiter_and_bare_pods() -> None:
    limit = limiters(objectLimiters={"namespace": {"duration": "10s", "maxMigrating": 1}})
    bare = pod("bare", owner=None, namespace="apps")
    limit.evicted(bare, now=0, replicas=None)
    assert limit.exhausted(pod("x", namespace="apps"), now=5)
    assert not limit.exhausted(pod("x", namespace="apps"), now=10)
    only_workload = limiters()
    only_workload.evicted(bare, now=0, replicas=None)
    assert not only_workload.exhausted(bare, now=0) and len(only_workload) == 0


def test_buckets_are_forgotten_after_one_and_a_half_durations() -> None:
    limit = limiters(objectLimiters={"workload": {"duration": "10s"}})
    limit.evicted(pod("p"), now=0, replicas=10)
    assert len(limit) == 1
    limit.exhausted(pod("p"), now=14)
    assert len(limit) == 1
    limit.exhausted(pod("p"), now=15.1)
    assert len(limit) == 0
