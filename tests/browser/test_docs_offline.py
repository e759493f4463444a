"""`/docs` in a real browser with every request to another host blocked: Swagger UI, served by koordbus itself
(services.api.docs), renders the API's operations and asks no other host for anything (issue #19 point 6)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tests.browser.conftest import Koordbus, open_tab


def test_the_docs_render_from_koordbus_alone(browser: Any, koordbus_up: Koordbus) -> None:
    tab = open_tab(browser, token=None)
    elsewhere: list[str] = []
    own_host = urlsplit(koordbus_up.base).netloc

    def route(request_route: Any) -> None:
        if urlsplit(request_route.request.url).netloc == own_host:
            request_route.continue_()
        else:
            elsewhere.append(request_route.request.url)
            request_route.abort()

    try:
        tab.page.route("**/*", route)
        tab.page.goto(koordbus_up.base + "/docs")
        tab.page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=20_000)
        paths = tab.page.locator(".swagger-ui .opblock-summary-path").all_inner_texts()
        assert any("/api/v1/nodemetrics" in path for path in paths), paths
        assert tab.page.locator(".swagger-ui .btn.authorize").count() == 1  # where the token is pasted
        tab.screenshot("docs")
        assert elsewhere == []
        assert tab.errors == []
    finally:
        tab.page.context.close()
