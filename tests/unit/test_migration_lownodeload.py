"""Load-aware descheduling: the anomaly debounce, just enough pods (cheapest first) to get under the high
threshold, destinations below the low threshold and their room, stale NodeMetrics taking no part, unevictable
pods skipped."""

from __future__ import annotations

from typing import Any

from schemas import kube
from services.migration.args import MigrationArgs
from services.migration.lownodeload import LowNodeLoadArgs, NodeLoad, plan
from tests.support.migration import pod

NOW = 10_000.0
ARGS = LowNodeLoadArgs(enabled=True, anomaly_rounds=2)
GI = 2**30


def load(cpu_used: int, *, pods: list[tuple[kube.Pod, dict[str, int]]] | None = None, updated: float = NOW) -> NodeLoad:
    return NodeLoad(
        allocatable={"cpu": 100_000, "memory": 100 * GI},
        usage={"cpu": cpu_used, "memory": 10 * GI},
        updated=updated,
        pods=pods or [],
    )


def hot_pods() -> list[tuple[kube.Pod, dict[str, int]]]:
    return [
        (pod("prod", priority=9500, node="hot"), {"cpu": 20_000}),
        (pod("batch-a", priority=5500, node="hot"), {"cpu": 8_000}),
        (pod("batch-b", priority=5400, node="hot"), {"cpu": 8_000}),
        (pod("bare", owner=None, priority=5000, node="hot"), {"cpu": 30_000}),  # never evictable
    ]


def run(nodes: dict[str, NodeLoad], streaks: dict[str, int], **args: Any) -> tuple[dict[str, int], list[str]]:
    new, requests = plan(nodes, streaks, ARGS if not args else LowNodeLoadArgs(**{"enabled": True, **args}),
                         MigrationArgs(), now=NOW)  # fmt: skip
    return new, [r.pod.metadata.name for r in requests]


def test_the_debounce_then_just_enough_cheapest_pods() -> None:
    nodes = {"hot": load(85_000, pods=hot_pods()), "cold": load(10_000)}
    streaks, requests = run(nodes, {})
    assert streaks == {"hot": 1} and requests == []  # one round over: not yet
    streaks, requests = run(nodes, streaks)
    assert streaks == {"hot": 2}
    # 85% → below 70% needs 15 cores: batch-b (5400) then batch-a (5500); the bare pod is skipped
    assert requests == ["batch-b", "batch-a"]
    assert run({"hot": load(60_000, pods=hot_pods()), "cold": load(10_000)}, {"hot": 5})[0] == {}  # back under


def test_no_destination_no_move_and_room_limits_it() -> None:
    nodes = {"hot": load(85_000, pods=hot_pods()), "warm": load(50_000)}
    assert run(nodes, {"hot": 5})[1] == []  # nobody below the low thresholds
    small_room = {"hot": load(85_000, pods=hot_pods()), "cold": load(62_000, updated=NOW)}
    # cold is at 62%: not a destination (low 30%)
    assert run(small_room, {"hot": 5})[1] == []
    tight = {"hot": load(85_000, pods=hot_pods()), "cold": load(29_000)}  # room 41 cores: enough
    assert run(tight, {"hot": 5})[1] == ["batch-b", "batch-a"]


def test_stale_nodes_take_no_part() -> None:
    stale_source = {"hot": load(85_000, pods=hot_pods(), updated=NOW - 500), "cold": load(10_000)}
    streaks, requests = run(stale_source, {"hot": 5})
    assert streaks == {} and requests == []
    stale_destination = {"hot": load(85_000, pods=hot_pods()), "cold": load(10_000, updated=NOW - 500)}
    assert run(stale_destination, {"hot": 5})[1] == []


def test_at_most_max_pods_per_node() -> None:
    many = [(pod(f"b{i}", priority=5500, node="hot"), {"cpu": 1_000}) for i in range(20)]
    nodes = {"hot": load(95_000, pods=many), "cold": load(0)}
    assert len(run(nodes, {"hot": 5}, anomaly_rounds=1, max_pods_per_node=3)[1]) == 3
