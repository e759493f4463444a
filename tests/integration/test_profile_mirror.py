"""The profile mirror (KOORDBUS_K8S_MIRROR_PROFILES) against the fake Kubernetes API server, which validates against
Koordinator's ClusterColocationProfile CRD: profiles written through the profile log on a real nats-server become
labelled copies in the cluster, follow their changes and go when they are deleted; a cluster object of the same name
is overwritten (the log's profile wins), one re-created by someone else after the copy is left alone; record-only
mode keeps what it would write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bus import subjects
from bus.jetstream import JetStreamBus
from schemas.cluster import ColocationProfile, ColocationProfileObserved, ProfileMeta
from services.common.metrics import new_registry
from services.k8s.observer import ClusterObserver
from services.k8s.profile_mirror import KubeProfileSink, ProfileMirror, RecordingProfileSink
from services.k8s.settings import K8sSettings
from services.webhook.client import ProfileClient
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_k8s_observer import SETTINGS as OBSERVER
from tests.integration.test_k8s_observer import last_event_of
from tests.integration.test_webhook_profiles_api import Webhook
from tests.integration.test_webhook_service import started
from tests.support.tls import CertificateAuthority
from tests.support.waiting import eventually
from tests.support.webhook import WebhookProcess, client_context, namespace

K8S = replace(K8sSettings(), mirror_profiles=True, quota_write_interval_seconds=0.05, backoff_initial_seconds=0.05)
KIND = "ClusterColocationProfile"
MANAGED = {"app.kubernetes.io/managed-by": "koordbus"}


@pytest_asyncio.fixture
async def mirrored(koordbus_bus: JetStreamBus, kube_client: ApiClient) -> AsyncIterator[ProfileMirror]:
    mirror = ProfileMirror(koordbus_bus, KubeProfileSink(kube_client), settings=K8S, registry=new_registry())
    await mirror.start()
    try:
        yield mirror
    finally:
        await mirror.stop()


def ccp(name: str, labels: dict[str, str] | None = None, **spec: object) -> ColocationProfile:
    return ColocationProfile(metadata=ProfileMeta(name=name, labels=labels or {}), spec=dict(spec))


async def test_the_logs_profiles_become_labelled_copies_in_the_cluster(
    koordbus_bus: JetStreamBus, mirrored: ProfileMirror, kube_api: FakeKubeApi
) -> None:
    client = ProfileClient(koordbus_bus)
    kube_api.put(KIND, {"metadata": {"name": "taken"}, "spec": {"qosClass": "LS"}})  # the cluster's own
    selector = {"matchExpressions": [{"key": "job-name", "operator": "Exists"}]}
    first = await client.put(
        ccp("batch", {"team": "data"}, selector=selector, qosClass="BE", probability="50%"),
        expected_seq=0,
        actor="admin",
        command_id="1",
    )
    await client.put(ccp("taken", qosClass="BE"), expected_seq=0, actor="admin", command_id="2")

    def copied(name: str, qos: str) -> bool:
        obj = kube_api.get(KIND, name)
        return obj is not None and obj["spec"].get("qosClass") == qos

    await eventually(lambda: copied("batch", "BE") and copied("taken", "BE"), timeout=15)
    batch = kube_api.get(KIND, "batch")
    assert batch is not None
    assert batch["metadata"]["labels"] == {"team": "data", **MANAGED}
    assert batch["spec"] == {"selector": selector, "qosClass": "BE", "probability": "50%"}
    assert kube_api.get(KIND, "taken")["metadata"]["labels"] == MANAGED  # type: ignore[index]  # the log's wins

    await client.put(ccp("batch", {"team": "data"}, qosClass="LS"), expected_seq=first.seq, actor="a", command_id="3")
    await eventually(lambda: copied("batch", "LS"), timeout=15)

    # someone replaces the copy of "taken" with their own object: deleting the log's leaves theirs alone
    kube_api.put(KIND, {"metadata": {"name": "taken"}, "spec": {"qosClass": "LSR"}})
    seq, _ = await client.current("taken")
    await client.delete("taken", expected_seq=seq, actor="admin", command_id="4")
    seq, _ = await client.current("batch")
    await client.delete("batch", expected_seq=seq, actor="admin", command_id="5")
    await eventually(lambda: kube_api.get(KIND, "batch") is None, timeout=15)
    assert mirrored.healthy() and await mirrored.wait_idle(10)
    assert copied("taken", "LSR")


async def test_record_only_mode_keeps_what_it_would_write(koordbus_bus: JetStreamBus) -> None:
    sink = RecordingProfileSink(keep=10, clock=lambda: 5.0)
    mirror = ProfileMirror(koordbus_bus, sink, settings=K8S, registry=new_registry())
    await mirror.start()
    try:
        client = ProfileClient(koordbus_bus)
        ack = await client.put(ccp("p", qosClass="BE"), expected_seq=0, actor="a", command_id="1")
        await client.delete("p", expected_seq=ack.seq, actor="a", command_id="2")
        await client.put(ccp("q", qosClass="LS"), expected_seq=0, actor="a", command_id="3")

        def recorded() -> bool:
            return [o["metadata"]["name"] for o in sink.export()["clustercolocationprofiles"]] == ["q"]

        await eventually(recorded, timeout=15)
        assert sink.export()["clustercolocationprofiles"][0]["metadata"]["labels"] == MANAGED
    finally:
        await mirror.stop()


async def test_with_the_bridge_watching_the_webhook_applies_the_logs_profile_never_the_copy(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_client: ApiClient, kube_api: FakeKubeApi, tmp_path: Path
) -> None:
    """The whole loop: the log's profile → the mirror's copy in the cluster → the bridge publishes the copy → the
    webhook applies the log's profile; deleted through the log while the mirror is away, no Pod gets it although
    its copy is still in the cluster; the mirror back removes the copy."""
    kube_api.put("namespaces", namespace("spark", {"koordinator.sh/enable-colocation": "true"}))
    observer = ClusterObserver(koordbus_bus, kube_client, OBSERVER, registry=new_registry())
    await observer.start()
    mirror = ProfileMirror(koordbus_bus, KubeProfileSink(kube_client), settings=K8S, registry=new_registry())
    await mirror.start()
    ca = CertificateAuthority.create(tmp_path, "cluster")
    process = WebhookProcess(koordbus_nats_url, ca.issue("webhook", server=True), log_dir=tmp_path)
    try:
        await started(process)
        async with httpx.AsyncClient(verify=client_context(ca.cert), timeout=10) as https:
            webhook = Webhook(https, process.https_url)
            client = ProfileClient(koordbus_bus)
            labels = {"example.com/source": "api"}
            profile = ccp("p", labels=labels)  # the spec's labels: what the webhook sets on the Pod
            profile = ColocationProfile(metadata=profile.metadata, spec={"labels": labels})
            ack = await client.put(profile, expected_seq=0, actor="a", command_id="1")

            async def copy_published() -> bool:
                seen = await last_event_of(koordbus_bus, subjects.cluster_profile("p"))
                return isinstance(seen, ColocationProfileObserved) and seen.profile is not None

            await eventually(copy_published, timeout=15)
            await webhook.until_label("example.com/source", "api")
            pod = await webhook.mutated()
            assert pod is not None and pod["metadata"]["labels"]["example.com/source"] == "api"

            # the mirror away: the log's profile deleted, its copy stays in the cluster, and applies to no Pod
            await mirror.stop()
            await client.delete("p", expected_seq=ack.seq, actor="a", command_id="2")

            async def unchanged() -> bool:
                return await webhook.mutated() is None

            await eventually(unchanged, timeout=15)
            assert kube_api.get(KIND, "p") is not None
            # the mirror back: it removes the copy
            mirror = ProfileMirror(koordbus_bus, KubeProfileSink(kube_client), settings=K8S, registry=new_registry())
            await mirror.start()
            await eventually(lambda: kube_api.get(KIND, "p") is None, timeout=15)
            assert await webhook.mutated() is None
    finally:
        await process.stop()
        await mirror.stop()
        await observer.stop()
