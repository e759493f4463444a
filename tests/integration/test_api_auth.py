"""Bearer-token authentication of the REST API (services.common.auth) and how `koordbus up` / `koordbus api` get
their tokens: 401/403 as JSON in the API's error shape, the role hierarchy, hashed constant-time comparison,
token file errors with line numbers, the generated admin token of `up` and `api` refusing to start without tokens.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
import pytest_asyncio
from fastapi import Depends
from sqlalchemy.ext.asyncio import AsyncEngine

from koordbus import api as api_command
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from services.nodemetric import component as nodemetric_component
from services.nodemetric.store import NodeMetricStore
from tests.support import api_auth

READ = "/api/v1/nodemetrics"


def make_app(engine: AsyncEngine, tokens: auth.TokenStore | None = None) -> Any:
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        components=(nodemetric_component.reads(NodeMetricStore(engine)),),
        **({} if tokens is None else {"tokens": tokens}),
    )
    app = create_app(context)

    # throwaway write-like routes: what the quota admin API will use
    @app.post("/test/quota")
    async def quota(who: Annotated[auth.Identity, Depends(auth.require(auth.QUOTA_ADMIN))]) -> dict[str, str]:
        return {"name": who.name, "role": who.role}

    @app.post("/test/admin")
    async def admin(who: Annotated[auth.Identity, Depends(auth.require(auth.ADMIN))]) -> dict[str, str]:
        return {"name": who.name, "role": who.role}

    return app


def client_for(app: Any, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers)


@pytest_asyncio.fixture
async def client(migrated_engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(make_app(migrated_engine, api_auth.token_store())) as c:
        yield c


async def test_missing_token_is_a_json_401_asking_for_bearer(client: httpx.AsyncClient) -> None:
    response = await client.get(READ)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert set(response.json()) == {"error"}
    assert "missing bearer token" in response.json()["error"] and "viewer" in response.json()["error"]


@pytest.mark.parametrize("authorization", ["Bearer nope", "Bearer test-admin-tokenX", "Basic dGVzdDp0ZXN0"])
async def test_unknown_token_or_other_scheme_is_a_401(client: httpx.AsyncClient, authorization: str) -> None:
    response = await client.get(READ, headers={"Authorization": authorization})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "bearer token" in response.json()["error"]


@pytest.mark.parametrize("role", auth.ROLES)
async def test_every_role_reads(client: httpx.AsyncClient, role: str) -> None:
    response = await client.get(READ, headers=api_auth.headers(role))
    assert response.status_code == 200, response.text
    assert response.json()["kind"] == "NodeMetricList"


@pytest.mark.parametrize(
    ("role", "path", "status"),
    [
        (auth.VIEWER, "/test/quota", 403),
        (auth.QUOTA_ADMIN, "/test/quota", 200),
        (auth.ADMIN, "/test/quota", 200),
        (auth.VIEWER, "/test/admin", 403),
        (auth.QUOTA_ADMIN, "/test/admin", 403),
        (auth.ADMIN, "/test/admin", 200),
    ],
)
async def test_role_hierarchy(client: httpx.AsyncClient, role: str, path: str, status: int) -> None:
    response = await client.post(path, headers=api_auth.headers(role))
    assert response.status_code == status, response.text
    if status == 200:
        assert response.json() == {"name": f"test-{role}", "role": role}
    else:
        needed = path.rsplit("/", 1)[1].replace("quota", auth.QUOTA_ADMIN)
        assert response.json() == {"error": f"role {needed} needed; test-{role} has role {role}"}


async def test_every_write_allowed_or_refused_is_in_the_audit_log(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="koordbus.audit"):
        await client.post(
            "/test/quota?dryRun=true", headers={**api_auth.headers(auth.QUOTA_ADMIN), "Idempotency-Key": "k1"}
        )
        await client.post("/test/admin", headers=api_auth.headers(auth.VIEWER))
        await client.post("/test/admin")
        await client.get(READ, headers=api_auth.headers(auth.VIEWER))  # a read: not audited
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "koordbus.audit"]
    assert [(r["who"], r["role"], r["path"], r["status"]) for r in records] == [
        ("test-quota-admin", auth.QUOTA_ADMIN, "/test/quota", 200),
        ("test-viewer", auth.VIEWER, "/test/admin", 403),
        ("unknown", "", "/test/admin", 401),
    ]
    assert records[0]["query"] == "dryRun=true" and records[0]["idempotency_key"] == "k1"
    metrics = (await client.get("/metrics")).text
    assert 'koordbus_api_writes_total{method="POST",role="viewer",status="403"} 1.0' in metrics


async def test_health_metrics_and_docs_stay_open(client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        assert (await client.get(path)).status_code == 200, path


async def test_openapi_documents_the_bearer_scheme(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes == {
        "HTTPBearer": {"type": "http", "scheme": "bearer", "description": auth.bearer_scheme.model.description}
    }
    operation = spec["paths"][READ]["get"]
    assert operation["security"] == [{"HTTPBearer": []}]
    assert {"401", "403"} <= set(operation["responses"])
    assert "security" not in spec["paths"]["/healthz"]["get"]


async def test_a_context_without_tokens_accepts_none(migrated_engine: AsyncEngine) -> None:
    async with client_for(make_app(migrated_engine), api_auth.headers()) as c:
        assert (await c.get(READ)).status_code == 401


async def test_disabled_auth_lets_everyone_in(migrated_engine: AsyncEngine) -> None:
    async with client_for(make_app(migrated_engine, auth.TokenStore.disabled())) as c:
        assert (await c.get(READ)).status_code == 200
        assert (await c.post("/test/admin")).json()["role"] == auth.ADMIN


def test_tokens_are_kept_hashed_and_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    store = api_auth.token_store()
    assert not any(token.encode() in repr(vars(store)).encode() for token in api_auth.TOKENS.values())
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    identity = store.lookup(api_auth.TOKENS[auth.VIEWER])
    assert identity == auth.Identity(name="test-viewer", role=auth.VIEWER)
    # every entry is compared, even after the match (no early exit), and only digests are compared
    assert len(calls) == len(store) == 3
    assert all(b == auth.digest(api_auth.TOKENS[auth.VIEWER]) and len(a) == 32 for a, b in calls)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "# tokens\nabc viewer alice\nxyz superuser bob\n",
            "line 3: unknown role 'superuser' (expected one of viewer, quota-admin, admin)",
        ),
        ("abc viewer alice\n\nabc admin bob  # again\n", "line 3: duplicate token (first on line 1)"),
        ("abc\n", "line 1: expected 'token role [name]', got 1 fields"),
        ("abc viewer a b\n", "line 1: expected 'token role [name]', got 4 fields"),
        ("# nothing\n\n", "no tokens"),
    ],
)
def test_token_file_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(auth.TokenFileError) as caught:
        auth.load_token_file(path)
    expected = f"{path}: {message}" if message == "no tokens" else f"{path} {message}"
    assert str(caught.value) == expected


def test_token_file_comments_and_default_names() -> None:
    store = auth.parse_token_file("  # header\nt1 admin   # root\nt2 quota-admin ops\n")
    assert store.lookup("t1") == auth.Identity(name="line 2", role=auth.ADMIN)
    assert store.lookup("t2") == auth.Identity(name="ops", role=auth.QUOTA_ADMIN)
    assert store.lookup("#") is None and store.lookup("root") is None


def test_up_generates_a_private_admin_token_once_and_reuses_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=api_command.__name__)
    first = api_command.api_tokens(ApiSettings(), command="up", data_dir=tmp_path)
    path = tmp_path / api_command.API_TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert len(token) >= 32
    assert first.lookup(token) == auth.Identity(name="koordbus-up", role=auth.ADMIN)
    assert f"written to {path}" in caplog.text and token not in caplog.text
    second = api_command.api_tokens(ApiSettings(), command="up", data_dir=tmp_path)
    assert path.read_text().strip() == token and second.lookup(token) is not None
    assert f"read from {path}" in caplog.text


def test_up_prefers_a_configured_token_file(tmp_path: Path) -> None:
    tokens = api_auth.write_token_file(tmp_path / "tokens")
    store = api_command.api_tokens(ApiSettings(api_tokens_file=str(tokens)), command="up", data_dir=tmp_path)
    assert store.lookup(api_auth.TOKENS[auth.VIEWER]) is not None
    assert not (tmp_path / api_command.API_TOKEN_FILE).exists()


def test_no_auth_is_logged_loudly(caplog: pytest.LogCaptureFixture) -> None:
    store = api_command.api_tokens(ApiSettings(auth_enabled=False), command="api")
    assert not store.enabled
    assert any(r.levelno == logging.WARNING and "AUTHENTICATION IS DISABLED" in r.getMessage() for r in caplog.records)


def _api(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KOORDBUS_")}
    return subprocess.run(
        [sys.executable, "-m", "koordbus.cli", "api", "--nats-url", "nats://127.0.0.1:1",
         "--database-url", "sqlite:///unused.db", "--port", "0", *flags],
        capture_output=True, text=True, timeout=60, env={**base, **(env or {})},
    )  # fmt: skip


def test_api_refuses_to_start_without_tokens() -> None:
    result = _api()
    assert result.returncode != 0
    assert "no API token file" in result.stderr and "--api-tokens-file" in result.stderr
    assert "--no-auth" in result.stderr and "Traceback" not in result.stderr


def test_api_refuses_a_bad_token_file_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("abc viewer\nabc admin\n")
    result = _api(env={"KOORDBUS_API_TOKENS_FILE": str(path)})
    assert result.returncode != 0
    assert f"{path} line 2: duplicate token" in result.stderr and "Traceback" not in result.stderr
