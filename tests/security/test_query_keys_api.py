"""Every operation of the API refuses a query key it does not take with a 400 naming the key (services.api.query_keys),
and a key that takes one value given twice; the keys it does take still work, and a caller without a token is told
that first (401). The whole API over real
components (tests.support.live_api), called over HTTP, for every operation of its OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from services.common import auth
from tests.security.test_schemathesis_api import LEFT_OUT, _document
from tests.support import api_auth, live_api

PATH_VALUE = "n1"
"""Every path parameter (a node, quota, tree, profile or migration name) takes a valid name."""


def _operations() -> list[tuple[str, str]]:
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", PATH_VALUE, path))
        for path, item in _document()["paths"].items()
        for method in item
    ]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with live_api.live_api(tmp_path_factory.mktemp("query-keys")) as base, httpx.Client(base_url=base) as client:
        yield client


@pytest.mark.parametrize(("method", "path"), _operations())
def test_an_unknown_query_key_is_a_400_naming_it(client: httpx.Client, method: str, path: str) -> None:
    answer = client.request(method, path, params={"no-such-key": "1"}, headers=api_auth.headers(auth.ADMIN), timeout=20)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith("unknown query parameter(s) 'no-such-key'; ")


def test_the_keys_a_route_takes_still_work(client: httpx.Client) -> None:
    headers = api_auth.headers(auth.VIEWER)
    assert client.get("/api/v1/events", params={"limit": "1", "type": "quota.event"}, headers=headers).is_success
    assert client.get("/api/v1/quotas", params={"tree": "t1"}, headers=headers).is_success
    assert client.get("/api/v1/nodes/n1/actuations", params={"limit": "1", "since": "0"}, headers=headers).is_success
    assert client.get("/healthz").is_success


def test_a_refusal_names_the_unknown_keys_and_the_known_ones(client: httpx.Client) -> None:
    answer = client.get("/api/v1/events", params={"nod": "n1"}, headers=api_auth.headers(auth.VIEWER))
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        "unknown query parameter(s) 'nod'; known: cursor, limit, namespace, node, quota, since, tree, type, workload"
    )
    assert client.get("/readyz", params={"x": ""}).json()["error"] == (
        "unknown query parameter(s) 'x'; this route takes none"
    )


def test_a_key_that_takes_one_value_given_twice_is_a_400_and_a_list_key_may_repeat(client: httpx.Client) -> None:
    # found by schemathesis: `parents=ù&…&parents=false` was read as its last value, false, and answered 200
    answer = client.post(
        "/api/v1/quotas/check?parents=%C3%B9&parents=false", content=b"pods: []", headers=api_auth.headers(auth.ADMIN)
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "query parameter 'parents' is given 2 times; it takes one value"
    types = [("type", "quota.event"), ("type", "quota.status")]
    assert client.get("/api/v1/events", params=types, headers=api_auth.headers(auth.VIEWER)).is_success


def test_without_a_token_the_answer_is_401_whatever_the_keys(client: httpx.Client) -> None:
    assert client.get("/api/v1/quotas", params={"no-such-key": "1"}).status_code == 401


def test_operations_cover_the_event_stream() -> None:
    """The SSE stream, left out of schemathesis (it never ends), is refused here before it starts."""
    assert ("GET", "/api/v1/events/stream") in _operations()
    assert LEFT_OUT.match("/api/v1/events/stream")
