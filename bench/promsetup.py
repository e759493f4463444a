"""Prometheus' side of bench/compare_prometheus.py as pure functions: its configuration, the recording rules that
stand for a NodeMetric report, the exporter's exposition text and the quantiles of a list of freshness values.

The configuration is JSON (a YAML subset Prometheus reads as is). One scrape job reads the bench's exporter
(bench/node_exporter.py) every second, one target per `nodes_per_target` nodes, the target's path
`/metrics/<shard>`; one rule group, evaluated every report interval, holds one `quantile_over_time` rule per
resource × percentile × duration, so a round's outputs are complete when the group's last rule has run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.measure import quantile as quantile  # the smoke test reads it here

RESOURCES = (("cpu", "koord_node_cpu_usage_cores"), ("memory", "koord_node_memory_usage_bytes"))
"""(resource, raw series name): node CPU in cores and node memory without page cache in bytes, per node label."""
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
RULE_GROUP = "nodemetric"


def rule_name(series: str, percentile: str, duration_seconds: int) -> str:
    """`node:koord_node_cpu_usage_cores:p99_30m` (whole minutes) or `…:p99_90s`."""
    span = f"{duration_seconds // 60}m" if duration_seconds % 60 == 0 else f"{duration_seconds}s"
    return f"node:{series}:{percentile}_{span}"


def recording_rules(durations_seconds: Sequence[int], *, interval_seconds: int) -> dict[str, Any]:
    """The rules file: one group evaluated every `interval_seconds`, one rule per resource × percentile × duration."""
    rules = [
        {
            "record": rule_name(series, name, duration),
            "expr": f"quantile_over_time({q}, {series}[{duration}s])",
        }
        for _, series in RESOURCES
        for duration in durations_seconds
        for name, q in PERCENTILES
    ]
    return {"groups": [{"name": RULE_GROUP, "interval": f"{interval_seconds}s", "rules": rules}]}


def last_rule(durations_seconds: Sequence[int]) -> str:
    """The rule evaluated last in a round: once its output is visible, the whole round is."""
    _, series = RESOURCES[-1]
    return rule_name(series, PERCENTILES[-1][0], durations_seconds[-1])


def shards(nodes: int, nodes_per_target: int) -> int:
    return math.ceil(nodes / nodes_per_target)


def scrape_config(
    *, exporter_port: int, nodes: int, nodes_per_target: int, rules_file: str, scrape_seconds: int = 1
) -> dict[str, Any]:
    """prometheus.yml: scrape every shard of the exporter each `scrape_seconds`, load `rules_file`."""
    targets = [
        {"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"__metrics_path__": f"/metrics/{k}", "shard": str(k)}}
        for k in range(shards(nodes, nodes_per_target))
    ]
    interval = f"{scrape_seconds}s"
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": "60s"},
        "rule_files": [rules_file],
        "scrape_configs": [{"job_name": "koord-node", "static_configs": targets}],
    }


def exposition(names: Sequence[str], cpu: Sequence[str], memory: Sequence[str]) -> bytes:
    """Prometheus text format for these nodes' current values (already formatted), one gauge per resource."""
    (_, cpu_series), (_, memory_series) = RESOURCES
    lines = [f"# TYPE {cpu_series} gauge"]
    lines += [f'{cpu_series}{{node="{name}"}} {value}' for name, value in zip(names, cpu, strict=True)]
    lines.append(f"# TYPE {memory_series} gauge")
    lines += [f'{memory_series}{{node="{name}"}} {value}' for name, value in zip(names, memory, strict=True)]
    return ("\n".join(lines) + "\n").encode()
