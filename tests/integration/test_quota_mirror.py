"""The quota mirror against the fake Kubernetes API server (which validates against Koordinator's ElasticQuota CRD):
quota commands through the real quota service on a real nats-server end as ElasticQuota objects with koord-scheduler's
write-back annotations; changes update them, deletes remove them, a failing API server is retried."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bus.jetstream import JetStreamBus
from schemas import quota_events as ev
from services.common.metrics import new_registry
from services.k8s.quota_mirror import KubeQuotaSink, QuotaMirror
from services.k8s.settings import K8sSettings
from services.quota.service import QuotaService
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_quota_service import SETTINGS, build_team, command, node, observe, pod
from tests.support.waiting import eventually
from tests.unit.test_quota_validation import eq

K8S = replace(K8sSettings(), quota_write_interval_seconds=0.05, backoff_initial_seconds=0.05)


@pytest_asyncio.fixture
async def mirrored(koordbus_bus: JetStreamBus, kube_client: ApiClient) -> AsyncIterator[QuotaMirror]:
    service = QuotaService(koordbus_bus, SETTINGS, registry=new_registry())
    await service.start()
    mirror = QuotaMirror(koordbus_bus, KubeQuotaSink(kube_client), settings=K8S, registry=new_registry())
    await mirror.start()
    try:
        yield mirror
    finally:
        await mirror.stop()
        await service.stop()


def cid() -> str:
    return uuid.uuid4().hex


async def test_quotas_become_elastic_quota_objects(
    koordbus_bus: JetStreamBus, mirrored: QuotaMirror, kube_api: FakeKubeApi
) -> None:
    await observe(koordbus_bus, node("n1", "40"), pod("p1", "8", quota_name="a", node_name="n1"))
    await build_team(koordbus_bus)

    def a_written() -> bool:
        obj = kube_api.get("ElasticQuota", "a", "ns")
        return obj is not None and "quota.scheduling.koordinator.sh/runtime" in obj["metadata"].get("annotations", {})

    await eventually(a_written, timeout=15)
    a = kube_api.get("ElasticQuota", "a", "ns")
    assert a is not None
    assert a["spec"]["min"]["cpu"] == "15" and a["spec"]["max"]["cpu"] == "40"
    assert a["metadata"]["labels"]["quota.scheduling.koordinator.sh/parent"] == "org"

    def used_8() -> bool:
        obj = kube_api.get("ElasticQuota", "a", "ns") or {}
        return (obj.get("status") or {}).get("used", {}).get("cpu") == "8"

    await eventually(used_8, timeout=15)
    await eventually(lambda: {o["metadata"]["name"] for o in kube_api.objects("ElasticQuota")} >= {"org", "a", "b"})

    await command(koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch={"spec": {"min": {"cpu": "12"}}}))

    def b_min_12() -> bool:
        obj = kube_api.get("ElasticQuota", "b", "ns") or {}
        return obj.get("spec", {}).get("min", {}).get("cpu") == "12"

    await eventually(b_min_12, timeout=15)
    await command(koordbus_bus, ev.DeleteQuota(command_id=cid(), name="b"))
    await eventually(lambda: kube_api.get("ElasticQuota", "b", "ns") is None, timeout=15)
    assert mirrored.healthy()


async def test_a_failing_api_server_is_retried(
    koordbus_bus: JetStreamBus, mirrored: QuotaMirror, kube_api: FakeKubeApi
) -> None:
    kube_api.fail_next("create", "ElasticQuota", status=500, times=3)
    reply = await command(koordbus_bus, ev.CreateQuota(command_id=cid(), quota=eq("solo", max={"cpu": "4"})))
    assert reply.outcome == "applied"
    await eventually(lambda: kube_api.get("ElasticQuota", "solo", "ns") is not None, timeout=15)
    assert mirrored.healthy()
