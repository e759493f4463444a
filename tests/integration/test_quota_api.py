"""The quota REST API end to end in one process: FastAPI app → request/reply on a real nats-server → the quota
service → KOORD_QUOTA → projections in SQLite and PostgreSQL → the read routes. Kubernetes-shaped objects in and out
(YAML as kubectl prints it), plain-words 422s, roles, concurrent conflicting updates, the tree view, history,
check and what-if."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth, db
from services.common.metrics import new_registry
from services.quota import component as quota_component
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from tests.integration.test_quota_service import SETTINGS
from tests.support import api_auth
from tests.support.crd import crd_errors, crd_validator
from tests.support.quota_stack import quota_stack
from tests.support.waiting import eventually

ORG = {
    "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
    "kind": "ElasticQuota",
    "metadata": {
        "name": "org",
        "namespace": "teams",
        "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"},
    },
    "spec": {"min": {"cpu": "30", "memory": "30Gi"}, "max": {"cpu": "40", "memory": "40Gi"}},
}

TEAM_A_YAML = """\
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata:
  creationTimestamp: "2026-11-01T10:00:00Z"
  generation: 1
  labels:
    quota.scheduling.koordinator.sh/parent: org
  name: team-a
  namespace: teams
  resourceVersion: "123456"
  uid: 1b4a0f5e-0000-4000-8000-000000000001
  managedFields:
  - manager: kubectl
    operation: Update
spec:
  max:
    cpu: "40"
    memory: 40Gi
  min:
    cpu: "15"
    memory: 15Gi
status:
  used:
    cpu: "3"
