"""A minimal JSON-over-HTTP client on the standard library (urllib), for the sink and upload.

Status codes decide what happens next (:func:`classify`): 2xx delivered; 404 the run is unknown
(create it again); 408/425/429/5xx and connection errors are retried with backoff, honouring
``Retry-After``; 401/403 is a token problem (retried slowly: nothing is dropped); any other 4xx
means the service refused the content, which no retry can fix.
"""

from __future__ import annotations

import email.utils
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from hyperwatch.hooks.schema import Batch

DELIVERED, UNKNOWN_RUN, RETRY, AUTH, REFUSED = "delivered", "unknown_run", "retry", "auth", "refused"


@dataclass
class Response:
    status: int  # 0 when no HTTP answer came back (connection refused, timeout, reset)
    body: Any
    retry_after: float | None = None
    error: str = ""


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


def request(
    method: str,
    url: str,
    body: Any = None,
    token: str | None = None,
    timeout: float = 10.0,
    idempotency_key: str | None = None,
    content_type: str = "application/json",
) -> Response:
    """One HTTP request with a JSON body (or ``body`` as bytes of ``content_type``); never raises for
    network or HTTP errors."""
    if isinstance(body, bytes):
        data: bytes | None = body
    else:
        data = None if body is None else json.dumps(body, allow_nan=False).encode("utf-8")
        content_type = "application/json"
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = content_type
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, _json(resp.read()))
    except urllib.error.HTTPError as exc:
        payload = _json(exc.read())
        return Response(exc.code, payload, _retry_after(exc.headers.get("Retry-After")), str(payload))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Response(0, None, None, f"{type(exc).__name__}: {exc}")


def _json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw[:500].decode("utf-8", "replace")


def classify(resp: Response) -> str:
    s = resp.status
    if 200 <= s < 300:
        return DELIVERED
    if s == 404:
        return UNKNOWN_RUN
    if s in (401, 403):
        return AUTH
    if s == 0 or s in (408, 425, 429) or s >= 500:
        return RETRY
    return REFUSED


def api(base: str, path: str) -> str:
    return base.rstrip("/") + path


def points_path(project: str | None) -> str:
    """The points route for a run of ``project``: a batch names its run, the query names the project."""
    if not project or project == "default":
        return "/api/v1/points"
    return "/api/v1/points?" + urllib.parse.urlencode({"project": project})


def post_points(
    base: str, batch: Batch, token: str | None, timeout: float, columns: bool, project: str | None = None
) -> tuple[Response, bool]:
    """POST a batch as the columns body (:mod:`hooks.columns`) when ``columns``, else as JSON.

    Returns the answer and whether to keep sending columns. A service that does not read them (an
    older one answers 422, another 415) gets the same batch under the same key as JSON at once, and
    JSON from then on once that is delivered; a batch refused in both forms is the batch's fault
    (the answer is the JSON one) and changes nothing.
    """
    url = api(base, points_path(project))
    if columns:
        from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE, PointColumns, encode_body  # numpy, when sent

        raw = encode_body(batch.batch_id, batch.run, PointColumns.from_points(batch.points))
        resp = request("POST", url, raw, token, timeout, batch.batch_id, content_type=COLUMNS_MEDIA_TYPE)
        if resp.status not in (415, 422):
            return resp, True
        again = request("POST", url, batch.to_json(), token, timeout, batch.batch_id)
        return again, classify(again) != DELIVERED
    return request("POST", url, batch.to_json(), token, timeout, batch.batch_id), False
