"""Schemathesis over the API's own OpenAPI document (issue #19, point 7): every operation, called with generated
parameters and bodies as each role (viewer, quota-admin, admin), answers without a 5xx and as documented (status
codes, content types, response schemas), and refuses schema-invalid data (bodies, parameters, query keys the
operation does not take) with a 4xx. Bounded: a few examples per operation, each sent as every role; one test per
operation and kind of data, so a slow machine stretches many short tests rather than one long one.

The API is the real one over real components, as tests/integration/test_quota_api.py builds it: a nats-server with
koordbus's streams, SQLite migrated to head, the quota service, the event hub and the NodeSLO reader, served by
uvicorn in a thread of its own (schemathesis calls it over HTTP, blocking, from the test's thread). The SSE stream
is left out: it never ends, which is its contract.

Generation is derandomized and was checked to be the same in every process (the same cases, in the same order), so
a failure here is the API's answer, not the draw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from tests.support import api_auth, live_api

EXAMPLES = 20
NEGATIVE_EXAMPLES = 8
"""Schema-invalid requests (wrong types, missing fields, query keys the operation does not take) per operation that
takes a body or parameters: each must be refused with a 4xx."""
ROLES = (auth.VIEWER, auth.QUOTA_ADMIN, auth.ADMIN)
LEFT_OUT = re.compile(r"^/api/v1/events/stream$")
NOT_OUR_CONTRACT = [schemathesis.checks.positive_data_acceptance]
"""A request the schema allows may still be refused (a 400/422 naming why): limits set by the server's settings,
quota rules, names and times checked beyond their JSON type. Every other check runs: no 5xx, documented status
codes, content types, headers and response schemas, refusal of schema-invalid data, authentication enforced."""


def _document() -> dict[str, Any]:
    """The OpenAPI document as the app builds it (it does not depend on the stores behind the routes)."""
    return create_app(
        ApiContext(settings=ApiSettings(), registry=new_registry(), components=live_api.routes_only())
    ).openapi()


def _cases() -> list[Any]:
    cases = []
    for path, item in _document()["paths"].items():
        if LEFT_OUT.match(path):
            continue
        for method, operation in item.items():
            label = f"{method.upper()} {path}"
            cases.append(pytest.param(method.upper(), path, schemathesis.GenerationMode.POSITIVE, id=f"{label} +"))
            if operation.get("parameters") or operation.get("requestBody"):  # else nothing to make invalid
                cases.append(pytest.param(method.upper(), path, schemathesis.GenerationMode.NEGATIVE, id=f"{label} -"))
    return cases


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_api.live_api(tmp_path_factory.mktemp("schemathesis")) as base:
        yield base


@pytest.fixture(scope="module")
def api_schema(live: str) -> Any:
    document = httpx.get(f"{live}/openapi.json", timeout=10).json()
    assert document == json.loads(json.dumps(_document()))  # the operations the tests were drawn from: all of them
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=live)
    return schema


@pytest.mark.parametrize(("method", "path", "mode"), _cases())
def test_the_operation_answers_as_documented_without_a_5xx(
    api_schema: Any, method: str, path: str, mode: schemathesis.GenerationMode
) -> None:
    operation = api_schema[path][method]
    negative = mode is schemathesis.GenerationMode.NEGATIVE

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=NEGATIVE_EXAMPLES if negative else EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    def exercise(case: Any) -> None:
        for role in ROLES:  # the same request as each role: refused or answered, always as documented
            case.call_and_validate(headers=api_auth.headers(role), timeout=20, excluded_checks=NOT_OUR_CONTRACT)

    exercise()
