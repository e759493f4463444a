"""`koordbus up --simulate-nodes` runs a cluster that uses every capability (issue 27 point 1), through the real
services: the teams' quota tree with borrowing, their pods placed through the extender (bind-time accounting, the
Bindings recorded), hot nodes that load-aware descheduling moves pods off (jobs arbitrated, carried out on the
simulated cluster: past their first phase), the simulated nodes' cpu-suppress and be-cgroup actuations and a hot
node's planned evictions in dry-run, and batch used within batch allocatable (a node above its own only where a
decision lowered it since the use was reported). Every check waits for its condition, bounded; the last one then
holds for ten looks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bus.cluster import free_port
from tests.e2e.test_up import get_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
NODES = 20
DEADLINE_SECONDS = 180


def _cores(quantity: str | None) -> float:
    if not quantity:
        return 0.0
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _until(what: str, check: Callable[[], Any], deadline: float) -> Any:
    """`check()`'s first truthy answer before `deadline` (monotonic seconds); the last answer in the failure."""
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as e:  # the API not answering yet
            last = e
        else:
            if last:
                return last
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within the deadline; last: {str(last)[:2000]}")


def test_the_simulated_cluster_shows_every_capability(tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(tmp_path / "data"), "--port", str(port),
        "--no-agent", "--simulate-nodes", str(NODES), "--extender-port", "0",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + DEADLINE_SECONDS
    try:
        token = _until("the API token", lambda: (tmp_path / "data" / "api-token").read_text().strip(), deadline)

        def get(path: str) -> Any:
            assert process.poll() is None, (
                f"koordbus up exited early ({process.returncode}):\n{process.stdout.read()[-3000:]}"
            )
            return get_json(base + path, token)

        def borrowing() -> list[str]:
            tree = get("/api/v1/quota-trees/default")
            return [
                q["name"]
                for q in tree["quotas"]
                if q["name"].startswith("team-")
                and _cores(q["runtime"].get("cpu")) > _cores(q["min"].get("cpu"))
                and _cores(q["used"].get("cpu")) > 0
            ]

        assert "team-search" in _until("a team borrowing beyond its min", borrowing, deadline)
        tree = get("/api/v1/quota-trees/default")
        quotas = {q["name"]: q for q in tree["quotas"]}
        assert _cores(quotas["team-billing"]["nonPreemptibleUsed"].get("cpu")) > 0  # its pods are non-preemptible
        web = quotas["team-web"]
        assert _cores(web["request"].get("cpu")) >= _cores(web["min"].get("cpu"))  # it never lends its min

        def bound() -> list[Any]:
            return list(get("/api/v1/k8s/recorded-writes")["bindings"])

        bindings = _until("Bindings made through the extender's bind", bound, deadline)
        assert {b["binding"]["target"]["name"] for b in bindings} <= {f"sim-node-{i:04d}" for i in range(1, NODES + 1)}

        def migrated() -> list[Any]:
            jobs = get("/api/v1/migrations")["items"]
            return [j for j in jobs if j["source"] == "descheduler" and j["phase"] in ("Running", "Succeeded")]

        moved = _until("a descheduled pod's migration past its first phase", migrated, deadline)
        assert all(j["arbitration"] == "passed" for j in moved), moved

        def evicted() -> list[Any]:
            return [v for v in get("/api/v1/k8s/recorded-writes")["verbs"] if v["verb"] == "k8s.pod.evict"]

        _until("the executor's eviction, recorded", evicted, deadline)
        round_ = get("/api/v1/descheduler/rounds/latest")
        assert round_["plugin"] == "LowNodeLoad" and not round_["problems"], round_

        def actuated(loop: str) -> Callable[[], list[Any]]:
            def found() -> list[Any]:
                for i in range(1, NODES + 1):
                    events = get(f"/api/v1/nodes/sim-node-{i:04d}/actuations")["actuations"]
                    if hits := [e for e in events if e["loop"] == loop and e["dry_run"]]:
                        return hits
                return []

            return found

        (suppress, *_) = _until("a simulated node's cpu-suppress actuation", actuated("cpu-suppress"), deadline)
        assert "BE may use" in suppress["changes"][0]["reason"], suppress
        (limits, *_) = _until("a simulated node's be-cgroup actuation", actuated("be-cgroup"), deadline)
        assert any(c["path"].endswith("/cpu.shares") for c in limits["changes"]), limits
        (planned, *_) = _until("a hot simulated node's eviction planned in dry-run", actuated("cpu-evict"), deadline)
        change = planned["changes"][0]
        assert change["after"] == "eviction would be requested" and "CPUEvict: node CPU" in change["reason"], planned
        watermarks = get("/api/v1/config/watermarks")
        assert watermarks["scheduler"]["reported"] and watermarks["descheduler"]["usageThresholds"] == {"cpu": 70.0}

        def batch_within() -> tuple[int, int] | None:
            # the nodes whose batch decision is known (as the overview compares them)
            rows = [r for r in get("/api/v1/overview/nodes?limit=100")["items"] if r["outcome"] is not None]
            used = sum(r["batchCpuUsed"] or 0 for r in rows)
            allocatable = sum(r["batchCpu"] or 0 for r in rows)
            # A node above its own only where a decision lowered it at or after the report that measured the use
            # (batch pods are placed within it; those past a lowered one are evicted by allocatable).
            unexplained = [
                r
                for r in rows
                if (
                    (r["batchCpuUsed"] or 0) > (r["batchCpu"] or 0)
                    or (r["batchMemoryUsed"] or 0) > (r["batchMemory"] or 0)
                )
                and (r["reportTime"] is None or r["resourcesAt"] < r["reportTime"])
            ]
            assert not unexplained, unexplained
            return (used, allocatable) if allocatable and used <= allocatable else None

        _until("batch used within batch allocatable", batch_within, deadline)
        for _ in range(10):  # and it holds
            assert batch_within() is not None
            time.sleep(1.0)
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[max(0, output.find("Traceback") - 500) :][:5000]
    assert "  simulation  a cluster around the nodes (docs/up.md#the-simulated-cluster):\n" in output
    assert "quota tree engineering of teams team-search, team-ml, team-web, team-billing" in output
