"""``/docs`` (Swagger UI) and ``/redoc`` from assets the service serves itself: no CDN, works offline.

FastAPI's defaults load Swagger UI and ReDoc from a CDN, which leaves a blank page on an
air-gapped cluster. The assets come from the ``fastapi-offline`` package (``[server]`` extra),
read once and served under ``/docs-static/`` with a year of caching.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

STATIC_PREFIX = "/docs-static"
MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png"}


def assets_dir() -> Path:
    """The folder with swagger-ui-bundle.js, swagger-ui.css and redoc.standalone.js; raises naming the fix."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("the fastapi-offline package is not installed; pip install 'hyperwatch[server]'")
    return Path(spec.origin).parent / "static"


def add_local_docs(app: FastAPI) -> None:
    """Mount ``/docs``, ``/redoc`` and their assets on ``app`` (its ``openapi_url`` must be set)."""
    folder = assets_dir()
    files = {p.name: (p.read_bytes(), MEDIA[p.suffix]) for p in folder.iterdir() if p.suffix in MEDIA}
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(f"{STATIC_PREFIX}/{{name}}", include_in_schema=False)
    def docs_asset(name: str) -> Response:
        if name not in files:
            raise HTTPException(404, f"no documentation asset {name!r}")
        body, media = files[name]
        return Response(body, media_type=media, headers={"Cache-Control": "public, max-age=31536000"})

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            swagger_js_url=f"{STATIC_PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_PREFIX}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{STATIC_PREFIX}/redoc.standalone.js",
            redoc_favicon_url=f"{STATIC_PREFIX}/favicon.png",
            with_google_fonts=False,
        )
