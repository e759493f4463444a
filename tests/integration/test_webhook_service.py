"""Issue 24 points 1, 3 and 5: the real `koordbus service webhook` process with a real nats-server, spoken to over
real HTTPS as kube-apiserver speaks to it (AdmissionReview v1 bodies, the caBundle's CA as the only trust).

The ClusterColocationProfiles, Namespaces and PriorityClasses are published as the bridge's observer publishes them
(tests/support/webhook.publish_observed); a Job's Pod comes back patched into a koordbus batch pod; a broken
slo-controller-config is refused with each key's JSON path; malformed reviews are a 400 or `allowed: false` saying
why, never a 500; a renewed certificate is served without a restart.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from bus.jetstream import JetStreamBus
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

BATCH_PROFILE = profile(
    "colocation-batch",
    namespaceSelector={"matchLabels": {"koordinator.sh/enable-colocation": "true"}},
    selector={"matchExpressions": [{"key": "job-name", "operator": "Exists"}]},
    qosClass="BE",
    priorityClassName="koord-batch",
    schedulerName="koord-scheduler",
    labels={"koordinator.sh/mutated": "true"},
)


async def started(process: WebhookProcess) -> None:
    process.start()

    async def ready() -> bool:
        assert process.running, process.describe()
        async with httpx.AsyncClient() as plain:
            return (await process.readyz(plain))[0] == 200

    await eventually(ready, timeout=60)


async def post(client: httpx.AsyncClient, url: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await client.post(url, content=content, headers={"Content-Type": "application/json"})


def patched(response: httpx.Response, original: dict[str, Any]) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    answer = response.json()["response"]
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch", answer
    result: dict[str, Any] = apply_patch(original, json.loads(base64.b64decode(answer["patch"])))
    return result


async def test_pods_become_batch_pods_configmaps_are_validated_and_bad_reviews_say_why(
    koordbus_nats_url: str, koordbus_bus: JetStreamBus, tmp_path: Path
) -> None:
    ca = CertificateAuthority.create(tmp_path, "cluster")
    await publish_observed(koordbus_bus, KINDS["profile"], BATCH_PROFILE)
    await publish_observed(
        koordbus_bus, KINDS["namespace"], namespace("spark", {"koordinator.sh/enable-colocation": "true"})
    )
    await publish_observed(koordbus_bus, KINDS["namespace"], namespace("web", {}))
    await publish_observed(koordbus_bus, KINDS["priorityclass"], priority_class("koord-batch", 5999))
    process = WebhookProcess(koordbus_nats_url, ca.issue("webhook", server=True), log_dir=tmp_path)
    await started(process)
    try:
        async with httpx.AsyncClient(verify=client_context(ca.cert), timeout=10) as client:
            mutate, validate = f"{process.https_url}/mutate-pods", f"{process.https_url}/validate-configmaps"

            # a Job's Pod in a co-location namespace: the profile makes it a koordbus batch pod
            pod = job_pod()
            review = admission_review("pods", pod, namespace_name="spark")
            response = await post(client, mutate, review)
            assert response.json()["response"]["uid"] == review["request"]["uid"]
            batch = patched(response, pod)
            assert batch["metadata"]["labels"]["koordinator.sh/qosClass"] == "BE"
            assert (batch["spec"]["priorityClassName"], batch["spec"]["priority"]) == ("koord-batch", 5999)
            assert batch["spec"]["schedulerName"] == "koord-scheduler"
            assert batch["spec"]["containers"][0]["resources"] == {
                "limits": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"},
                "requests": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": "4Gi"},
            }
            assert batch["spec"]["volumes"] == pod["spec"]["volumes"]  # the rest is left as it was

            # another namespace, an UPDATE: unchanged
            for other in (
                admission_review("pods", pod, namespace_name="web"),
                admission_review("pods", pod, namespace_name="spark", operation="UPDATE", old=pod),
            ):
                answer = (await post(client, mutate, other)).json()["response"]
                assert answer == {"uid": other["request"]["uid"], "allowed": True}

            # a profile published while it runs is used; one naming an unknown PriorityClass refuses the pod
            await publish_observed(
                koordbus_bus, KINDS["profile"], profile("z-missing-class", priorityClassName="koord-missing")
            )

            async def refused() -> bool:
                answer = (await post(client, mutate, review)).json()["response"]
                return answer["allowed"] is False

            await eventually(refused, timeout=10)
            answer = (await post(client, mutate, review)).json()["response"]
            assert answer["status"]["code"] == 400
            assert 'priorityclasses.scheduling.k8s.io "koord-missing" not found' in answer["status"]["message"]
            await publish_observed(koordbus_bus, KINDS["profile"], None, name="z-missing-class")

            async def allowed_again() -> bool:
                return bool((await post(client, mutate, review)).json()["response"]["allowed"])

            await eventually(allowed_again, timeout=10)

            # the slo-controller-config: a bad key refused with its JSON path, an unrelated edit passes
            def configmap(data: dict[str, str]) -> dict[str, Any]:
                meta = {"name": "slo-controller-config", "namespace": "koordinator-system"}
                return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}

            good = {
                "colocation-config": '{"enable": true}',
                "cpu-burst-config": '{"clusterStrategy": {"policy": "auto"}}',
            }
            bad = {**good, "colocation-config": '{"enable": true, "cpuReclaimThresholdPercent": -5}'}
            where = {"namespace_name": "koordinator-system", "name": "slo-controller-config"}
            answer = (await post(client, validate, admission_review("configmaps", configmap(bad), **where))).json()
            assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 403
            message = answer["response"]["status"]["message"]
            assert "data.colocation-config: $.cpuReclaimThresholdPercent: must be ≥ 0, got -5" in message
            causes = answer["response"]["status"]["details"]["causes"]
            assert [c["field"] for c in causes] == ["data[colocation-config]"]
            edit = admission_review(
                "configmaps", configmap({**bad, "x": "1"}), operation="UPDATE", old=configmap(bad), **where
            )
            assert (await post(client, validate, edit)).json()["response"]["allowed"] is True
            good_review = admission_review("configmaps", configmap(good), **where)
            assert (await post(client, validate, good_review)).json()["response"]["allowed"] is True

            # malformed reviews: a 400 naming what is wrong, never a 500
            v1beta1 = {**review, "apiVersion": "admission.k8s.io/v1beta1"}
            no_uid = {**review, "request": {**review["request"], "uid": 42}}
            deep: Any = {}
            for _ in range(200):
                deep = {"a": deep}
            cases: list[tuple[Any, int, str]] = [
                (b"{not json", 400, "not valid JSON"),
                (b"\xff\xfe", 400, "the body is not valid"),
                ([], 400, "expected a JSON object"),
                (v1beta1, 400, "apiVersion: expected 'admission.k8s.io/v1'"),
                (no_uid, 400, "request.uid: expected str, got int"),
                ({**review, "request": {**review["request"], "object": deep}}, 400, "nested more than 64 levels"),
            ]
            for body, status, text in cases:
                response = await post(client, mutate, body)
                assert (response.status_code, text in response.json()["error"]) == (status, True), response.text
            too_big = json.dumps({**review, "padding": "x" * (3 * 1024 * 1024)}).encode()
            assert (await post(client, mutate, too_big)).status_code == 413
            not_a_pod = admission_review("pods", {"spec": {"containers": "many"}}, namespace_name="spark")
            answer = (await post(client, mutate, not_a_pod)).json()["response"]
            assert answer["allowed"] is False and "request.object" in answer["status"]["message"]

        # the plain port: health, readiness and metrics, no admission route
        async with httpx.AsyncClient(timeout=10) as plain:
            assert (await plain.post(f"{process.base_url}/mutate-pods", json=review)).status_code in (404, 405)
            metrics = (await plain.get(f"{process.base_url}/metrics")).text
            assert 'koordbus_webhook_requests_total{outcome="patched",route="/mutate-pods"}' in metrics
            assert 'koordbus_webhook_requests_total{outcome="bad_request",route="/mutate-pods"} 6.0' in metrics
            assert 'koordbus_webhook_objects{kind="namespace"} 2.0' in metrics
        assert "Traceback" not in process.log_tail(), process.describe()
    finally:
        assert await process.stop() == 0, process.describe()


async def test_a_renewed_certificate_is_served_without_a_restart(koordbus_nats_url: str, tmp_path: Path) -> None:
    first, second = (CertificateAuthority.create(tmp_path, name) for name in ("first", "second"))
    served = tmp_path / "served"
    served.mkdir()
    old = first.issue("webhook-1", server=True)
    new = second.issue("webhook-2", server=True)
    serving = type(old)(cert=served / "tls.crt", key=served / "tls.key")
    shutil.copy(old.cert, serving.cert)
    shutil.copy(old.key, serving.key)
    process = WebhookProcess(
        koordbus_nats_url, serving, log_dir=tmp_path, env={"KOORDBUS_WEBHOOK_TLS_RELOAD_SECONDS": "0.2"}
    )
    await started(process)
    review = admission_review("pods", job_pod(), namespace_name="default")
    url = f"{process.https_url}/mutate-pods"

    async def served_to(trust: Path) -> bool:
        async with httpx.AsyncClient(verify=client_context(trust), timeout=5) as client:
            try:
                return (await post(client, url, review)).status_code == 200
            except httpx.TransportError:
                return False

    try:
        assert await served_to(first.cert) and not await served_to(second.cert)
        async with httpx.AsyncClient(verify=client_context(first.cert), timeout=5) as kept:
            assert (await post(kept, url, review)).status_code == 200
            # the key first, a moment with a pair that does not match (kept: the old pair is served), then the cert
            shutil.copy(new.key, serving.key)
            shutil.copy(new.cert, serving.cert)
            await eventually(lambda: served_to(second.cert), timeout=10)
            assert not await served_to(first.cert)
            # a connection made before the renewal goes on with the certificate it shook hands with
            assert (await post(kept, url, review)).status_code == 200
        # a broken pair is not loaded: the renewed certificate stays
        warned = process.log_tail().count("does not load")
        serving.cert.write_text("not a certificate\n")
        await eventually(lambda: process.log_tail().count("does not load") > warned, timeout=10)
        assert await served_to(second.cert)
    finally:
        assert await process.stop() == 0, process.describe()
