"""The fake Kubernetes API server, driven the way services/k8s drives a real one: kubernetes-asyncio over HTTP.

Covers the REST semantics koordbus relies on (tests/fakes/kube_api.py): create/get/list/update with
resourceVersion conflicts, the three patch media types, status subresource rules, watches that
resume, expire with 410 and survive disconnects, CRD schema validation, label and field selectors,
and the test hooks (seeding, request log, fault injection).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import config, watch
from kubernetes_asyncio.client import ApiClient, ApisApi, Configuration, CoreApi, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from tests.fakes.kube_api import AdmissionAttributes, FakeKubeApi, RecordedRequest
from tests.fakes.kube_rules import ApiError, json_patch, merge_patch
from tests.fixtures.kube import require_crd_schemas

# Imported so the fixtures resolve before tests/conftest.py registers tests.fixtures.kube; the
# file-level F811 exemption above (fixture parameters shadow these imports) goes with it.

SLO = ("slo.koordinator.sh", "v1alpha1")
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
NODE_METRIC_STATUS = {
    "updateTime": "2026-11-22T07:00:00Z",
    "nodeMetric": {"nodeUsage": {"resources": {"cpu": "1500m", "memory": "3Gi"}}},
    "podsMetric": [{"namespace": "default", "name": "web-1", "podUsage": {"resources": {"cpu": 1}}}],
}


def node_metric(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": name},
        "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 60}},
        **extra,
    }


def pod(name: str, node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx"}]},
    }


def rejection(error: pytest.ExceptionInfo[ApiException]) -> tuple[int, str, str]:
    """(code, reason, message) of the Kubernetes Status the server answered with."""
    status = json.loads(error.value.body)
    assert status["kind"] == "Status" and status["code"] == error.value.status
    return status["code"], status["reason"], status["message"]


async def take(stream: AsyncIterator[dict[str, Any]], count: int) -> list[tuple[str, str]]:
    """The next `count` events of a watch as (type, name), failing rather than hanging."""

    async def collect() -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        async for event in stream:
            events.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
            if len(events) == count:
                break
        return events

    return await asyncio.wait_for(collect(), timeout=5)


async def test_create_get_list_update_conflict_delete(kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    body = {"metadata": {"name": "slo-controller-config"}, "data": {"colocation-config": "{}"}}
    created = await core.create_namespaced_config_map("koordinator-system", body)
    assert created.metadata.uid and created.metadata.creation_timestamp
    with pytest.raises(ApiException) as exists:
        await core.create_namespaced_config_map("koordinator-system", body)
    assert rejection(exists)[:2] == (409, "AlreadyExists")
    await core.create_namespaced_config_map("other", {"metadata": {"name": "x"}})

    fetched = await core.read_namespaced_config_map("slo-controller-config", "koordinator-system")
    assert fetched.data == {"colocation-config": "{}"}
    namespaced = await core.list_namespaced_config_map("koordinator-system")
    everywhere = await core.list_config_map_for_all_namespaces()
    assert [c.metadata.name for c in namespaced.items] == ["slo-controller-config"]
    assert sorted(c.metadata.name for c in everywhere.items) == ["slo-controller-config", "x"]
    assert int(everywhere.metadata.resource_version) >= int(fetched.metadata.resource_version)

    fetched.data = {"colocation-config": '{"enable": true}'}
    updated = await core.replace_namespaced_config_map("slo-controller-config", "koordinator-system", fetched)
    assert int(updated.metadata.resource_version) > int(fetched.metadata.resource_version)
    with pytest.raises(ApiException) as stale:  # fetched still carries the old resourceVersion
        await core.replace_namespaced_config_map("slo-controller-config", "koordinator-system", fetched)
    code, reason, message = rejection(stale)
    assert (code, reason) == (409, "Conflict") and "the object has been modified" in message

    await core.delete_namespaced_config_map("slo-controller-config", "koordinator-system")
    with pytest.raises(ApiException) as gone:
        await core.read_namespaced_config_map("slo-controller-config", "koordinator-system")
    assert rejection(gone) == (404, "NotFound", 'configmaps "slo-controller-config" not found')
    with pytest.raises(ApiException) as gone_again:
        await core.delete_namespaced_config_map("slo-controller-config", "koordinator-system")
    assert rejection(gone_again)[:2] == (404, "NotFound")


async def test_generate_name_and_global_resource_version(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    event = {"metadata": {"generateName": "evict-"}, "involvedObject": {"kind": "Pod", "name": "web-1"}}
    first = await core.create_namespaced_event("default", event)
    second = await core.create_node({"metadata": {"name": "n1"}})
    assert first.metadata.name.startswith("evict-") and len(first.metadata.name) == len("evict-") + 5
    assert int(second.metadata.resource_version) == int(first.metadata.resource_version) + 1
    assert kube_api.get("events", first.metadata.name, "default") is not None


async def test_merge_and_json_patches(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    await core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})
    merged = await core.patch_namespaced_config_map(
        "c", "default", {"data": {"a": None, "c": "3"}, "metadata": {"labels": {"x": "y"}}}, _content_type=MERGE
    )
    assert (merged.data, merged.metadata.labels) == ({"b": "2", "c": "3"}, {"x": "y"})

    operations = [
        {"op": "test", "path": "/data/b", "value": "2"},
        {"op": "add", "path": "/data/d", "value": "4"},
        {"op": "replace", "path": "/data/b", "value": "20"},
        {"op": "copy", "from": "/data/b", "path": "/data/e"},
        {"op": "move", "from": "/data/c", "path": "/data/f"},
        {"op": "remove", "path": "/data/d"},
        {"op": "add", "path": "/metadata/annotations", "value": {"k/v": "1"}},
    ]
    patched = await core.patch_namespaced_config_map("c", "default", operations)  # a list goes as json-patch
    assert patched.data == {"b": "20", "e": "20", "f": "3"}
    assert patched.metadata.annotations == {"k/v": "1"}
    with pytest.raises(ApiException) as failed_test:
        await core.patch_namespaced_config_map("c", "default", [{"op": "test", "path": "/data/b", "value": "2"}])
    assert rejection(failed_test)[:2] == (422, "Invalid")
    assert kube_api.get("configmaps", "c", "default")["data"] == patched.data  # type: ignore[index]
    assert [r.content_type for r in kube_api.requests if r.verb == "patch"] == [MERGE, JSON_PATCH, JSON_PATCH]


async def test_strategic_merge_patch_merges_keyed_lists(kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    body = pod("web-1", "n1", {"app": "web"})
    body["spec"]["containers"].append({"name": "sidecar", "image": "envoy"})
    await core.create_namespaced_pod("default", body)
    patch = {
        "metadata": {"labels": {"tier": "batch"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:2"}, {"name": "sidecar", "$patch": "delete"}]},
    }
    patched = await core.patch_namespaced_pod("web-1", "default", patch)  # a dict goes strategic
    assert patched.metadata.labels == {"app": "web", "tier": "batch"}
    assert [(c.name, c.image) for c in patched.spec.containers] == [("app", "nginx:2")]

    await core.create_node(
        {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    status_patch = {"status": {"conditions": [{"type": "MemoryPressure", "status": "False"}]}}
    node = await core.patch_node_status("n1", status_patch)
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True"), ("MemoryPressure", "False")]


async def test_custom_objects_accept_merge_and_json_patch_only(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n1"))
    patch = {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 30}}}
    patched = await custom.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", patch, _content_type=MERGE)
    assert patched["spec"]["metricCollectPolicy"] == {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 30}
    with pytest.raises(ApiException) as strategic:
        await custom.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", patch, _content_type=STRATEGIC)
    assert rejection(strategic)[:2] == (415, "UnsupportedMediaType")
    # kubernetes-asyncio labels a dict body for custom objects as json-patch; the server refuses it,
    # so callers must pass _content_type explicitly.
    with pytest.raises(ApiException) as unlabelled:
        await custom.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", patch)
    assert rejection(unlabelled)[:2] == (400, "BadRequest")
    assert kube_api.requests[-1] == RecordedRequest(
        "patch", "/apis/slo.koordinator.sh/v1alpha1/nodemetrics/n1", JSON_PATCH
    )


async def test_status_subresource_separates_status_from_the_rest(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    created = await custom.create_cluster_custom_object(
        *SLO, "nodemetrics", node_metric("n1", status=NODE_METRIC_STATUS)
    )
    assert "status" not in created and created["metadata"]["generation"] == 1  # create cannot set status

    sneaky_spec = {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 1}}, "status": NODE_METRIC_STATUS}
    with_status = await custom.patch_cluster_custom_object_status(
        *SLO, "nodemetrics", "n1", sneaky_spec, _content_type=MERGE
    )
    assert with_status["status"] == NODE_METRIC_STATUS
    assert with_status["spec"] == created["spec"] and with_status["metadata"]["generation"] == 1

    ignored_status = {"status": {"updateTime": "2030-01-01T00:00:00Z"}, "metadata": {"labels": {"a": "b"}}}
    main = await custom.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", ignored_status, _content_type=MERGE)
    assert main["status"] == NODE_METRIC_STATUS and main["metadata"]["labels"] == {"a": "b"}

    main["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 10
    main["status"] = {}
    replaced = await custom.replace_cluster_custom_object(*SLO, "nodemetrics", "n1", main)
    assert replaced["status"] == NODE_METRIC_STATUS and replaced["metadata"]["generation"] == 2
    assert kube_api.requests[-3].path.endswith("/nodemetrics/n1/status")

    unchanged = await custom.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", {"spec": {}}, _content_type=MERGE)
    assert unchanged["metadata"]["resourceVersion"] == replaced["metadata"]["resourceVersion"]  # no-op writes skip
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "status": {}}
    with pytest.raises(ApiException) as conflict:
        await custom.patch_cluster_custom_object_status(*SLO, "nodemetrics", "n1", stale, _content_type=MERGE)
    assert rejection(conflict)[:2] == (409, "Conflict")


async def test_kind_without_status_subresource_updates_status_in_place(kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    quota = {"metadata": {"name": "team-a"}, "spec": {"max": {"cpu": "10"}}, "status": {"used": {"cpu": "2"}}}
    created = await custom.create_namespaced_custom_object(
        "scheduling.sigs.k8s.io", "v1alpha1", "team-a", "elasticquotas", quota
    )
    assert created["status"] == {"used": {"cpu": "2"}}
    used = {"status": {"used": {"cpu": "3"}}}
    patched = await custom.patch_namespaced_custom_object(
        "scheduling.sigs.k8s.io", "v1alpha1", "team-a", "elasticquotas", "team-a", used, _content_type=MERGE
    )
    assert patched["status"] == {"used": {"cpu": "3"}} and patched["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as no_status:
        await custom.get_namespaced_custom_object_status(
            "scheduling.sigs.k8s.io", "v1alpha1", "team-a", "elasticquotas", "team-a"
        )
    assert rejection(no_status)[:2] == (404, "NotFound")
    del created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as unconditional:  # custom resources need a resourceVersion to update
        await custom.replace_namespaced_custom_object(
            "scheduling.sigs.k8s.io", "v1alpha1", "team-a", "elasticquotas", "team-a", created
        )
    assert rejection(unconditional)[:2] == (422, "Invalid")


async def test_crd_schema_rejects_invalid_node_metric(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n1"))
    valid = await custom.patch_cluster_custom_object_status(
        *SLO, "nodemetrics", "n1", {"status": NODE_METRIC_STATUS}, _content_type=MERGE
    )
    assert valid["status"]["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "1500m"

    bad_status = {"updateTime": "yesterday", "nodeMetric": {"nodeUsage": {"resources": {"cpu": "lots"}}}}
    with pytest.raises(ApiException) as rejected:
        await custom.patch_cluster_custom_object_status(
            *SLO, "nodemetrics", "n1", {"status": bad_status}, _content_type=MERGE
        )
    code, _, message = rejection(rejected)
    assert code == 422 and "status.updateTime" in message and "status.nodeMetric.nodeUsage.resources.cpu" in message
    with pytest.raises(ApiException) as unknown:
        await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n2", spec={"typo": 1}))
    assert rejection(unknown)[0] == 422 and "'typo' was unexpected" in rejection(unknown)[2]
    with pytest.raises(ApiException) as wrong_type:
        as_string = {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": "60"}}}
        await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n3", **as_string))
    assert "spec.metricCollectPolicy.reportIntervalSeconds: '60' is not of type 'integer'" in rejection(wrong_type)[2]
    assert kube_api.get("nodemetrics", "n1")["status"] == NODE_METRIC_STATUS  # type: ignore[index]
    assert [o["metadata"]["name"] for o in kube_api.objects("NodeMetric")] == ["n1"]


async def test_node_quantities_are_checked(kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    await core.create_node({"metadata": {"name": "n1"}})
    allocatable = {"status": {"allocatable": {"kubernetes.io/batch-cpu": "25000"}}}
    node = await core.patch_node_status("n1", allocatable)
    assert node.status.allocatable == {"kubernetes.io/batch-cpu": "25000"}
    with pytest.raises(ApiException) as rejected:
        await core.patch_node_status("n1", {"status": {"allocatable": {"kubernetes.io/batch-cpu": "a lot"}}})
    assert rejection(rejected)[0] == 422 and "status.allocatable.kubernetes.io/batch-cpu" in rejection(rejected)[2]


async def test_label_and_field_selectors(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    for name, node, labels in [
        ("a", "n1", {"app": "web", "tier": "prod"}),
        ("b", "n1", {"app": "web", "tier": "batch", "gpu": "yes"}),
        ("c", "n2", {"app": "db"}),
    ]:
        kube_api.put("pods", pod(name, node, labels))
    core = CoreV1Api(kube_client)

    async def names(**selectors: str) -> list[str]:
        listed = await core.list_pod_for_all_namespaces(**selectors)
        return [p.metadata.name for p in listed.items]

    assert await names(label_selector="app=web") == ["a", "b"]
    assert await names(label_selector="app==web,tier in (batch, mid)") == ["b"]
    assert await names(label_selector="app!=web") == ["c"]
    assert await names(label_selector="!gpu") == ["a", "c"]
    assert await names(label_selector="gpu,tier notin (prod)") == ["b"]
    assert await names(field_selector="spec.nodeName=n1") == ["a", "b"]
    assert await names(field_selector="spec.nodeName=n1,metadata.name!=a") == ["b"]
    assert await names(field_selector="metadata.name=c", label_selector="app") == ["c"]
    with pytest.raises(ApiException) as bad:
        await names(label_selector="app in web")
    assert rejection(bad)[:2] == (400, "BadRequest")


async def test_watch_resumes_from_a_resource_version(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    first = await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n1"))
    await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n2"))
    await custom.patch_cluster_custom_object_status(
        *SLO, "nodemetrics", "n1", {"status": NODE_METRIC_STATUS}, _content_type=MERGE
    )
    await custom.delete_cluster_custom_object(*SLO, "nodemetrics", "n2")
    kube_api.put("nodes", {"metadata": {"name": "n1"}})  # another kind: not in this watch

    async with watch.Watch() as stream:
        events = stream.stream(
            custom.list_cluster_custom_object, *SLO, "nodemetrics",
            resource_version=first["metadata"]["resourceVersion"], timeout_seconds=5,
        )  # fmt: skip
        assert await take(events, 3) == [("ADDED", "n2"), ("MODIFIED", "n1"), ("DELETED", "n2")]
        assert stream.resource_version == str(int(first["metadata"]["resourceVersion"]) + 3)


async def test_watch_lists_then_follows_and_respects_selectors(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    kube_api.put("nodes", {"metadata": {"name": "n1", "labels": {"pool": "colo"}}})
    kube_api.put("nodes", {"metadata": {"name": "n0", "labels": {"pool": "other"}}})
    core = CoreV1Api(kube_client)
    async with watch.Watch() as stream:
        events = stream.stream(core.list_node, label_selector="pool=colo", timeout_seconds=5)
        assert await take(events, 1) == [("ADDED", "n1")]
        kube_api.put("nodes", {"metadata": {"name": "n2", "labels": {"pool": "colo"}}})
        kube_api.put("nodes", {"metadata": {"name": "n1", "labels": {"pool": "other"}}})  # leaves the selection
        kube_api.put("nodes", {"metadata": {"name": "n0", "labels": {"pool": "colo"}}})  # enters it
        kube_api.remove("nodes", "n2")
        assert await take(events, 4) == [("ADDED", "n2"), ("DELETED", "n1"), ("ADDED", "n0"), ("DELETED", "n2")]


async def test_expired_resource_version_answers_410(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    old = await core.create_node({"metadata": {"name": "n1"}})
    await core.create_node({"metadata": {"name": "n2"}})
    kube_api.expire_history()
    for bounded in (True, False):  # without timeout_seconds the client retries the 410 once, then raises
        extra = {"timeout_seconds": 5} if bounded else {}
        async with watch.Watch() as stream:
            events = stream.stream(core.list_node, resource_version=old.metadata.resource_version, **extra)
            with pytest.raises(ApiException) as expired:
                await take(events, 1)
        assert expired.value.status == 410 and "Expired" in str(expired.value.reason)

    url = f"{kube_api.url}/api/v1/nodes?watch=true&resourceVersion={old.metadata.resource_version}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        event = await response.json(content_type=None)
    assert (event["type"], event["object"]["kind"], event["object"]["code"]) == ("ERROR", "Status", 410)


async def test_history_window_expires_old_versions() -> None:
    require_crd_schemas()  # its own server (a short history), not the fixture's
    async with FakeKubeApi(history_limit=2) as api, ApiClient(api.configuration()) as client:
        start = api.put("nodes", {"metadata": {"name": "n1"}})["metadata"]["resourceVersion"]
        for name in ("n2", "n3", "n4"):
            api.put("nodes", {"metadata": {"name": name}})
        async with watch.Watch() as stream:
            events = stream.stream(CoreV1Api(client).list_node, resource_version=start, timeout_seconds=5)
            with pytest.raises(ApiException) as expired:
                await take(events, 1)
        assert expired.value.status == 410


async def test_dropped_watch_reconnects_from_its_last_version(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    kube_api.put("nodes", {"metadata": {"name": "n1"}})
    core = CoreV1Api(kube_client)
    async with watch.Watch() as stream:
        events = stream.stream(core.list_node)  # no timeout: the client reconnects when the stream ends
        assert await take(events, 1) == [("ADDED", "n1")]
        kube_api.drop_watches()
        kube_api.put("nodes", {"metadata": {"name": "n2"}})  # happens while disconnected
        assert await take(events, 1) == [("ADDED", "n2")]
    assert [r.verb for r in kube_api.requests] == ["watch", "watch"]


async def test_abruptly_dropped_watch_is_an_error(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    kube_api.put("nodes", {"metadata": {"name": "n1"}})
    async with watch.Watch() as stream:
        events = stream.stream(CoreV1Api(kube_client).list_node, timeout_seconds=5)
        await take(events, 1)
        kube_api.drop_watches(abrupt=True)
        with pytest.raises(aiohttp.ClientError):
            await take(events, 1)


async def test_watch_timeout_and_bookmarks(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    kube_api.put("nodeslos", {"metadata": {"name": "n1"}})
    async with watch.Watch() as stream:
        events = stream.stream(
            custom.list_cluster_custom_object, *SLO, "nodeslos", timeout_seconds=1, allow_watch_bookmarks=True
        )
        assert await take(events, 1) == [("ADDED", "n1")]  # the watch is open now
        kube_api.put("nodes", {"metadata": {"name": "n1"}})  # moves the global resourceVersion on
        kube_api.bookmark()
        assert [e["type"] async for e in events] == ["BOOKMARK"]  # then the stream ends after timeoutSeconds
        assert stream.resource_version == kube_api.get("nodes", "n1")["metadata"]["resourceVersion"]  # type: ignore[index]


async def test_fail_next_injects_errors(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    kube_api.put("nodemetrics", node_metric("n1"))
    kube_api.fail_next("patch", "NodeMetric", status=500, times=2)
    kube_api.fail_next("get", "nodemetrics", status=429)
    for _ in range(2):
        with pytest.raises(ApiException) as failed:
            await custom.patch_cluster_custom_object_status(
                *SLO, "nodemetrics", "n1", {"status": NODE_METRIC_STATUS}, _content_type=MERGE
            )
        assert failed.value.status == 500
    await custom.patch_cluster_custom_object_status(
        *SLO, "nodemetrics", "n1", {"status": NODE_METRIC_STATUS}, _content_type=MERGE
    )
    with pytest.raises(ApiException) as throttled:
        await custom.get_cluster_custom_object(*SLO, "nodemetrics", "n1")
    assert (throttled.value.status, throttled.value.headers["Retry-After"]) == (429, "1")
    assert rejection(throttled)[1] == "TooManyRequests"
    assert (await custom.get_cluster_custom_object(*SLO, "nodemetrics", "n1"))["status"] == NODE_METRIC_STATUS
    assert [r.verb for r in kube_api.requests].count("patch") == 3


async def test_admission_sees_every_write_with_its_user_and_can_refuse_it(kube_api: FakeKubeApi) -> None:
    """The `admission` hook gets creates, updates, patches and deletes (not /status writes) as validating admission
    does, with the user of the bearer token; an ApiError refuses the write, which is then not stored."""
    seen: list[tuple[str, str, str, Any, Any]] = []

    async def admit(attributes: AdmissionAttributes) -> None:
        new, old = attributes.object, attributes.old_object
        seen.append(
            (
                attributes.operation,
                attributes.name,
                attributes.username,
                new and new["spec"]["metricCollectPolicy"]["reportIntervalSeconds"],
                old and old["spec"]["metricCollectPolicy"]["reportIntervalSeconds"],
            )
        )
        if new is not None and new["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 13:
            raise ApiError(403, 'admission webhook "x" denied the request: 13 is unlucky')

    kube_api.admission = admit
    kube_api.tokens["alice-token"] = ("alice", ["system:authenticated"])
    configuration = Configuration(
        host=kube_api.url, api_key={"BearerToken": "alice-token"}, api_key_prefix={"BearerToken": "Bearer"}
    )
    async with ApiClient(configuration) as alice, ApiClient(kube_api.configuration()) as anonymous:
        custom, nobody = CustomObjectsApi(alice), CustomObjectsApi(anonymous)
        created = await custom.create_cluster_custom_object(*SLO, "nodemetrics", node_metric("n1"))
        spec = {"metricCollectPolicy": {"aggregateDurationSeconds": 300, "reportIntervalSeconds": 30}}
        await nobody.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", {"spec": spec}, _content_type=MERGE)
        unlucky = {**created, "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 13}}}
        unlucky["metadata"] = {
            **created["metadata"],
            "resourceVersion": kube_api.get("NodeMetric", "n1")["metadata"]["resourceVersion"],
        }
        with pytest.raises(ApiException) as refused:
            await custom.replace_cluster_custom_object(*SLO, "nodemetrics", "n1", unlucky)
        assert rejection(refused) == (403, "Unknown", 'admission webhook "x" denied the request: 13 is unlucky')
        await custom.patch_cluster_custom_object_status(
            *SLO, "nodemetrics", "n1", {"status": NODE_METRIC_STATUS}, _content_type=MERGE
        )
        await custom.delete_cluster_custom_object(*SLO, "nodemetrics", "n1")
    assert seen == [
        ("CREATE", "n1", "alice", 60, None),
        ("UPDATE", "n1", "system:anonymous", 30, 60),
        ("UPDATE", "n1", "alice", 13, 30),
        ("DELETE", "n1", "alice", None, 30),
    ]
    assert kube_api.get("NodeMetric", "n1") is None


async def test_a_write_racing_admission_is_tried_again_from_the_new_state(
    kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    """Another write while admission runs: a patch is admitted again over the new object (kube-apiserver's
    GuaranteedUpdate), an update with the old resourceVersion fails with 409."""
    custom = CustomObjectsApi(kube_client)
    kube_api.put("nodemetrics", node_metric("n1"))
    olds: list[int] = []

    async def admit(attributes: AdmissionAttributes) -> None:
        old = attributes.old_object
        assert old is not None
        olds.append(old["spec"]["metricCollectPolicy"]["reportIntervalSeconds"])
        if len(olds) == 1:  # another writer, while the first admission runs
            kube_api.put("nodemetrics", node_metric("n1", metadata={"name": "n1", "labels": {"by": "other"}}))

    kube_api.admission = admit
    patch = {"spec": {"metricCollectPolicy": {"reportIntervalSeconds": 30}}}
    await custom.patch_cluster_custom_object(*SLO, "nodemetrics", "n1", patch, _content_type=MERGE)
    stored = kube_api.get("NodeMetric", "n1")
    assert stored is not None and len(olds) == 2
    assert stored["metadata"]["labels"] == {"by": "other"}
    assert stored["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] == 30
    olds.clear()
    with pytest.raises(ApiException) as conflict:
        await custom.replace_cluster_custom_object(*SLO, "nodemetrics", "n1", stored)
    assert rejection(conflict)[:2] == (409, "Conflict") and len(olds) == 1


async def test_degrade_slows_and_fails_one_path_until_recover(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    custom = CustomObjectsApi(kube_client)
    core_api = CoreV1Api(kube_client)
    kube_api.put("nodemetrics", node_metric("n1"))
    kube_api.put("nodes", {"metadata": {"name": "n1"}})
    kube_api.degrade("/apis/slo.koordinator.sh/", latency_seconds=0.05, failure_ratio=0.5, status=503)
    statuses = []
    for _ in range(40):
        try:
            await custom.get_cluster_custom_object(*SLO, "nodemetrics", "n1")
            statuses.append(200)
        except ApiException as e:
            statuses.append(e.status)
    assert set(statuses) == {200, 503} and 8 <= statuses.count(503) <= 32  # about half, from the seeded generator
    assert (await core_api.read_node("n1")).metadata.name == "n1"  # other paths are untouched
    degraded = [a for a in kube_api.answered if a.path.startswith("/apis/slo.koordinator.sh/")]
    assert [a.status for a in degraded] == statuses
    assert all(b.at - a.at >= 0.05 for a, b in itertools.pairwise(degraded))  # each waited first
    kube_api.recover()
    for _ in range(10):
        await custom.get_cluster_custom_object(*SLO, "nodemetrics", "n1")
    assert kube_api.answered[-1].status == 200
    with pytest.raises(ValueError, match="failure_ratio"):
        kube_api.degrade(failure_ratio=1.5)


async def test_kubeconfig_configuration_and_discovery(kube_api: FakeKubeApi, tmp_path: Path) -> None:
    kube_api.put("nodes", {"metadata": {"name": "n1"}})
    loaded = Configuration()
    await config.load_kube_config(
        config_file=str(kube_api.kubeconfig(tmp_path / "kubeconfig")), client_configuration=loaded
    )
    assert loaded.host == kube_api.url
    async with ApiClient(loaded) as client:
        assert [n.metadata.name for n in (await CoreV1Api(client).list_node()).items] == ["n1"]
        assert (await CoreApi(client).get_api_versions()).versions == ["v1"]
        groups = {g.name for g in (await ApisApi(client).get_api_versions()).groups}
        resources = (await CustomObjectsApi(client).get_api_resources(*SLO)).resources
    assert {"slo.koordinator.sh", "scheduling.koordinator.sh", "topology.node.k8s.io"} <= groups
    assert {r.name for r in resources} == {"nodemetrics", "nodemetrics/status", "nodeslos", "nodeslos/status"}


def test_patch_rules_on_arrays_escapes_and_sets() -> None:
    doc = {"a": [1, 2], "m": {"x/y": 1, "t~": 2}, "metadata": {"finalizers": ["f1"]}}
    patched = json_patch(
        doc,
        [
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "add", "path": "/a/0", "value": 0},
            {"op": "remove", "path": "/m/x~1y"},
            {"op": "move", "from": "/m/t~0", "path": "/a/1"},
        ],
    )
    assert patched == {"a": [0, 2, 1, 2, 3], "m": {}, "metadata": {"finalizers": ["f1"]}}
    assert doc["a"] == [1, 2]  # patches never touch their input
    with pytest.raises(ApiError) as out_of_range:
        json_patch(doc, [{"op": "replace", "path": "/a/5", "value": 1}])
    assert out_of_range.value.code == 422
    strategic = merge_patch(
        doc, {"metadata": {"finalizers": ["f2", "f1"]}, "m": {"$patch": "replace", "z": 1}}, strategic=True
    )
    assert strategic["metadata"]["finalizers"] == ["f1", "f2"] and strategic["m"] == {"z": 1}
    assert merge_patch(doc, {"a": None, "m": {"new": {"keep": 1, "drop": None}}}) == {
        "m": {"x/y": 1, "t~": 2, "new": {"keep": 1}},
        "metadata": {"finalizers": ["f1"]},
    }