"""


def team(name: str, min_cpu: str) -> dict[str, Any]:
    return {
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "teams", "labels": {"quota.scheduling.koordinator.sh/parent": "org"}},
        "spec": {"min": {"cpu": min_cpu, "memory": "1Gi"}, "max": {"cpu": "40", "memory": "40Gi"}},
    }


@pytest_asyncio.fixture
async def api(tmp_path: Path, migrated_engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with quota_stack(tmp_path, migrated_engine) as stack:
        transport = httpx.ASGITransport(app=stack.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=api_auth.headers(auth.QUOTA_ADMIN), timeout=30
        ) as client:
            yield client


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    await eventually(check, timeout=15)


async def test_create_read_update_delete_in_kubernetes_shape(api: httpx.AsyncClient) -> None:
    created = await api.post("/api/v1/quotas", json=ORG)
    assert created.status_code == 201, created.text
    assert created.json()["metadata"]["resourceVersion"] == "1"
    posted = await api.post("/api/v1/quotas", content=TEAM_A_YAML, headers={"Content-Type": "application/yaml"})
    assert posted.status_code == 201, posted.text
    body = posted.json()
    assert body["metadata"]["labels"]["quota.scheduling.koordinator.sh/parent"] == "org"
    assert "uid" not in body["metadata"] and "status" not in body  # cluster fields are not ours

    async def projected() -> bool:
        return (await api.get("/api/v1/quotas/team-a")).status_code == 200

    await until(projected)
    got = (await api.get("/api/v1/quotas/team-a")).json()
    assert crd_errors(crd_validator("scheduling.sigs.k8s.io_elasticquotas.yaml"), got) == []
    assert got["metadata"]["annotations"]["quota.scheduling.koordinator.sh/runtime"] == '{"cpu":"0","memory":"0"}'
    listed = (await api.get("/api/v1/quotas")).json()
    assert listed["kind"] == "ElasticQuotaList"
    assert {"org", "team-a", "koordinator-root-quota"} <= {i["metadata"]["name"] for i in listed["items"]}

    stale = await api.put(
        "/api/v1/quotas/team-a",
        json={**team("team-a", "10"), "metadata": {**team("team-a", "10")["metadata"], "resourceVersion": "1"}},
    )
    assert stale.status_code == 409 and "resourceVersion 2, not 1" in stale.json()["error"]
    patched = await api.patch("/api/v1/quotas/team-a", json={"spec": {"min": {"cpu": "12"}}})
    assert patched.status_code == 200 and patched.json()["spec"]["min"]["cpu"] == "12"

    async def two_events() -> bool:
        items = (await api.get("/api/v1/quotas/team-a/history")).json()["items"]
        return [i["type"] for i in items] == ["quota.updated.v1", "quota.created.v1"]

    await until(two_events)
    assert (await api.get("/api/v1/quotas/team-a/history")).json()["items"][0]["actor"] == "test-quota-admin"

    refused = await api.delete("/api/v1/quotas/org")
    assert refused.status_code == 422 and refused.json()["violations"][0]["rule"] == "delete-with-children"
    assert (await api.delete("/api/v1/quotas/team-a")).status_code == 200
    assert (await api.delete("/api/v1/quotas/team-a")).status_code == 404

    async def gone() -> bool:
        return (await api.get("/api/v1/quotas/team-a")).status_code == 404

    await until(gone)


async def test_bad_input_is_a_precise_4xx_and_nothing_is_appended(api: httpx.AsyncClient) -> None:
    assert (await api.post("/api/v1/quotas", json=ORG)).status_code == 201
    cases: list[tuple[Any, int, str]] = [
        (b"{not json", 400, "not valid JSON"),
        ([1, 2], 400, "must be a ElasticQuota object"),
        ({**team("x", "1"), "kind": "Pod"}, 422, "is a Pod, expected ElasticQuota"),
        ({**team("x", "1"), "spec": {"min": "lots"}}, 422, "$.spec.min"),
        (team("x", "many"), 422, "spec.min"),
        (team("x", "41"), 422, "quota x: spec.min.cpu 41 exceeds spec.max.cpu 40 (min must not exceed max)"),
        (
            {**team("x", "1"), "metadata": {"name": "x", "labels": {"quota.scheduling.koordinator.sh/parent": "nope"}}},
            422,
            "parent nope does not exist",
        ),
        (b"x" * (1024 * 1024 + 1), 413, "limit is 1048576 bytes"),
    ]
    for body, status, fragment in cases:
        if isinstance(body, bytes):
            answer = await api.post("/api/v1/quotas", content=body, headers={"Content-Type": "application/json"})
        else:
            answer = await api.post("/api/v1/quotas", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert fragment in answer.json()["error"], answer.json()
    over = await api.post("/api/v1/quotas", json=team("y", "31"))
    assert over.status_code == 422
    assert over.json()["violations"][0] == {
        "quota": "y",
        "field": "spec.min.cpu",
        "rule": "min-sum",
        "message": over.json()["violations"][0]["message"],
    }
    assert "exceeds" in over.json()["error"] and "{" not in over.json()["error"]
    duplicate = await api.post("/api/v1/quotas", json=ORG)
    assert duplicate.status_code == 409 and "already exists" in duplicate.json()["error"]
    history = await api.get("/api/v1/quotas/x/history")
    assert history.status_code == 404  # nothing was ever appended for x


async def test_roles_guard_writes(api: httpx.AsyncClient) -> None:
    viewer = api_auth.headers(auth.VIEWER)
    answer = await api.post("/api/v1/quotas", json=ORG, headers=viewer)
    assert answer.status_code == 403 and "role quota-admin needed" in answer.json()["error"]
    nobody = await api.post("/api/v1/quotas", json=ORG, headers={"Authorization": ""})
    assert nobody.status_code == 401
    assert (await api.get("/api/v1/quotas", headers=viewer)).status_code == 200
    assert (await api.post("/api/v1/quotas/check", json={"pods": []}, headers=viewer)).status_code == 422


async def test_concurrent_conflicting_updates_exactly_one_wins(api: httpx.AsyncClient) -> None:
    """Ten admins raise ten different teams' min from 1 to 20 at once; org's min is 30, so Σ min stays within it
    for only one of them. The service serialises the commands and validates each against the tree as it stands:
    exactly one is applied, every other gets the min-sum violation. Two writers holding the same stale
    resourceVersion both get 409."""
    assert (await api.post("/api/v1/quotas", json=ORG)).status_code == 201
    for i in range(10):
        assert (await api.post("/api/v1/quotas", json=team(f"t{i}", "1"))).status_code == 201
    answers = await asyncio.gather(
        *(api.patch(f"/api/v1/quotas/t{i}", json={"spec": {"min": {"cpu": "20"}}}) for i in range(10))
    )
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] + [422] * 9, [a.text for a in answers]
    assert all(a.json()["violations"][0]["rule"] == "min-sum" for a in answers if a.status_code == 422)
    same_version = await asyncio.gather(
        *(
            api.put(
                "/api/v1/quotas/t0",
                json={**team("t0", m), "metadata": {**team("t0", m)["metadata"], "resourceVersion": "999"}},
            )
            for m in ("2", "3")
        )
    )
    assert [a.status_code for a in same_version] == [409, 409]

    async def tree_shows_all() -> bool:
        tree = (await api.get("/api/v1/quota-trees/default")).json()
        return len([q for q in tree.get("quotas", []) if q["name"].startswith("t")]) == 10

    await until(tree_shows_all)
    tree = (await api.get("/api/v1/quota-trees/default")).json()
    org = next(q for q in tree["quotas"] if q["name"] == "org")
    assert sorted(org["children"]) == [f"t{i}" for i in range(10)]
    assert tree["total"]["cpu"] == "40" and tree["problems"] == []


async def test_check_and_what_if(api: httpx.AsyncClient) -> None:
    assert (await api.post("/api/v1/quotas", json=ORG)).status_code == 201
    assert (await api.post("/api/v1/quotas", json=team("a", "15"))).status_code == 201
    assert (await api.post("/api/v1/quotas", json=team("b", "15"))).status_code == 201
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "apps", "labels": {"quota.scheduling.koordinator.sh/name": "a"}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "25"}}}]},
    }
    fits = (await api.post("/api/v1/quotas/check", json=pod)).json()
    assert fits["fits"] is True and fits["verdicts"][0]["quota"] == "a"
    two = (await api.post("/api/v1/quotas/check", json={"kind": "PodList", "items": [pod, pod]})).json()
    assert [v["fits"] for v in two["verdicts"]] == [True, False]
    assert "exceeds runtime 40" in two["verdicts"][1]["reasons"][0]

    what = await api.post(
        "/api/v1/quotas/what-if",
        json={"patch": {"b": {"spec": {"min": {"cpu": "5"}}}}, "pods": [{"pod": pod, "count": 2}]},
    )
    assert what.status_code == 200, what.text
    changes = {c["quota"]: c for c in what.json()["changes"]}
    assert changes["a"]["after"]["request"]["cpu"] == "50" and changes["a"]["delta"]["request"] == {"cpu": 50_000}
    assert changes["b"]["after"]["min"]["cpu"] == "5"
    bad = await api.post("/api/v1/quotas/what-if", json={"frobnicate": []})
    assert bad.status_code == 422 and "unknown keys" in bad.json()["error"]

    async def b_projected() -> bool:
        return (await api.get("/api/v1/quotas/b")).status_code == 200

    await until(b_projected)
    assert (await api.get("/api/v1/quotas/b")).json()["spec"]["min"]["cpu"] == "15"  # the what-if wrote nothing


POD = {"kind": "Pod", "metadata": {"name": "p", "namespace": "apps"}}


@pytest.mark.parametrize(("path", "body"), [("/api/v1/quotas", ORG), ("/api/v1/quotas/check", POD)])
async def test_without_a_quota_service_writes_are_503(path: str, body: dict[str, Any]) -> None:
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(quota_component.routes_over(None, None),),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers=api_auth.headers(auth.QUOTA_ADMIN)
    ) as client:
        answer = await client.post(path, json=body)
        assert answer.status_code == 503 and "without" in answer.json()["error"]


def test_openapi_documents_every_quota_body() -> None:
    context = ApiContext(
        settings=ApiSettings(), registry=new_registry(), components=(quota_component.routes_over(None, None),)
    )
    spec = create_app(context).openapi()
    writes = [
        ("/api/v1/quotas", "post"),
        ("/api/v1/quotas/import", "post"),
        ("/api/v1/quotas/{name}", "put"),
        ("/api/v1/quotas/{name}", "patch"),
        ("/api/v1/quotas/{name}/namespaces", "post"),
        ("/api/v1/quota-profiles", "post"),
        ("/api/v1/quota-profiles/{name}", "put"),
        ("/api/v1/quotas/check", "post"),
        ("/api/v1/quotas/what-if", "post"),
    ]
    for path, method in writes:
        content = spec["paths"][path][method]["requestBody"]["content"]
        assert {"application/json", "application/yaml"} <= set(content), (path, method)
    assert "422" in spec["paths"]["/api/v1/quotas"]["post"]["responses"]


async def test_restart_replays_the_log_and_a_fresh_database_is_rebuilt(
    tmp_path: Path, migrated_engine: AsyncEngine, database_url: str
) -> None:
    """Quotas written through the API survive the quota service's restart (the model is rebuilt from KOORD_QUOTA);
    a second service projecting into a brand-new database rebuilds the history and statuses from the streams."""
    async with quota_stack(tmp_path, migrated_engine) as stack:
        transport = httpx.ASGITransport(app=stack.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=api_auth.headers(auth.QUOTA_ADMIN), timeout=30
        ) as api:
            assert (await api.post("/api/v1/quotas", json=ORG)).status_code == 201
            assert (await api.post("/api/v1/quotas", json=team("a", "10"))).status_code == 201
            assert (await api.patch("/api/v1/quotas/a", json={"spec": {"min": {"cpu": "12"}}})).status_code == 200
            before = stack.service.model.state
            await stack.service.stop()
            restarted = QuotaService(stack.bus, SETTINGS, registry=new_registry(), store=stack.service.store)
            await restarted.start()
            try:
                assert restarted.model.state == before
                stale = await api.patch("/api/v1/quotas/a", json={"spec": {"min": {"cpu": "35"}}})
                assert stale.status_code == 422  # validated against the replayed tree: Σ min above org's 30
                assert (await api.patch("/api/v1/quotas/a", json={"spec": {"min": {"cpu": "13"}}})).status_code == 200
            finally:
                await restarted.stop()
        fresh_engine = db.create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
        await db.run_migrations(f"sqlite:///{tmp_path / 'fresh.db'}")
        try:
            fresh = QuotaStore(fresh_engine)
            rebuilding = QuotaService(
                stack.bus, replace(SETTINGS, instance="fresh"), registry=new_registry(), store=fresh
            )
            await rebuilding.start()
            try:

                async def rebuilt() -> bool:
                    a = await fresh.quota("a")
                    history = await fresh.history("a", limit=10)
                    return a is not None and a.state is not None and a.state.min["cpu"] == 13_000 and len(history) == 3

                await until(rebuilt)
            finally:
                await rebuilding.stop()
        finally:
            await fresh_engine.dispose()


async def test_profiles_in_kubernetes_shape(api: httpx.AsyncClient) -> None:
    profile = {
        "apiVersion": "quota.koordinator.sh/v1alpha1",
        "kind": "ElasticQuotaProfile",
        "metadata": {"name": "gpu", "namespace": "teams"},
        "spec": {"quotaName": "gpu-root", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "resourceRatio": "0.9"},
    }
    created = await api.post("/api/v1/quota-profiles", json=profile)
    assert created.status_code == 201, created.text
    assert crd_errors(crd_validator("quota.koordinator.sh_elasticquotaprofiles.yaml"), created.json()) == []
    again = await api.post("/api/v1/quota-profiles", json=profile)
    assert again.status_code == 409 and "already exists" in again.json()["error"]
    missing = {**profile, "spec": {"nodeSelector": {}}}
    refused = await api.put("/api/v1/quota-profiles/gpu", json=missing)
    assert refused.status_code == 422 and "quotaName" in refused.json()["error"]

    async def listed() -> bool:
        items = (await api.get("/api/v1/quota-profiles")).json()["items"]
        return [p["metadata"]["name"] for p in items] == ["gpu"]

    await until(listed)
    got = (await api.get("/api/v1/quota-profiles/gpu")).json()
    assert got["spec"]["resourceRatio"] == "0.9"
    changed = {**profile, "spec": {**profile["spec"], "resourceRatio": "0.5"}}
    assert (await api.put("/api/v1/quota-profiles/gpu", json=changed)).status_code == 200
    assert (await api.delete("/api/v1/quota-profiles/gpu")).status_code == 200
    assert (await api.delete("/api/v1/quota-profiles/gpu")).status_code == 404
