"""Issue #19 point 6: `/docs`, the page where users paste their bearer token, loads Swagger UI from this app (the
files of the swagger-ui-bundle-v2 wheel) and names no other host; the assets it names are served, open like the page,
and nothing else from the bundle's directory is."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio

from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common.metrics import new_registry
from tests.support import api_auth


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    context = ApiContext(settings=ApiSettings(), registry=new_registry(), tokens=api_auth.token_store())
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        yield http


async def test_the_docs_page_names_no_other_host_and_its_assets_are_served(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assert re.findall(r"(?:https?:)?//[\w.-]+", page.text) == []  # no absolute or scheme-relative URL at all
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text) + re.findall(r"url: *'([^']+)'", page.text)
    assert sorted(urls) == [
        "/docs/assets/favicon-32x32.png",
        "/docs/assets/swagger-ui-bundle.js",
        "/docs/assets/swagger-ui.css",
        "/openapi.json",
    ]
    for url in urls:
        response = await client.get(url)  # no token: open like the page
        assert response.status_code == 200 and response.content, url
    script = await client.get("/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in script.headers["content-type"] and b"SwaggerUIBundle" in script.content
    assert (await client.get("/openapi.json")).json()["openapi"].startswith("3.")  # what Swagger UI 5 renders
    for other in ("index.html", "swagger-initializer.js", "..%2F__init__.py", "swagger-ui-bundle.js.map"):
        assert (await client.get(f"/docs/assets/{other}")).status_code == 404, other
    assert (await client.get("/redoc")).status_code == 404  # FastAPI's ReDoc page loads from a CDN: off
