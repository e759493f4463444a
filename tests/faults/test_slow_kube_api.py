"""A slow, failing Kubernetes API under a running `koordbus service k8s`: backoff, no write storm, exactly-once landing.

The bridge process writes each node's NodeMetric status (services.k8s.writer) and NodeSLO (services.k8s.nodeslo_mirror,
a LatestWriter) to the fake API server (tests/fakes/kube_api.py). For FAILURE_SECONDS every request under
/apis/slo.koordinator.sh/ waits LATENCY_SECONDS and then fails with HTTP 500, while a feeder offers a new NodeMetric
and NodeSLO for every node each second. Checked:
  * backoff: each object is attempted far less often than intents arrive, and its attempts grow apart (the last
    gap several times the first), so the requests per second to the failing path fall over the window;
  * /readyz answers 503 naming the failing Kubernetes writes, and 200 again after the API recovers;
  * after recovery every object ends as the last intent says, each written by exactly one successful request (the
    intents offered while failing coalesced into it); the process stays up throughout.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bus import subjects
from bus.api import Bus
from bus.jetstream import JetStreamBus
from schemas import quantity
from schemas.qos import NodeSloRendered
from services.common.tasks import cancel_and_wait
from tests.fakes.kube_api import AnsweredRequest, FakeKubeApi
from tests.faults.service_process import ServiceProcess
from tests.support.events import nodemetric_computed, publish_events
from tests.support.waiting import eventually

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

NODES = tuple(f"slow-api-{i}" for i in range(5))
FAILURE_SECONDS = 15.0
LATENCY_SECONDS = 0.3
FAILING_PREFIX = "/apis/slo.koordinator.sh/"
"""NodeMetrics and NodeSLOs; the watches and lists of Nodes, Pods and the ConfigMap stay healthy."""
BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 4.0
MAX_ATTEMPTS_PER_OBJECT = 8
"""In FAILURE_SECONDS with delays doubling from 0.5 s to 4 s (jitter shortens each by at most a fifth) plus the
latency: at most 7 attempts; one intent a second without backoff would be 15 or more."""
READY_TIMEOUT_SECONDS = 30.0
LANDING_TIMEOUT_SECONDS = 20.0
SETTLE_SECONDS = 1.5
"""After everything landed, how long to watch for writes that should not come."""
WRITE_VERBS = ("create", "update", "patch")


def kube_node(name: str) -> dict[str, Any]:
    capacity = {"cpu": "32", "memory": "128Gi"}
    return {"metadata": {"name": name}, "status": {"capacity": capacity, "allocatable": capacity}}


def nodeslo_spec(tick: int) -> dict[str, Any]:
    return {"resourceUsedThresholdWithBE": {"enable": True, "cpuSuppressThresholdPercent": 40 + tick}}


class Feeder:
    """Offers, per node and tick, a NodeMetric report (its CPU usage is 1000 + tick milli-cores) and a NodeSLO."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.tick = 0

    async def offer(self) -> None:
        now = time.time()
        for node in NODES:
            await publish_events(self._bus, nodemetric_computed(node, now, cpu_milli=1000 + self.tick))
            slo = NodeSloRendered(node=node, spec=nodeslo_spec(self.tick), rendered_at=now)
            await self._bus.publish(subjects.slo_key(node), msgspec.json.encode(slo), msg_id=f"slo:{node}:{now}")

    async def run(self) -> None:
        while True:
            self.tick += 1
            await self.offer()
            await asyncio.sleep(1.0)


def landed(kube_api: FakeKubeApi, tick: int) -> bool:
    """Every node's NodeMetric and NodeSLO hold what tick `tick` offered."""
    for node in NODES:
        metric = kube_api.get("NodeMetric", node) or {}
        usage = metric.get("status", {}).get("nodeMetric", {}).get("nodeUsage", {}).get("resources", {})
        if "cpu" not in usage or quantity.parse_quantity(usage["cpu"]).value * 1000 != 1000 + tick:
            return False
        slo = kube_api.get("NodeSLO", node) or {}
        if slo.get("spec") != nodeslo_spec(tick):
            return False
    return True


def object_of(path: str) -> tuple[str, str]:
    """(plural, name) of a NodeMetric or NodeSLO request path (with or without /status)."""
    parts = path.removeprefix(FAILING_PREFIX).split("/")  # v1alpha1/<plural>/<name>[/status]
    return parts[1], parts[2] if len(parts) > 2 else ""


