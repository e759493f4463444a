"""Issue #19, names in quota commands, through the REST API to the quota service on a real nats-server: a quota or
profile whose name, namespace or label value Kubernetes would refuse is a 422 naming the field, and nothing is
appended to the quota log. Before, `a/b`, `..`, NUL, unicode and 300-character names were created (201; `a/b` could
then be neither read nor deleted), and a 100,000-character name or a 5,000-character tree-id label was appended to
the log and then killed the service's bus connection (its status subject was longer than the control line)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from bus import streams
from schemas import quota
from services.common import auth, db
from tests.support import api_auth
from tests.support.quota_stack import QuotaStack, quota_stack

TREE_ID = quota.LABEL_TREE_ID
PARENT = quota.LABEL_PARENT


def elastic_quota(name: str, *, namespace: str = "teams", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": quota.API_VERSION,
        "kind": quota.KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"min": {"cpu": "1", "memory": "1Gi"}, "max": {"cpu": "2", "memory": "2Gi"}},
    }


@pytest_asyncio.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[QuotaStack, httpx.AsyncClient]]:
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    try:
        async with quota_stack(tmp_path, engine) as running:
            transport = httpx.ASGITransport(app=running.app, raise_app_exceptions=False)
            headers = api_auth.headers(auth.QUOTA_ADMIN)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://api/api/v1", headers=headers, timeout=30
            ) as client:
                yield running, client
    finally:
        await engine.dispose()


async def log_length(running: QuotaStack) -> int:
    _, last = await running.bus.stream_info(streams.KOORD_QUOTA)
    return last


BAD_QUOTAS = {
    "100k name": (elastic_quota("q" * 100_000), "metadata.name"),
    "slash": (elastic_quota("a/b"), "metadata.name"),
    "dot-dot": (elastic_quota(".."), "metadata.name"),
    "NUL": (elastic_quota("a\x00b"), "metadata.name"),
    "unicode": (elastic_quota("caf\u00e9"), "metadata.name"),
    "300 characters": (elastic_quota("q" * 300), "metadata.name"),
    "5000-char tree-id": (elastic_quota("tree-root", labels={TREE_ID: "t" * 5000}), f"metadata.labels[{TREE_ID}]"),
    "tree-id with a slash": (elastic_quota("tree-root", labels={TREE_ID: "a/b"}), f"metadata.labels[{TREE_ID}]"),
    "5000-char parent": (elastic_quota("child", labels={PARENT: "p" * 5000}), f"metadata.labels[{PARENT}]"),
    "namespace with a dot": (elastic_quota("team-x", namespace="a.b"), "metadata.namespace"),
}


@pytest.mark.parametrize("case", list(BAD_QUOTAS))
async def test_a_quota_kubernetes_would_refuse_is_a_422_and_never_reaches_the_log(
    stack: tuple[QuotaStack, httpx.AsyncClient], case: str
) -> None:
    running, client = stack
    body, field = BAD_QUOTAS[case]
    before = await log_length(running)
    answer = await client.post("/quotas", json=body)
    assert answer.status_code == 422, answer.text
    (violation,) = answer.json()["violations"]
    assert violation["field"] == field and violation["rule"] == "name-format"
    assert len(answer.text) < 2000  # the name is quoted shortened, never echoed whole
    assert await log_length(running) == before
    # the service and its bus connection carry on: a good quota is created and appended
    created = await client.post("/quotas", json=elastic_quota("team-ok"))
    assert created.status_code == 201, created.text
    assert await log_length(running) == before + 1


async def test_names_in_imports_profiles_and_namespace_lists_are_checked_too(
    stack: tuple[QuotaStack, httpx.AsyncClient],
) -> None:
    running, client = stack
    before = await log_length(running)
    imported = await client.post("/quotas/import", json={"items": [elastic_quota("fine"), elastic_quota("a/b")]})
    assert imported.status_code == 422, imported.text
    assert [v["field"] for v in imported.json()["violations"]] == ["metadata.name"]
    profile = {
        "apiVersion": "quota.koordinator.sh/v1alpha1",
        "kind": "ElasticQuotaProfile",
        "metadata": {"name": "gpu-pool", "namespace": "teams"},
        "spec": {"quotaName": "gpu-root", "nodeSelector": {}, "quotaLabels": {TREE_ID: "t" * 5000}},
    }
    refused = await client.post("/quota-profiles", json=profile)
    assert refused.status_code == 422, refused.text
    assert refused.json()["violations"][0]["field"] == f"spec.quotaLabels[{TREE_ID}]"
    created = await client.post("/quotas", json=elastic_quota("team-ns"))
    assert created.status_code == 201, created.text
    attach = await client.post("/quotas/team-ns/namespaces", json={"attach": ["Not_A_Namespace"]})
    assert attach.status_code == 422, attach.text
    assert attach.json()["violations"][0]["rule"] == "name-format"
    assert await log_length(running) == before + 1  # only team-ns


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/quotas/" + "q" * 300),
        ("GET", "/quotas/Team_A/history"),
        ("DELETE", "/quotas/" + "q" * 5000),
        ("PATCH", "/quotas/caf\u00e9"),
        ("GET", "/quota-trees/" + "t" * 5000),
        ("GET", "/quotas?tree=" + "t" * 5000),
        ("DELETE", "/quota-profiles/a..b"),
    ],
)
async def test_a_name_in_the_path_or_query_is_checked_before_anything_is_asked(
    stack: tuple[QuotaStack, httpx.AsyncClient], method: str, path: str
) -> None:
    running, client = stack
    before = await log_length(running)
    answer = await client.request(method, path, json={} if method == "PATCH" else None)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("invalid ")
    assert await log_length(running) == before
