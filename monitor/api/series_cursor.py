"""The cursor of ``GET /runs/{id}/series_index``: where the page before ended, as opaque ASCII text.

A page ends at a series (name, layer); the next one starts after it in (name, layer) order. The
cursor is ``"<layer>:<name>"`` (layer -1: run level; the name may hold any character, the layer none
of ``:``), base64url-encoded so that it travels in a header and a query string unchanged.
"""

from __future__ import annotations

import base64
import binascii

from hyperwatch.hooks.schema import MAX_LAYER, MAX_NAME_LENGTH
from hyperwatch.monitor.api.params import ParameterError, parse_int

_FIX = "send back the X-Next-Cursor header of the page before unchanged, or omit cursor for the first page"


def encode(name: str, layer: int | None) -> str:
    text = f"{-1 if layer is None else layer}:{name}"
    return base64.urlsafe_b64encode(text.encode()).decode("ascii").rstrip("=")


def decode(cursor: str | None) -> tuple[str, int | None] | None:
    """(name, layer) after which the page starts; None for the first page. A 422 naming ``cursor``."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ParameterError(f"cursor: {cursor[:40]!r} is not a series-index cursor; {_FIX}") from None
    layer_text, sep, name = raw.partition(":")
    if not sep or not name or len(name) > MAX_NAME_LENGTH:
        raise ParameterError(f"cursor: {cursor[:40]!r} is not a series-index cursor; {_FIX}")
    try:
        layer = parse_int(layer_text, "cursor", -1, MAX_LAYER)
    except ParameterError:
        raise ParameterError(f"cursor: {cursor[:40]!r} names no layer; {_FIX}") from None
    return name, None if layer == -1 else layer
