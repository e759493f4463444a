"""Issue 24 points 2 and 5: an ElasticQuota changed with kubectl goes through the quota service, over real HTTPS.

The whole loop runs: the fake Kubernetes API server (tests/fakes) calls the real `koordbus service webhook` process
for every ElasticQuota write, as kube-apiserver calls a validating webhook (tests/support/webhook.ApiServerWebhook:
the AdmissionReview with the user its bearer token names, failurePolicy Fail); the webhook asks the real quota
service on a real nats-server; the bridge's quota mirror writes the log's state back to the same API server, with its
own ServiceAccount's token. A kubectl-shaped create, edit and delete by alice each become a command by
`kubernetes/alice` in the tree's log, and the mirror writes nothing back that undoes them (its writes pass the
webhook without a command); an invalid quota is refused with every violation; with the quota service stopped a
change is refused with the reason (and the cluster keeps what the log holds) while the mirror's writes still pass.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas import quota
from schemas import quota_events as ev
from services.common.metrics import new_registry
from services.k8s.quota_mirror import KubeQuotaSink, QuotaMirror
from services.k8s.settings import K8sSettings
from services.quota.service import QuotaService
from services.webhook.service import VALIDATE_ELASTICQUOTAS
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_quota_service import SETTINGS, node, observe, status
from tests.support.tls import CertificateAuthority
from tests.support.waiting import eventually
from tests.support.webhook import MIRROR_USER, ApiServerWebhook, WebhookProcess, elastic_quota

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas"
NAMESPACE = "teams"
MERGE = "application/merge-patch+json"
K8S = replace(
    K8sSettings(), quota_write_interval_seconds=0.05, quota_write_delay_seconds=0.3, backoff_initial_seconds=0.05
)
TOKENS = {
    "alice-token": ("alice", ["system:authenticated"]),
    "mirror-token": (
        MIRROR_USER,
        ["system:serviceaccounts", "system:serviceaccounts:koordbus", "system:authenticated"],
    ),
}


@dataclass
class Cluster:
    kube_api: FakeKubeApi
    bus: JetStreamBus
    alice: CustomObjectsApi
    """kubectl, as alice."""
    as_mirror: CustomObjectsApi
    """The bridge's ServiceAccount (what the mirror writes with)."""
    apiserver: ApiServerWebhook
    webhook: WebhookProcess
    mirror: QuotaMirror
    service: QuotaService


def client(kube_api: FakeKubeApi, token: str) -> ApiClient:
    configuration = Configuration(
        host=kube_api.url, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"}
    )
    return ApiClient(configuration)


@contextlib.asynccontextmanager
async def cluster(nats_url: str, bus: JetStreamBus, kube_api: FakeKubeApi, tmp_path: Path) -> AsyncIterator[Cluster]:
    ca = CertificateAuthority.create(tmp_path, "cluster")
    await observe(bus, node("n1", "40"))
    service = QuotaService(bus, SETTINGS, registry=new_registry())
    await service.start()
    webhook = WebhookProcess(
        nats_url,
        ca.issue("webhook", server=True),
        log_dir=tmp_path,
        env={"KOORDBUS_WEBHOOK_QUOTA_MIRROR_USERS": MIRROR_USER, "KOORDBUS_WEBHOOK_QUOTA_TIMEOUT_SECONDS": "5"},
    )
    webhook.start()

    async def ready() -> bool:
        assert webhook.running, webhook.describe()
        async with httpx.AsyncClient() as plain:
            return (await webhook.readyz(plain))[0] == 200

    apiserver = ApiServerWebhook(f"{webhook.https_url}{VALIDATE_ELASTICQUOTAS}", ca.cert)
    kube_api.tokens.update(TOKENS)
    kube_api.admission = apiserver
    async with client(kube_api, "alice-token") as alice, client(kube_api, "mirror-token") as as_mirror:
        mirror = QuotaMirror(bus, KubeQuotaSink(as_mirror), settings=K8S, registry=new_registry())
        try:
            await eventually(ready, timeout=60)
            await mirror.start()
            yield Cluster(
                kube_api,
                bus,
                CustomObjectsApi(alice),
                CustomObjectsApi(as_mirror),
                apiserver,
                webhook,
                mirror,
                service,
            )
            assert "Traceback" not in webhook.log_tail(), webhook.describe()
        finally:
            await mirror.stop()
            await service.stop()
            await apiserver.close()
            assert await webhook.stop() == 0, webhook.describe()


