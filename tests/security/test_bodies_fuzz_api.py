"""Hypothesis fuzzing of every REST body (issue #19, point 7): whatever body reaches a route that reads one — random
bytes, invalid UTF-8, JSON or YAML of any shape, Kubernetes-shaped objects with hostile values in their fields —
the answer is an error the client can act on (a 4xx with a JSON `error`) or a success, never a 5xx. The whole API
over real components (tests.support.live_api), called over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common import auth
from tests.security.test_bodies_api import ROUTES
from tests.support import api_auth, live_api

HOSTILE = st.sampled_from(
    ["1e400", "9999999999999999999Ei", "-1", "", "\u0000", "ü" * 300, "a" * 5000, "../../etc", "NaN", "1e-400"]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | HOSTILE
)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | HOSTILE, inner, max_size=5),
    max_leaves=30,
)
RESOURCES = st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "kubernetes.io/batch-cpu"]), SCALARS, max_size=3)
META = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=20) | HOSTILE | st.just("team-a"),
        "namespace": st.text(max_size=10) | st.just("teams"),
        "labels": st.dictionaries(st.text(max_size=30) | HOSTILE, SCALARS, max_size=3),
        "annotations": st.dictionaries(st.text(max_size=30) | HOSTILE, SCALARS, max_size=3),
        "resourceVersion": SCALARS,
    },
)
QUOTA = st.fixed_dictionaries(
    {"metadata": META},
    optional={
        "kind": st.sampled_from(["ElasticQuota", "ElasticQuotaProfile", "Pod", "List"]) | st.text(max_size=5),
        "spec": st.fixed_dictionaries({}, optional={"min": RESOURCES, "max": RESOURCES}) | ANY_JSON,
    },
)
POD = st.fixed_dictionaries(
    {"metadata": META},
    optional={
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(
                    st.fixed_dictionaries(
                        {"name": st.text(max_size=5)},
                        optional={"resources": st.fixed_dictionaries({}, optional={"requests": RESOURCES})},
                    ),
                    max_size=2,
                ),
                "priority": SCALARS,
            },
        )
    },
)
DOCUMENTS = (
    ANY_JSON
    | QUOTA
    | POD
    | st.fixed_dictionaries(
        {},
        optional={
            "create": st.lists(QUOTA, max_size=2),
            "update": st.lists(QUOTA, max_size=2) | SCALARS,
            "patch": st.dictionaries(st.text(max_size=8), ANY_JSON, max_size=2),
            "delete": st.lists(SCALARS, max_size=2),
            "pods": st.lists(st.fixed_dictionaries({"pod": POD}, optional={"count": SCALARS}), max_size=2),
            "items": st.lists(QUOTA, max_size=2),
            "attach": st.lists(SCALARS, max_size=2),
            "pod": st.fixed_dictionaries({}, optional={"namespace": SCALARS, "name": SCALARS}),
            "mode": SCALARS,
            "ttl": SCALARS,
        },
    )
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, bytes, str]:
    method, path = draw(st.sampled_from(ROUTES))
    kind = draw(st.sampled_from(["json", "json", "yaml", "bytes", "mutated", "deep"]))
    if kind == "bytes":
        return method, path, draw(st.binary(max_size=300)), draw(st.sampled_from(["application/json", "text/plain"]))
    document = draw(DOCUMENTS)
    raw = msgspec.json.encode(document)
    if kind == "deep":
        depth = draw(st.integers(min_value=50, max_value=5000))
        raw = b'{"metadata": {"name": "x"}, "spec": ' + b"[" * depth + raw + b"]" * depth + b"}"
    if kind == "mutated":  # a byte or two changed: invalid UTF-8 inside strings, broken syntax
        mutated = bytearray(raw)
        for _ in range(draw(st.integers(min_value=1, max_value=2))):
            position = draw(st.integers(min_value=0, max_value=len(mutated) - 1))
            mutated[position] = draw(st.sampled_from([0x80, 0xC3, 0xE9, 0xFF, 0x00, 0x22, 0x5C]))
        raw = bytes(mutated)
    if kind == "yaml":  # JSON is YAML; the YAML reader (and its escapes) reads it
        return method, path, raw.decode().replace('\\"', "'").encode(), "application/yaml"
    return method, path, raw, "application/json"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_api.live_api(tmp_path_factory.mktemp("fuzz")) as url:
        yield url


def test_no_body_makes_a_route_fail(base: str) -> None:
    with httpx.Client(base_url=base, headers=api_auth.headers(auth.ADMIN), timeout=20) as http:

        @given(request=requests())
        @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(request: tuple[str, str, bytes, str]) -> None:
            method, path, raw, content_type = request
            answer = http.request(method, path, content=raw, headers={"Content-Type": content_type})
            assert answer.status_code < 500, (method, path, raw[:300], answer.text)
            if answer.status_code >= 400:
                error: Any = answer.json()["error"]
                assert isinstance(error, str) and error

        fuzz()
