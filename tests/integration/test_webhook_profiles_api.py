"""Issue 24 point 1, the REST half: ClusterColocationProfiles managed through koordbus's API are applied by the real
`koordbus service webhook` process (real nats-server, HTTPS as kube-apiserver calls it) like the cluster's.

Create through `POST /api/v1/colocation-profiles` → a matching Pod is mutated → PATCH changes the mutation → a stale
resourceVersion is a 409 → DELETE → the Pod is no longer mutated. A profile of the same name in the cluster is
shadowed by the API's while that one exists. The webhook restarted reads the API's profiles back from the log.
Roles, and hostile input answered with a 4xx naming the field, never a 500.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from services.webhook import component as webhook_component
from tests.integration.test_webhook_service import started
from tests.security.test_bodies_api import alias_bomb
from tests.support import api_auth
from tests.support.tls import CertificateAuthority
from tests.support.waiting import eventually
from tests.support.webhook import (
    KINDS,
    WebhookProcess,
    admission_review,
    apply_patch,
    client_context,
    job_pod,
    namespace,
    priority_class,
    profile,
    publish_observed,
)

pytestmark = pytest.mark.e2e

PROFILES = "/api/v1/colocation-profiles"
BATCH_YAML = """\
apiVersion: config.koordinator.sh/v1alpha1
kind: ClusterColocationProfile
metadata:
  name: api-batch
spec:
  namespaceSelector:
    matchLabels: {koordinator.sh/enable-colocation: "true"}
  selector:
    matchExpressions: [{key: job-name, operator: Exists}]
  qosClass: BE
  priorityClassName: koord-batch
  schedulerName: koord-scheduler
  labels: {example.com/mutated-by: api}
"""


@pytest_asyncio.fixture
async def api(koordbus_bus: JetStreamBus) -> AsyncIterator[httpx.AsyncClient]:
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(webhook_component.profiles(koordbus_bus),),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers=api_auth.headers(auth.ADMIN), timeout=30
    ) as client:
        yield client


class Webhook:
    """POSTs a Job's Pod in namespace spark to /mutate-pods and reads back the Pod as mutated (None: unchanged)."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client, self.url = client, url

    async def mutated(self) -> dict[str, Any] | None:
        pod = job_pod()
        review = admission_review("pods", pod, namespace_name="spark")
        answer = await self.client.post(f"{self.url}/mutate-pods", json=review)
        assert answer.status_code == 200, answer.text
        response = answer.json()["response"]
        assert response["allowed"] is True, response
        if "patch" not in response:
            return None
        result: dict[str, Any] = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        return result

    async def label(self, key: str) -> str | None:
        pod = await self.mutated()
        return None if pod is None else pod["metadata"]["labels"].get(key)

    async def until_label(self, key: str, value: str | None) -> None:
        async def seen() -> bool:
            return await self.label(key) == value

        await eventually(seen, timeout=15)


