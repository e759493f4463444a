"""`koordbus service loadaware` as a process on a real nats-server: NodeMetrics for three nodes rank them through
the extender's HTTP verbs, and a burst of 20 pods placed one after the other — each placement published as the
bridge would (PodObserved with a nodeName) — spreads over the nodes instead of piling onto the coldest one. Then
the same burst bound through the extender's bind verb, with `koordbus service k8s` creating the Bindings in the fake
API server: counted as each is bound, it spreads without waiting for the watch."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bus.jetstream import JetStreamBus
from schemas import kube
from schemas.cluster import NodeObserved, PodObserved
from tests.fakes.kube_api import FakeKubeApi
from tests.faults.service_process import ServiceProcess
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, node_json, pod_json, report
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e

NODES = ("n-a", "n-b", "n-c")


async def _ready(service: ServiceProcess, client: httpx.AsyncClient) -> bool:
    assert service.running, service.describe()
    return (await service.readyz(client))[0] == 200


async def test_ranking_and_a_burst_that_spreads(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, tmp_path: Path
) -> None:
    now = time.time()
    await publish_events(
        koordbus_bus,
        *(NodeObserved(name=n, observed_at=now, node=node(n)) for n in NODES),
        report("n-a", at=now - 5, cpu=4000, memory=16 * GI),
        report("n-b", at=now - 5, cpu=12000, memory=64 * GI),
        report("n-c", at=now - 5, cpu=20000, memory=64 * GI),
    )
    args_file = tmp_path / "loadaware.yaml"
    args_file.write_text("usageThresholds: {cpu: 65, memory: 95}\nresourceWeights: {cpu: 1, memory: 1}\n")
    service = ServiceProcess(
        "loadaware", "--nats-url", koordbus_nats_url, "--args-file", str(args_file), log_dir=tmp_path
    )
    service.start()
    try:
        async with httpx.AsyncClient(base_url=service.base_url, timeout=10) as client:
            await eventually(lambda: _ready(service, client), timeout=30)
            big = pod_json("big", cpu="4", memory="8Gi", limit_cpu="4", limit_memory="8Gi")
            body = {"Pod": big, "NodeNames": list(NODES)}
            filtered = (await client.post("/filter", json=body)).json()
            assert filtered["NodeNames"] == ["n-a", "n-b"], service.describe()
            assert filtered["FailedNodes"] == {"n-c": "node(s) cpu usage exceed threshold"}
            scores = {e["Host"]: e["Score"] for e in (await client.post("/prioritize", json=body)).json()}
            assert scores["n-a"] > scores["n-b"] > scores["n-c"], scores
            pod_file = tmp_path / "big.yaml"
            pod_file.write_text(json.dumps(big))
            explain = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "koordbus.cli", "scheduler", "explain", str(pod_file), "n-c",
                "--url", service.base_url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await explain.communicate()
            assert explain.returncode == 0, err.decode()
            text = out.decode()
            assert "filter: FAIL (node(s) cpu usage exceed threshold)" in text
            assert "cpu 73% = (usage 20000 + assigned 0 + pod 3400) / 32000 > 65" in text
            assert "score: 35/100, 4/10 on the extender scale" in text

            # a new report round: three nodes close in load; a burst of 20 pods inside one report interval
            now = time.time()
            await publish_events(
                koordbus_bus,
                report("n-a", at=now, cpu=4000, memory=16 * GI),  # 85 of 100 → 9: alone at the top
                report("n-b", at=now, cpu=10000, memory=32 * GI),  # 70 → 7
                report("n-c", at=now, cpu=12000, memory=32 * GI),  # 66 → 7
            )
            await eventually(lambda: _sees_report(client, now), timeout=10)
            placed = {n: 0 for n in NODES}
            ties = random.Random(9)
            for i in range(20):
                small = pod_json(f"burst-{i}", cpu="1", memory="1Gi")
                args = {"Pod": small, "NodeNames": list(NODES)}
                passed = (await client.post("/filter", json=args)).json()["NodeNames"]
                ranked = (await client.post("/prioritize", json={"Pod": small, "NodeNames": passed})).json()
                top = max(e["Score"] for e in ranked)
                best = ties.choice([e["Host"] for e in ranked if e["Score"] == top])  # kube-scheduler's tie-break
                placed[best] += 1
                bound = msgspec.convert({**small, "spec": {**small["spec"], "nodeName": best}}, kube.Pod)
                seen = PodObserved(
                    namespace="default",
                    name=f"burst-{i}",
                    uid=bound.metadata.uid,
                    observed_at=time.time(),
                    node_name=best,
                    pod=bound,
                )
                await publish_events(koordbus_bus, seen)
                await eventually(lambda b=best, n=placed[best]: _assigned(client, b, n), timeout=10)  # type: ignore[misc]
            # without the assigned pods' estimates all 20 would go to n-a, the only node scoring 9; with them n-a takes
            # pods until it is no better than the others, then they share: the burst levels the nodes
            assert placed["n-a"] == max(placed.values()) < 20 and min(placed.values()) >= 1, placed
            final = {n: (await _explain(client, n))["score"]["extender_score"] for n in NODES}
            assert max(final.values()) - min(final.values()) <= 1, (final, placed)
    finally:
        await service.stop()


async def test_a_burst_bound_through_the_extender_spreads_without_waiting_for_the_watch(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, tmp_path: Path
) -> None:
    for name in NODES:
        kube_api.put("Node", node_json(name))
    for i in range(20):
        kube_api.put("Pod", pod_json(f"burst-{i}", cpu="1", memory="1Gi"))
    now = time.time()
    await publish_events(
        koordbus_bus,
        report("n-a", at=now, cpu=4000, memory=16 * GI),
        report("n-b", at=now, cpu=10000, memory=32 * GI),
        report("n-c", at=now, cpu=12000, memory=32 * GI),
    )
    args_file = tmp_path / "loadaware.yaml"
    args_file.write_text("usageThresholds: {cpu: 65, memory: 95}\nresourceWeights: {cpu: 1, memory: 1}\n")
    kubeconfig = kube_api.kubeconfig(tmp_path / "kubeconfig")
    bridge = ServiceProcess("k8s", "--nats-url", koordbus_nats_url, "--kubeconfig", str(kubeconfig), log_dir=tmp_path)
    service = ServiceProcess(
        "loadaware", "--nats-url", koordbus_nats_url, "--args-file", str(args_file), log_dir=tmp_path
    )
    bridge.start()
    service.start()
    try:
        async with httpx.AsyncClient(base_url=service.base_url, timeout=10) as client:
            await eventually(lambda: _ready(bridge, client), timeout=30)
            await eventually(lambda: _ready(service, client), timeout=30)
            probe = {"Pod": pod_json("probe", cpu="1", memory="1Gi"), "NodeNames": list(NODES)}

            async def ranked_from_the_bridges_nodes() -> bool:  # allocatable (the bridge) and the reports are in
                ranked = (await client.post("/prioritize", json=probe)).json()
                return {e["Host"]: e["Score"] for e in ranked} == {"n-a": 9, "n-b": 7, "n-c": 7}

            await eventually(ranked_from_the_bridges_nodes, timeout=30)
            placed = {n: 0 for n in NODES}
            chosen: dict[str, str] = {}
            ties = random.Random(9)
            for i in range(20):  # one after the other, as kube-scheduler's binding cycles finish, no waiting
                pod = pod_json(f"burst-{i}", cpu="1", memory="1Gi")
                args = {"Pod": pod, "NodeNames": list(NODES)}
                passed = (await client.post("/filter", json=args)).json()["NodeNames"]
                ranked = (await client.post("/prioritize", json={"Pod": pod, "NodeNames": passed})).json()
                top = max(e["Score"] for e in ranked)
                best = ties.choice([e["Host"] for e in ranked if e["Score"] == top])
                binding = {"PodName": f"burst-{i}", "PodNamespace": "default", "PodUID": f"uid-default-burst-{i}"}
                answer = (await client.post("/bind", json={**binding, "Node": best})).json()
                assert answer == {"Error": ""}, (answer, bridge.describe())
                placed[best] += 1
                chosen[f"burst-{i}"] = best
                assert await _assigned(client, best, placed[best])  # counted already, whatever the watch is doing
            assert placed["n-a"] == max(placed.values()) < 20 and min(placed.values()) >= 1, placed
            assert {name: kube_api.get("Pod", name, "default")["spec"]["nodeName"] for name in chosen} == chosen
            # the watch then confirms each placement instead of adding it a second time
            await eventually(lambda: _assigned_everywhere(client, placed), timeout=15)
            final = {n: (await _explain(client, n))["score"]["extender_score"] for n in NODES}
            assert max(final.values()) - min(final.values()) <= 1, (final, placed)
            ghost = {"PodName": "ghost", "PodNamespace": "default", "PodUID": "uid-ghost", "Node": "n-b"}
            assert "HTTP 404" in (await client.post("/bind", json=ghost)).json()["Error"]
            metrics = (await client.get("/metrics")).text
            assert 'koordbus_loadaware_binds_total{outcome="bound"} 20.0' in metrics
            assert 'koordbus_loadaware_binds_total{outcome="rejected"} 1.0' in metrics
    finally:
        assert await service.stop() == 0, service.describe()
        assert await bridge.stop() == 0, bridge.describe()


async def _assigned_everywhere(client: httpx.AsyncClient, placed: dict[str, int]) -> bool:
    return all([await _assigned(client, name, count) for name, count in placed.items()])


async def _sees_report(client: httpx.AsyncClient, at: float) -> bool:
    explained = (await client.post("/explain", json={"pod": pod_json("probe"), "node": "n-c"})).json()
    return bool(explained["nodemetric_update_time"] == at)


async def _explain(client: httpx.AsyncClient, node_name: str) -> dict[str, Any]:
    pod = pod_json("probe", cpu="1", memory="1Gi")
    return dict((await client.post("/explain", json={"pod": pod, "node": node_name})).json())


async def _assigned(client: httpx.AsyncClient, node_name: str, count: int) -> bool:
    return bool((await _explain(client, node_name))["assigned_pods"] == count)