async def test_a_slow_failing_api_server_gets_backed_off_writes_and_then_each_lands_once(
    kube_api: FakeKubeApi, koordbus_nats_url: str, tmp_path: Path
) -> None:
    for node in NODES:
        kube_api.put("nodes", kube_node(node))
    env = {
        "KOORDBUS_BACKOFF_INITIAL_SECONDS": str(BACKOFF_INITIAL_SECONDS),
        "KOORDBUS_BACKOFF_MAX_SECONDS": str(BACKOFF_MAX_SECONDS),
        "KOORDBUS_NODEMETRIC_STATUS_INTERVAL_SECONDS": "0",
    }
    kubeconfig = str(kube_api.kubeconfig(tmp_path / "kubeconfig"))
    bridge = ServiceProcess(
        "k8s", "--nats-url", koordbus_nats_url, "--kubeconfig", kubeconfig, log_dir=tmp_path, env=env
    )
    bus = await JetStreamBus.connect(koordbus_nats_url, name="slow-api-feeder")
    feeder = Feeder(bus)
    feeding: asyncio.Task[None] | None = None
    async with httpx.AsyncClient() as client:
        try:
            bridge.start()

            async def ready() -> bool:
                assert bridge.running, bridge.describe()
                return (await bridge.readyz(client))[0] == 200

            await eventually(ready, timeout=READY_TIMEOUT_SECONDS)
            await feeder.offer()  # tick 0: every object is created while the API is healthy
            await eventually(lambda: landed(kube_api, 0), timeout=LANDING_TIMEOUT_SECONDS)

            kube_api.degrade(FAILING_PREFIX, latency_seconds=LATENCY_SECONDS, failure_ratio=1.0, status=500)
            failing_from = time.monotonic()
            feeding = asyncio.create_task(feeder.run(), name="slow-api-feeder")
            not_ready: dict[str, object] = {}
            while time.monotonic() - failing_from < FAILURE_SECONDS:
                assert bridge.running, f"died while the API failed: {bridge.describe()}"
                status, body = await bridge.readyz(client)
                if status == 503:
                    not_ready = body
                await asyncio.sleep(0.5)
            await cancel_and_wait(feeding)
            feeding = None
            last_tick = feeder.tick
            kube_api.recover()
            recovered_at = time.monotonic()
            failures = not_ready.get("failures")
            assert isinstance(failures, dict) and "kubernetes" in failures, f"/readyz never said 503: {not_ready}"
            assert_backed_off([a for a in kube_api.answered if failing_from <= a.at < recovered_at], last_tick)

            await eventually(lambda: landed(kube_api, last_tick), timeout=LANDING_TIMEOUT_SECONDS)
            await eventually(ready, timeout=READY_TIMEOUT_SECONDS)
            await asyncio.sleep(SETTLE_SECONDS)
            assert landed(kube_api, last_tick)
            assert_each_landed_once([a for a in kube_api.answered if a.at >= recovered_at])
            assert bridge.running, bridge.describe()
            assert await bridge.stop() == 0, f"unclean exit: {bridge.describe()}"
        finally:
            if feeding is not None:
                await cancel_and_wait(feeding)
            await bridge.stop()
            await bus.close()


def assert_backed_off(answered: list[AnsweredRequest], intents: int) -> None:
    """Per object: few attempts while failing, further and further apart."""
    attempts: dict[tuple[str, str], list[float]] = defaultdict(list)
    for request in answered:
        if request.path.startswith(FAILING_PREFIX) and request.verb != "watch":
            assert request.status == 500, request
            attempts[object_of(request.path)].append(request.at)
    expected = {(plural, node) for plural in ("nodemetrics", "nodeslos") for node in NODES}
    assert set(attempts) == expected, f"objects attempted while failing: {sorted(attempts)}"
    for obj, times in sorted(attempts.items()):
        assert len(times) <= MAX_ATTEMPTS_PER_OBJECT < intents, f"{obj}: {len(times)} attempts for {intents} intents"
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert len(gaps) >= 3, f"{obj}: attempts at {times}"
        # doubling delays: the last gaps are several times the first (the NodeSLO mirror writes its keys one after
        # another, so with LATENCY_SECONDS per request its first gaps are a round of all nodes, not the backoff)
        assert max(gaps[-2:]) >= 2 * gaps[0], f"{obj}: attempts do not grow apart: gaps {[round(g, 2) for g in gaps]}"


def assert_each_landed_once(answered: list[AnsweredRequest]) -> None:
    """After recovery each object took exactly one successful write: the intents offered meanwhile coalesced."""
    writes: dict[tuple[str, str], int] = defaultdict(int)
    for request in answered:
        if request.path.startswith(FAILING_PREFIX) and request.verb in WRITE_VERBS and request.status < 300:
            writes[object_of(request.path)] += 1
    expected = {(plural, node): 1 for plural in ("nodemetrics", "nodeslos") for node in NODES}
    assert dict(writes) == expected
