"""`koordbus service migration` and `koordbus service k8s` as processes on a real nats-server, the bridge watching and
writing the fake API server: a PodMigrationJob in the cluster is arbitrated and executed by the migration service,
which asks the bridge for every cluster verb (it holds no credentials) — the pod is evicted through the Eviction API
and the job's status written back as Succeeded. The migration service starts first and waits for the bridge; each
process counts its side of the eviction (the executor its answer, the bridge its Kubernetes write)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.kube_api import FakeKubeApi
from tests.faults.service_process import ServiceProcess
from tests.integration.test_migration_bridge import pmj, pod, replica_set
from tests.support.waiting import eventually

pytestmark = pytest.mark.e2e


def _status(kube_api: FakeKubeApi, name: str) -> dict[str, Any]:
    return dict((kube_api.get("PodMigrationJob", name) or {}).get("status") or {})


async def _ready(service: ServiceProcess, client: httpx.AsyncClient) -> bool:
    assert service.running, service.describe()
    return (await service.readyz(client))[0] == 200


async def test_a_cluster_job_is_executed_through_the_bridge(
    koordbus_nats_url: str, kube_api: FakeKubeApi, tmp_path: Path
) -> None:
    kube_api.put("ReplicaSet", replica_set(10))
    for index in range(10):
        kube_api.put("Pod", pod(index))
    job = pmj(0)
    job["spec"]["mode"] = "EvictDirectly"
    kube_api.put("PodMigrationJob", job)
    kubeconfig = kube_api.kubeconfig(tmp_path / "kubeconfig")
    migration = ServiceProcess("migration", "--nats-url", koordbus_nats_url, log_dir=tmp_path)
    bridge = ServiceProcess("k8s", "--nats-url", koordbus_nats_url, "--kubeconfig", str(kubeconfig), log_dir=tmp_path)
    migration.start()
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            await eventually(lambda: _ready(migration, client), timeout=30)
            await asyncio.sleep(2)  # no bridge yet: nothing watched, nothing done
            assert _status(kube_api, "job-0") == {} and kube_api.get("Pod", "web-0", "default") is not None
            bridge.start()
            await eventually(lambda: _ready(bridge, client), timeout=30)
            await eventually(lambda: _status(kube_api, "job-0").get("phase") == "Succeeded", timeout=30)
            executed = (await client.get(f"{migration.base_url}/metrics")).text
            written = (await client.get(f"{bridge.base_url}/metrics")).text
    finally:
        await bridge.stop()
        await migration.stop()
    assert 'koordbus_migration_evictions_total{answer="201"} 1.0' in executed
    assert 'koordbus_k8s_writes_total{object="eviction",outcome="evicted"} 1.0' in written
    status = _status(kube_api, "job-0")
    assert status["status"] == "Complete" and status["conditions"][-1]["reason"] == "EvictComplete", status
    assert kube_api.get("Pod", "web-0", "default") is None
    assert [r.verb for r in kube_api.requests].count("evict") == 1
