"""The node agent's Prometheus metrics: its metrics half's, CPI rounds', QoS loops' and topology reporter's counters
(AgentStats, CpiStats, QosStats, TopologyStats) exported as they stand at each scrape, plus its NodeSLO revision and
how long the control plane has been silent.

`AgentMetrics(agent, loops, topology=, clock=)` is a custom collector; `koordbus agent --port` registers it and
serves /metrics with /healthz and /readyz, for the DaemonSet's probes and for whoever is paged at 3 a.m.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import fields

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.loops.runner import QosLoops
from agent.service import AgentService
from agent.topology_watch import TopologyReporter

PREFIX = "koordbus_agent_"
_GAUGES = frozenset(
    {
        "buffered_batches",
        "bus_available",
        "failsafe_active",
        "last_round_seconds",
        "report_problems",
        "cpi_unavailable",
        "cpi_pods",
    }
)
_HELP = {
    "collections": "Node readings taken",
    "collect_errors": "Node readings that failed (procfs or cgroups unreadable)",
    "batches_built": "Metric batches closed",
    "batches_sent": "Metric batches stored by the bus",
    "dropped_batches": "Metric batches dropped from the full outbox while the bus was away",
    "rejected_batches": "Metric batches the bus refused for good",
    "buffered_batches": "Metric batches waiting for the bus",
    "publish_failures": "Publishes that failed because the bus was away",
    "states_sent": "NodeStateReported published",
    "bus_available": "1 while the last publish reached the bus",
    "rounds": "QoS rounds run",
    "writes": "cgroup and resctrl values written",
    "write_failures": "writes the kernel refused",
    "problems": "objects a QoS loop skipped (bad annotation, missing cgroup, refused write …)",
    "events_published": "ActuationApplied events published",
    "pod_list_failures": "kubelet pod lists that failed",
    "evictions_requested": "PodEvictionRequested published",
    "evictions_killed_locally": "pods whose containers were killed on the node (bus away, --evict-locally)",
    "failsafe_active": "1 while the fail-safe pins BE CPU (no NodeSLO readable for too long)",
    "last_round_seconds": "duration of the last QoS round",
    "reads": "topology reads",
    "reports_sent": "NodeTopologyReported published",
    "report_problems": "problems the latest topology report names (a file missing, unreadable or malformed)",
    "cpi_unavailable": "1 while CPI collection is on but the kernel does not let the agent count (reason in the log)",
    "cpi_rounds": "CPI counting windows completed",
    "cpi_pods": "pods whose CPI the last counting window counted",
    "cpi_pod_failures": "pods whose CPI counters the kernel refused to open or read",
}


class AgentMetrics:
    def __init__(
        self,
        agent: AgentService,
        loops: QosLoops | None,
        *,
        topology: TopologyReporter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._agent = agent
        self._loops = loops
        self._topology = topology
        self._clock = clock

    def describe(self) -> list[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        node = self._agent.settings.node_name
        parts = (
            (self._agent.stats, "metrics"),
            (self._agent.cpi_stats, "metrics"),
            (self._loops.stats if self._loops else None, "qos"),
            (self._topology.stats if self._topology else None, "topology"),
        )
        for stats, part in parts:
            if stats is None:
                continue
            for f in fields(stats):
                if f.name in _HELP:
                    families[f.name].add_metric([node, part], float(getattr(stats, f.name)))
        if self._loops is not None:
            families["slo_revision"].add_metric([node, "qos"], float(self._loops.slo.revision))
            families["slo_silent_seconds"].add_metric([node, "qos"], self._loops.slo.silent_for(self._clock()))
        yield from families.values()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        labels = ["node", "part"]
        out: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for name, text in _HELP.items():
            if name in _GAUGES:
                out[name] = GaugeMetricFamily(PREFIX + name, text, labels=labels)
            else:
                out[name] = CounterMetricFamily(PREFIX + name, text, labels=labels)
        out["slo_revision"] = GaugeMetricFamily(
            PREFIX + "slo_revision", "KOORD_SLO revision of the NodeSLO in effect (0: defaults)", labels=labels
        )
        out["slo_silent_seconds"] = GaugeMetricFamily(
            PREFIX + "slo_silent_seconds", "seconds since this node's NodeSLO was last readable", labels=labels
        )
        return out