async def test_profiles_made_through_the_api_are_applied_by_the_webhook_until_deleted(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    await publish_observed(
        koordbus_bus, KINDS["namespace"], namespace("spark", {"koordinator.sh/enable-colocation": "true"})
    )
    await publish_observed(koordbus_bus, KINDS["priorityclass"], priority_class("koord-batch", 5999))
    ca = CertificateAuthority.create(tmp_path, "cluster")
    process = WebhookProcess(koordbus_nats_url, ca.issue("webhook", server=True), log_dir=tmp_path)
    await started(process)
    try:
        async with httpx.AsyncClient(verify=client_context(ca.cert), timeout=10) as https:
            webhook = Webhook(https, process.https_url)
            assert await webhook.mutated() is None  # no profile yet

            # create (YAML, as kubectl prints it): the next Pod becomes a koordbus batch pod
            created = await api.post(PROFILES, content=BATCH_YAML, headers={"Content-Type": "application/yaml"})
            assert created.status_code == 201, created.text
            version = created.json()["metadata"]["resourceVersion"]
            await webhook.until_label("example.com/mutated-by", "api")
            pod = await webhook.mutated()
            assert pod is not None
            assert pod["metadata"]["labels"]["koordinator.sh/qosClass"] == "BE"
            assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("koord-batch", 5999)
            assert pod["spec"]["containers"][0]["resources"]["requests"] == {
                "kubernetes.io/batch-cpu": "1500",
                "kubernetes.io/batch-memory": "4Gi",
            }

            # reads: the list and the object, for a viewer too; writes need admin
            viewer = api_auth.headers(auth.VIEWER)
            listed = await api.get(PROFILES, headers=viewer)
            assert listed.status_code == 200
            assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["api-batch"]
            got = await api.get(f"{PROFILES}/api-batch", headers=viewer)
            assert got.json()["spec"]["qosClass"] == "BE" and got.json()["metadata"]["resourceVersion"] == version
            for method in ("POST", "PUT", "PATCH", "DELETE"):
                path = PROFILES if method == "POST" else f"{PROFILES}/api-batch"
                refused = await api.request(method, path, json={"spec": {}}, headers=viewer)
                assert refused.status_code == 403 and "admin" in refused.json()["error"], refused.text
            assert (
                await api.post(PROFILES, content=BATCH_YAML, headers={"Content-Type": "application/yaml"})
            ).status_code == 409

            # patch: the mutation follows
            patched = await api.patch(
                f"{PROFILES}/api-batch", json={"spec": {"labels": {"example.com/mutated-by": "patch"}}}
            )
            assert patched.status_code == 200, patched.text
            assert int(patched.json()["metadata"]["resourceVersion"]) > int(version)
            await webhook.until_label("example.com/mutated-by", "patch")

            # a dry run changes nothing; a stale resourceVersion is a 409
            dry = await api.patch(f"{PROFILES}/api-batch?dryRun=true", json={"spec": {"qosClass": "LS"}})
            assert dry.status_code == 200 and dry.json()["spec"]["qosClass"] == "LS"
            assert (await api.get(f"{PROFILES}/api-batch")).json()["spec"]["qosClass"] == "BE"
            stale = {**created.json(), "spec": {**created.json()["spec"], "qosClass": "LS"}}
            answer = await api.put(f"{PROFILES}/api-batch", json=stale)
            assert answer.status_code == 409 and "changed since it was read" in answer.json()["error"]
            stale_delete = await api.delete(f"{PROFILES}/api-batch", params={"resourceVersion": version})
            assert stale_delete.status_code == 409

            # a bad change is refused naming the field, and the webhook keeps applying the good profile
            bad = await api.patch(f"{PROFILES}/api-batch", json={"spec": {"qosClass": "BestEffort"}})
            assert bad.status_code == 422 and bad.json()["field"] == "spec.qosClass", bad.text

            # delete: Pods are no longer mutated
            deleted = await api.delete(f"{PROFILES}/api-batch")
            assert deleted.status_code == 200, deleted.text

            async def unchanged() -> bool:
                return await webhook.mutated() is None

            await eventually(unchanged, timeout=15)
            assert (await api.get(f"{PROFILES}/api-batch")).status_code == 404
            assert (await api.delete(f"{PROFILES}/api-batch")).status_code == 404
            assert (await api.get(PROFILES)).json()["items"] == []

            # the same name in the cluster and through the API: the API's applies while it exists
            cluster_one = profile("shared", labels={"example.com/source": "cluster"})
            await publish_observed(koordbus_bus, KINDS["profile"], cluster_one)
            await webhook.until_label("example.com/source", "cluster")
            ours = {"metadata": {"name": "shared"}, "spec": {"labels": {"example.com/source": "api"}}}
            assert (await api.post(PROFILES, json=ours)).status_code == 201
            await webhook.until_label("example.com/source", "api")
            listed = (await api.get(PROFILES)).json()
            assert listed["cluster"] == {"applied": [], "shadowed": ["shared"]}
            changed = profile("shared", labels={"example.com/source": "cluster-changed"})
            await publish_observed(koordbus_bus, KINDS["profile"], changed)
            await publish_observed(koordbus_bus, KINDS["profile"], profile("z-marker", labels={"example.com/z": "1"}))
            await webhook.until_label("example.com/z", "1")  # the cluster's change was read before the marker
            assert await webhook.label("example.com/source") == "api"

            # a restarted webhook reads the API's profiles back from the log
            await process.stop()
            await started(process)
            assert await webhook.label("example.com/source") == "api"

            assert (await api.delete(f"{PROFILES}/shared")).status_code == 200
            await webhook.until_label("example.com/source", "cluster-changed")
            listed = (await api.get(PROFILES)).json()
            assert listed["items"] == [] and listed["cluster"] == {"applied": ["shared", "z-marker"], "shadowed": []}
    finally:
        await process.stop()


async def test_hostile_input_is_a_4xx_naming_what_is_wrong(api: httpx.AsyncClient) -> None:
    async def expect(answer: httpx.Response, status: int, words: str) -> dict[str, Any]:
        assert answer.status_code == status, answer.text
        body: dict[str, Any] = answer.json()
        assert words in body["error"], body
        return body

    yaml = {"Content-Type": "application/yaml"}
    started_at = time.monotonic()
    await expect(await api.post(PROFILES, content=alias_bomb(8), headers=yaml), 400, "aliases")
    assert time.monotonic() - started_at < 2
    await expect(await api.post(PROFILES, content="!!python/object:os.system x", headers=yaml), 400, "JSON or YAML")
    deep = '{"metadata": {"name": "x"}, "spec": {"patch": ' + "[" * 5000 + "]" * 5000 + "}}"
    await expect(await api.post(PROFILES, content=deep), 400, "nested more than")
    await expect(await api.post(PROFILES, content=b'{"metadata": {"name": "caf\xe9\xff"}}'), 400, "not valid UTF-8")
    await expect(await api.post(PROFILES, content=b""), 400, "empty")
    await expect(await api.post(PROFILES, content=b"x" * (2 * 1024 * 1024)), 413, "limit")
    big = {f"example.com/a{i}": "x" * 1000 for i in range(400)}
    body = await expect(
        await api.post(PROFILES, json={"metadata": {"name": "big"}, "spec": {"annotations": big}}), 413, "at most"
    )
    assert body["field"] == "body"
    for document, field in (
        ({"metadata": {"name": "p"}, "spec": {"qosClass": "XL"}}, "spec.qosClass"),
        (
            {"metadata": {"name": "p"}, "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}},
            "spec.selector",
        ),
        ({"metadata": {"name": "Not.A.Name"}}, "metadata.name"),
        ({"metadata": {"name": "x" * 100_000}}, "metadata.name"),
        ({"metadata": {"name": "p"}, "spec": {"labels": {"k" * 10_000: "v"}}}, "spec.labels key"),
        ({"metadata": {"name": "p"}, "spec": {"probability": "1e400%"}}, "spec.probability"),
    ):
        answer = await api.post(PROFILES, json=document)
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == field and len(answer.text) < 1000, answer.text
    for path in (f"{PROFILES}/{'x' * 5000}", f"{PROFILES}/UPPER", f"{PROFILES}/a..b"):
        answer = await api.get(path)
        assert answer.status_code in (414, 422), answer.text[:200]
    assert (await api.get(f"{PROFILES}/absent")).status_code == 404
    nothing = await api.put(f"{PROFILES}/absent", json={"spec": {}})
    assert nothing.status_code == 404
    assert (await api.get(PROFILES)).json()["items"] == []  # nothing was appended


async def test_racing_writers_one_wins_and_a_retried_create_is_stored_once(
    api: httpx.AsyncClient, koordbus_bus: JetStreamBus
) -> None:
    created = await api.post(PROFILES, json={"metadata": {"name": "raced"}, "spec": {"qosClass": "LS"}})
    version = created.json()["metadata"]["resourceVersion"]
    answers = await asyncio.gather(
        *(
            api.patch(
                f"{PROFILES}/raced", json={"metadata": {"resourceVersion": version}, "spec": {"labels": {"w": str(i)}}}
            )
            for i in range(6)
        )
    )
    assert sorted(a.status_code for a in answers) == [200] + [409] * 5, [a.text for a in answers]
    winner = next(a for a in answers if a.status_code == 200).json()
    assert (await api.get(f"{PROFILES}/raced")).json() == winner
    # without a resourceVersion the writes go one after the other or lose the race on the subject: never both lost
    blind = await asyncio.gather(*(api.put(f"{PROFILES}/raced", json={"spec": {"qosClass": q}}) for q in ("LS", "BE")))
    assert {a.status_code for a in blind} <= {200, 409} and 200 in {a.status_code for a in blind}

    retried = {"Idempotency-Key": "create-once-1"}
    body = {"metadata": {"name": "once"}, "spec": {"qosClass": "BE"}}
    first = await api.post(PROFILES, json=body, headers=retried)
    second = await api.post(PROFILES, json=body, headers=retried)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json() == second.json()
    other = await api.post(PROFILES, json=body, headers={"Idempotency-Key": "another"})
    assert other.status_code == 409
    count, _ = await koordbus_bus.stream_info(streams.KOORD_CCP)
    assert count == 2  # raced and once: one message per profile (the last per subject is kept)
    events = await koordbus_bus.read_recent(streams.KOORD_CCP, subjects.colocation_profile("once"), since=0, limit=10)
    assert [json.loads(e.data)["actor"] for e in events] == ["test-admin"]
