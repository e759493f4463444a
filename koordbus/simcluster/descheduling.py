"""Which simulated nodes run hot, and the descheduling the simulated cluster turns on: pure.

A few nodes (`node_loads`: about one in eight, at least three, spread over the name order; none in a cluster of
fewer than eight) start with online services that use ~66 % of their CPU on average instead of ~35 %, over the same
24 h cycle but peaking at hours spread around the clock, so whatever the time of day some of them are past the high
threshold below. `MIGRATION_ARGS` is
the MigrationControllerArgs file `koordbus up --simulate-nodes` writes to its data dir and runs the migration
service with (unless KOORDBUS_MIGRATION_ARGS_FILE names another): Koordinator's LowNodeLoad with a CPU high
threshold of 70 % and a low one of 50 %, one abnormal round enough, a round every 20 s, jobs evicting directly (no
Reservation: nothing in a simulated cluster would schedule one), so the arbiter passes jobs and the executor carries
them out against the simulated cluster (koordbus.simcluster.loop moves each evicted pod).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

HOT_SHARE: Final = 0.66
NORMAL_SHARE: Final = 0.35
NORMAL_PEAK_HOUR: Final = 14.0


class NodeLoad(NamedTuple):
    """What agent.simulate.SimulatedNode takes: the online pods' mean share of the CPU and the hour they peak."""

    online_share: float
    peak_hour: float


MIN_NODES_WITH_HOT: Final = 8
"""A smaller simulated cluster has no hot node (a hot one among three or five would be most of it)."""


def hot_count(nodes: int) -> int:
    """How many of `nodes` run hot: one in eight, at least three (none below MIN_NODES_WITH_HOT nodes)."""
    return 0 if nodes < MIN_NODES_WITH_HOT else max(3, nodes // 8)


def node_loads(names: Sequence[str]) -> dict[str, NodeLoad]:
    """Each node's load: the hot ones spread over the name order, their peaks spread over the day."""
    hot = hot_count(len(names))
    loads = {name: NodeLoad(NORMAL_SHARE, NORMAL_PEAK_HOUR) for name in names}
    for k in range(hot):
        name = names[k * len(names) // hot]
        loads[name] = NodeLoad(HOT_SHARE, (NORMAL_PEAK_HOUR + 24.0 * k / hot) % 24.0)
    return loads


MIGRATION_ARGS: Final = """\
# Written by `koordbus up --simulate-nodes` (koordbus.simcluster.descheduling); set KOORDBUS_MIGRATION_ARGS_FILE to
# run the simulation with another file.
defaultJobMode: EvictDirectly
maxMigratingPerNode: 2
maxMigratingPerWorkload: 1
maxUnavailablePerWorkload: 1
skipCheckExpectedReplicas: true
deschedulingInterval: 20s
maxNoOfPodsToEvictPerNode: 1
lowNodeLoadArgs:
  highThresholds: {cpu: 70}
  lowThresholds: {cpu: 50}
  anomalyCondition: {consecutiveAbnormalities: 1}
"""
