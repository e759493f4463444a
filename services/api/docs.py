"""The OpenAPI page `/docs`: Swagger UI served by this app from the `swagger-ui-bundle-v2` wheel (the files of
swagger-ui-dist, byte for byte), never from a CDN: the page where users paste their bearer token loads no script or
style from another host. services.api.app mounts it (FastAPI's own /docs and /redoc are off); open like /openapi.json.
Only the three files the page uses are served, from an allow-list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from swagger_ui_bundle import swagger_ui_path

ASSETS_URL: Final = "/docs/assets"
ASSETS: Final = frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"})


def mount(app: FastAPI) -> None:
    directory = Path(str(swagger_ui_path))
    page = get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json",
        title=f"{app.title} - API docs",
        swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
    ).body

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get(f"{ASSETS_URL}/{{name}}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(status_code=404, detail=f"no docs asset {name!r}")
        return FileResponse(directory / name, headers={"Cache-Control": "max-age=86400"})