async def logged(bus: JetStreamBus) -> list[ev.QuotaEvent]:
    """Every event of the quota log, in order."""
    found = await bus.read_recent(streams.KOORD_QUOTA, subjects.QUOTA_EVENTS_ALL, since=0, limit=10_000)
    return [ev.decode_quota_event(d.data) for d in found]


def cluster_quota(kube_api: FakeKubeApi, name: str) -> dict[str, Any] | None:
    return kube_api.get("ElasticQuota", name, NAMESPACE)


async def settled(c: Cluster, name: str, check: Any) -> None:
    """Wait until the quota service published a status of `name` passing `check` and the mirror wrote it."""

    async def published() -> bool:
        held = await status(c.bus, name)
        return held is not None and bool(check(held))

    await eventually(published, timeout=15)
    assert await c.mirror.wait_idle(timeout=15)


def mirror_writes(kube_api: FakeKubeApi, name: str, since: int) -> list[dict[str, Any]]:
    """The objects created or replaced for `name` since the `since`-th recorded body (alice only patches and deletes
    in these tests after her creates: these are the mirror's)."""
    return [
        body.body
        for body in kube_api.bodies[since:]
        if body.verb in ("create", "update")
        and isinstance(body.body, dict)
        and body.body.get("metadata", {}).get("name") == name
    ]


async def test_kubectl_changes_become_commands_by_that_user_and_the_mirror_does_not_undo_them(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, tmp_path: Path
) -> None:
    async with cluster(koordbus_nats_url, koordbus_bus, kube_api, tmp_path) as c:
        # kubectl apply -f quotas.yaml: a parent and a team quota
        org = elastic_quota(
            "org",
            min={"cpu": "20"},
            max={"cpu": "40"},
            labels={quota.LABEL_IS_PARENT: "true"},
            namespace_name=NAMESPACE,
        )
        team = elastic_quota(
            "team-a", min={"cpu": "8"}, max={"cpu": "16"}, labels={quota.LABEL_PARENT: "org"}, namespace_name=NAMESPACE
        )
        for obj in (org, team):
            await c.alice.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, obj)
        events = await logged(c.bus)
        assert [(type(e).__name__, e.actor) for e in events] == [("QuotaCreated", "kubernetes/alice")] * 2
        assert isinstance(events[1], ev.QuotaCreated) and events[1].quota.spec.max == {"cpu": "16"}

        # the mirror writes the log's state (the defaults, the write-back annotations, status.used) without a command
        await settled(c, "team-a", lambda s: s.object is not None)
        written = cluster_quota(kube_api, "team-a")
        assert written is not None and quota.ANNOTATION_RUNTIME in written["metadata"]["annotations"]
        assert written["spec"] == {"min": {"cpu": "8"}, "max": {"cpu": "16"}}
        assert len(await logged(c.bus)) == 2
        mirrored = [r for r, _ in c.apiserver.reviews if r["userInfo"]["username"] == MIRROR_USER]
        assert mirrored and all(a["allowed"] for r, a in c.apiserver.reviews if r in mirrored)

        # kubectl edit / patch: more max, a label; what the user changed is appended, the mirror keeps it
        since = len(kube_api.bodies)
        patch = {"metadata": {"labels": {"team": "a"}}, "spec": {"max": {"cpu": "24"}}}
        await c.alice.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "team-a", patch, _content_type=MERGE
        )
        *_, edit = await logged(c.bus)
        assert isinstance(edit, ev.QuotaUpdated) and edit.actor == "kubernetes/alice"
        assert edit.quota.spec.max == {"cpu": "24"} and edit.quota.metadata.labels["team"] == "a"
        await settled(c, "team-a", lambda s: s.object is not None and s.object.spec.max == {"cpu": "24"})
        after = cluster_quota(kube_api, "team-a")
        assert (
            after is not None and after["spec"]["max"] == {"cpu": "24"} and after["metadata"]["labels"]["team"] == "a"
        )
        for body in mirror_writes(kube_api, "team-a", since):
            assert body["spec"]["max"] == {"cpu": "24"} and body["metadata"]["labels"]["team"] == "a", body
        assert len(await logged(c.bus)) == 3

        # kubectl delete: a command too; the mirror does not bring the quota back
        await c.alice.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "team-a")
        *_, deleted = await logged(c.bus)
        assert isinstance(deleted, ev.QuotaDeleted) and deleted.actor == "kubernetes/alice"
        await settled(c, "team-a", lambda s: s.deleted)
        assert cluster_quota(kube_api, "team-a") is None and len(await logged(c.bus)) == 4

        async with httpx.AsyncClient() as plain:
            metrics = (await plain.get(f"{c.webhook.base_url}/metrics")).text
        assert 'koordbus_webhook_quota_decisions_total{decision="recorded"} 4.0' in metrics
        assert 'koordbus_webhook_quota_decisions_total{decision="mirror"}' in metrics


