"""bench/noderesource.py at toy size: one JSON line with the documented keys and sane values, nothing left running or
on disk afterwards; and the synthetic cluster of bench.cluster_load checked on its own (pod mix, drift, decoding)."""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bench import cluster_load
from bench import noderesource as bench
from schemas.cluster import CLUSTER_EVENT_DECODER, NodeObserved, PodObserved
from schemas.node import NodeMetricComputed
from services.noderesource.state import ClusterState

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "noderesource.py"
DOCUMENTED_KEYS = {
    "bench", "nodes", "pods", "metric_interval_s", "duration_s", "offered_nodemetrics_per_s",
    "published_nodemetrics_per_s", "achieved_nodemetrics_per_s", "decisions_per_s", "writes_due_per_s",
    "latency_p50_s", "latency_p99_s", "service_cpu_cores", "service_rss_peak_mb", "startup_replay_s",
    "backlog_start", "backlog_end", "target_held", "target_misses", "command",
}  # fmt: skip


def test_prints_one_json_line_with_sane_figures(tmp_path: Path) -> None:
    command = [sys.executable, str(SCRIPT), "--nodes", "20", "--pods", "5", "--metric-interval", "2"]
    command += ["--warmup", "3", "--duration", "10"]
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout
    result = json.loads(lines[0])
    assert result.keys() >= DOCUMENTED_KEYS
    assert (result["bench"], result["nodes"], result["pods"], result["metric_interval_s"]) == (
        "noderesource",
        20,
        5,
        2.0,
    )
    assert result["offered_nodemetrics_per_s"] == 10.0
    assert 9.5 <= result["duration_s"] <= 14
    # 100 NodeMetrics in 10 s: only those straddling the period's edges may fall either side.
    assert 8.5 <= result["published_nodemetrics_per_s"] <= 11.5
    assert 8.5 <= result["achieved_nodemetrics_per_s"] <= 11.5
    # Every NodeMetric moves the prod pods' usage, so each one changes batch-cpu and is published.
    assert 8.5 <= result["decisions_per_s"] <= 12
    assert 0 <= result["writes_due_per_s"] <= result["decisions_per_s"]
    assert 0 < result["latency_p50_s"] <= result["latency_p99_s"] < 2.0
    assert 0 < result["startup_replay_s"] < 60
    assert 20 < result["service_rss_peak_mb"] < 2048
    assert 0 < result["service_cpu_cores"] <= 1.05  # pinned to one CPU
    assert result["backlog_end"] >= 0 and result["publish_errors"] == 0
    assert result["target_held"] is (not result["target_misses"])
    assert result["command"].startswith("python bench/noderesource.py --nodes 20 --pods 5 --metric-interval 2")
    service = re.search(r"service pid (\d+)", run.stderr)
    assert service, run.stderr
    assert not Path(f"/proc/{service.group(1)}").exists()
    nats = re.search(r"nats-server at nats://127\.0\.0\.1:(\d+)", run.stderr)
    assert nats, run.stderr
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(nats.group(1))), timeout=1):
        pass
    assert not list(tmp_path.glob("koordbus-bench-*"))


def test_pod_mix_is_mostly_prod_with_batch_and_pending_pods() -> None:
    kinds = [cluster_load.PodShape.of(i).kind for i in range(100)]
    assert (kinds.count("prod"), kinds.count("batch"), kinds.count("pending"), kinds.count("unscheduled")) == (
        70,
        20,
        5,
        5,
    )
    assert {cluster_load.PodShape.of(i).kind for i in range(5)} == {"prod", "batch"}  # toy sizes still drift


def test_seeded_cluster_and_nodemetrics_decode_and_give_a_decision() -> None:
    state = ClusterState()
    messages = list(cluster_load.cluster_messages(2, 20, at=1_767_268_800.0))
    assert len(messages) == 1 + 2 * 21 and len({m for _, _, m in messages}) == len(messages)
    for _, data, _ in messages:
        state.apply(CLUSTER_EVENT_DECODER.decode(data))
    unscheduled = CLUSTER_EVENT_DECODER.decode(messages[2 + 19][1])
    assert isinstance(unscheduled, PodObserved) and unscheduled.node_name == ""
    assert isinstance(CLUSTER_EVENT_DECODER.decode(messages[1][1]), NodeObserved)
    template = cluster_load.NodeMetricTemplate(0, 20)
    subject, data, _ = cluster_load.nodemetric_message(template, 0.5, at=1_767_268_810.0)
    metric = msgspec.json.decode(data, type=NodeMetricComputed)
    assert subject.endswith(".computed") and metric.node == "bench-node-00000"
    assert len(metric.status.pods_metric) == 18  # the running pods: prod and batch
    state.apply(metric)
    decision = state.decide("bench-node-00000", now=1_767_268_810.0, last_written=None, trigger=("nodemetric",))
    assert decision is not None and decision.outcome == "computed" and decision.write_due
    assert decision.resources["kubernetes.io/batch-cpu"] > 0


def test_load_drifts_within_its_range_and_sometimes_jumps() -> None:
    load = cluster_load.DriftingLoad(seed=3)
    levels = [load.level] + [load.step() for _ in range(2_000)]
    steps = [abs(b - a) for a, b in itertools.pairwise(levels)]
    assert all(cluster_load.LOAD_RANGE[0] <= level <= cluster_load.LOAD_RANGE[1] for level in levels)
    jumps = sum(step > 0.1 for step in steps)
    assert 0.02 * len(steps) < jumps < 0.1 * len(steps)


def test_quantile_and_verdict() -> None:
    assert bench.quantile(0.5, []) is None
    assert bench.quantile(0.99, [float(i) for i in range(100)]) == 99.0
    assert bench.quantile(0.5, [3.0, 1.0, 2.0]) == 2.0
    held = {"offered": 100.0, "published": 99.0, "consumed": 98.0, "p99": 0.5, "backlog": (0, 50), "errors": 0}
    assert bench.misses(**held) == []  # type: ignore[arg-type]
    slow = {**held, "consumed": 60.0, "p99": 3.0, "backlog": (10, 5_000)}
    reasons = bench.misses(**slow)  # type: ignore[arg-type]
    assert len(reasons) == 3 and any("p99" in r for r in reasons) and any("backlog" in r for r in reasons)
