"""The dashboards: pages under ``/``, their JSON under ``/ui/data``, static files under ``/ui/static``.

``router`` is what ``hyperwatch.app.create_app`` mounts. plotly.js comes from the installed plotly
package (``plotly/package_data/plotly.min.js``): no CDN, works offline. Static URLs carry a hash
of the file's content, so they are served with a year of ``immutable`` caching and a change of
version is a new URL; gzip is sent when the browser accepts it.

Pages hold no data: reads go through the JSON endpoints, which need the read token when one is
configured (the browser keeps it in sessionStorage after asking once; see static/common.js).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.web import compare, data, forecast, pages

STATIC_DIR = Path(__file__).parent / "static"
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
"""'unsafe-eval': plotly's WebGL traces compile their shaders with Function; no inline script is allowed."""
IMMUTABLE = "public, max-age=31536000, immutable"


def plotly_js_path() -> Path:
    """plotly.min.js of the installed plotly package; raises naming the fix when it is missing."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise RuntimeError("the plotly package is not installed; pip install plotly (it serves plotly.min.js)")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing; reinstall plotly (pip install --force-reinstall plotly)")
    return path


@dataclass
class Asset:
    body: bytes
    media_type: str
    digest: str
    _gz: bytes | None = field(default=None, repr=False)

    def gzipped(self) -> bytes:
        if self._gz is None:
            self._gz = gzip.compress(self.body, compresslevel=6, mtime=0)
        return self._gz


class Assets:
    """Static files read once, addressed by name with a content hash in the URL."""

    TYPES: ClassVar[dict[str, str]] = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

    def __init__(self) -> None:
        self.files: dict[str, Asset] = {}
        self.urls: dict[str, str] = {}
        for path in sorted(STATIC_DIR.iterdir()):
            if path.suffix in self.TYPES:
                self._add(path.name, path)
        self._add("plotly", plotly_js_path(), "plotly.min.js")

    def _add(self, key: str, path: Path, name: str | None = None) -> None:
        body = path.read_bytes()
        digest = hashlib.sha256(body).hexdigest()[:16]
        name = name or path.name
        self.files[name] = Asset(body, self.TYPES[path.suffix], digest)
        self.urls[key] = f"/ui/static/{digest}/{name}"


_assets: Assets | None = None


def assets() -> Assets:
    global _assets
    if _assets is None:
        _assets = Assets()
    return _assets


router = APIRouter(include_in_schema=False)
router.include_router(data.router)
router.include_router(compare.router)
router.include_router(forecast.router)


def _html(text: str) -> Response:
    return Response(
        text,
        media_type="text/html; charset=utf-8",
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-cache",
        },
    )


@router.get("/ui/static/{digest}/{name}")
def static_file(digest: str, name: str, request: Request) -> Response:
    asset = assets().files.get(name)
    if asset is None:
        raise NotFoundError(f"static file {name!r} does not exist; the pages link to the files they need")
    headers = {"ETag": f'"{asset.digest}"', "X-Content-Type-Options": "nosniff"}
    headers["Cache-Control"] = IMMUTABLE if digest == asset.digest else "no-cache"
    if request.headers.get("if-none-match") == headers["ETag"]:
        return Response(status_code=304, headers=headers)
    headers["Vary"] = "Accept-Encoding"
    if "gzip" in request.headers.get("accept-encoding", "") and len(asset.body) > 1024:
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped(), media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/runs", status_code=307)


@router.get("/runs")
def runs_page() -> Response:
    return _html(pages.runs_page(assets().urls))


@router.get("/runs/{run_id}")
def run_page(run_id: int) -> Response:
    return _html(pages.run_page(assets().urls, run_id))


@router.get("/compare")
def compare_page() -> Response:
    return _html(pages.compare_page(assets().urls))


@router.get("/groups/{group_id}")
def group_page(group_id: int) -> Response:
    return _html(pages.group_page(assets().urls, group_id))


@router.get("/groups/{group_id}/sweeps")
def sweeps_page(group_id: int) -> Response:
    return _html(pages.sweeps_page(assets().urls, group_id))


@router.get("/alerts")
def alerts_page() -> Response:
    return _html(pages.alerts_page(assets().urls))