async def test_an_invalid_quota_is_refused_with_every_violation_and_nothing_is_recorded(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, tmp_path: Path
) -> None:
    async with cluster(koordbus_nats_url, koordbus_bus, kube_api, tmp_path) as c:
        org = elastic_quota(
            "org",
            min={"cpu": "10"},
            max={"cpu": "40"},
            labels={quota.LABEL_IS_PARENT: "true"},
            namespace_name=NAMESPACE,
        )
        await c.alice.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, org)
        bad = elastic_quota(
            "team-b",
            min={"cpu": "12", "memory": "1Gi"},
            max={"cpu": "8"},
            labels={quota.LABEL_PARENT: "org"},
            namespace_name=NAMESPACE,
        )  # min above max, min above the parent's min, a key of min not in max
        with pytest.raises(ApiException) as refused:
            await c.alice.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, bad)
        answer = json.loads(refused.value.body)
        assert (refused.value.status, answer["reason"]) == (422, "Invalid")
        message = answer["message"]
        assert message.startswith('admission webhook "validate-elasticquotas.koordbus.io" denied the request: ')
        (_, response), *_ = [(r, a) for r, a in c.apiserver.reviews if not a["allowed"]]
        causes = response["status"]["details"]["causes"]
        assert len(causes) >= 3 and f"{len(causes)} violations" in message
        assert {"min-le-max", "min-sum"} <= {cause["reason"] for cause in causes}
        for cause in causes:
            assert cause["message"] in message
        assert cluster_quota(kube_api, "team-b") is None
        assert [type(e).__name__ for e in await logged(c.bus)] == ["QuotaCreated"]


async def test_with_the_quota_service_stopped_changes_are_refused_and_the_mirror_still_writes(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, tmp_path: Path
) -> None:
    async with cluster(koordbus_nats_url, koordbus_bus, kube_api, tmp_path) as c:
        team = elastic_quota("team-a", max={"cpu": "16"}, namespace_name=NAMESPACE)
        await c.alice.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, team)
        await settled(c, "team-a", lambda s: s.object is not None)
        await c.service.stop()
        assert await c.mirror.wait_idle(timeout=15)  # a status published just before the stop is written first

        before = cluster_quota(kube_api, "team-a")
        with pytest.raises(ApiException) as refused:
            await c.alice.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, "team-a", {"spec": {"max": {"cpu": "32"}}}, _content_type=MERGE
            )
        answer = json.loads(refused.value.body)
        assert (refused.value.status, answer["reason"]) == (503, "ServiceUnavailable")
        assert "the quota service cannot check this change now" in answer["message"]
        assert "nobody serves this subject" in answer["message"] and "try again" in answer["message"]
        with pytest.raises(ApiException) as not_deleted:
            await c.alice.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "team-a")
        assert not_deleted.value.status == 503
        assert cluster_quota(kube_api, "team-a") == before and len(await logged(c.bus)) == 1

        # the mirror's writes need no answer from the quota service
        assert before is not None
        rewritten = {
            **before,
            "metadata": {
                **before["metadata"],
                "annotations": {**before["metadata"]["annotations"], quota.ANNOTATION_RUNTIME: '{"cpu":"1"}'},
            },
        }
        await c.as_mirror.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "team-a", rewritten)

        # back again: the change goes through
        c.service = QuotaService(c.bus, SETTINGS, registry=new_registry())
        await c.service.start()
        await c.alice.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "team-a", {"spec": {"max": {"cpu": "32"}}}, _content_type=MERGE
        )
        *_, edit = await logged(c.bus)
        assert isinstance(edit, ev.QuotaUpdated) and edit.quota.spec.max == {"cpu": "32"}
