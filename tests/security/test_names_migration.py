"""Issue #19, names at the migration API (real nats-server, the migration service running): a job name, pod
namespace or pod name Kubernetes would refuse is a 422 naming the field and no job is requested; filters and paths
are checked the same way."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.test_migration_api import api, app
from tests.support.waiting import eventually

__all__ = ["api", "app"]  # the fixtures, shared with the migration API's own tests


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pod": {"namespace": "a.b", "name": "web-0"}}, "spec.podRef.namespace"),
        ({"pod": {"namespace": "default", "name": "w" * 300}}, "spec.podRef.name"),
        ({"pod": {"namespace": "default", "name": "web/0"}}, "spec.podRef.name"),
        ({"name": "a/b", "pod": {"namespace": "default", "name": "web-0"}}, "metadata.name"),
        ({"name": "j" * 5000, "pod": {"namespace": "default", "name": "web-0"}}, "metadata.name"),
    ],
)
async def test_a_migration_naming_what_kubernetes_refuses_is_a_422_and_nothing_is_requested(
    api: httpx.AsyncClient, body: dict[str, object], field: str
) -> None:
    refused = await api.post("/api/v1/migrations", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith(f"invalid {field} ")
    good = {"name": "ok", "pod": {"namespace": "default", "name": "web-0"}}
    accepted = await api.post("/api/v1/migrations", json=good)
    assert accepted.status_code == 202, accepted.text

    async def only_the_good_one() -> bool:
        items = (await api.get("/api/v1/migrations")).json()["items"]
        return [i["name"] for i in items] == ["ok"]

    await eventually(only_the_good_one)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/migrations?node=" + "n" * 5000),
        ("GET", "/api/v1/migrations?namespace=Default"),
        ("GET", "/api/v1/migrations?workload=a/b"),
        ("GET", "/api/v1/migrations/" + "j" * 300),
        ("POST", "/api/v1/migrations/" + "j" * 300 + "/abort"),
    ],
)
async def test_migration_filters_and_paths_are_checked(api: httpx.AsyncClient, method: str, path: str) -> None:
    answer = await api.request(method, path)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("invalid ")
