"""Robust reads: a stored row the API could not send back is repaired on the way out, and logged.

The API validates every run and group field before it is stored (monitor.api.schemas), so a bad row
can only come from an older version, another writer or a hand edit. One such row must never fail
a list for everyone: each repair here turns a value into one the response models accept, keeps as
much of it as it can, and logs a warning naming the row so an operator can fix it at the source.

- config / thresholds / summary that are not JSON objects read as ``{}``;
- strings with lone surrogates get them escaped (``\\xNN``), NaN/+-Inf floats in a config become
  the wire strings, nesting beyond the limit a short string (:func:`hooks.jsonsafe.sanitize_json`);
- a summary value that is not a number, text, boolean or null reads as its JSON text;
- a scale field (``flops``, ``lr``) that is not a finite positive number reads as unknown (null),
  so fits over a group skip that run instead of failing for the whole group;
- a threshold that is not a finite number is dropped (the detector default applies).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from hyperwatch.hooks.jsonsafe import check_json, escape_surrogates, sanitize_json
from hyperwatch.hooks.schema import SchemaError

log = logging.getLogger(__name__)
POSITIVE_SCALE_FIELDS = ("flops", "lr")


def json_object(value: Any, what: str) -> dict[str, Any]:
    """A stored config (or thresholds) as a JSON-safe object."""
    if not isinstance(value, dict):
        log.warning("%s is %s, not an object; read as {} (fix the row)", what, type(value).__name__)
        return {}
    try:
        checked: dict[str, Any] = check_json(value, what)
        return checked
    except SchemaError as exc:
        log.warning("%s cannot be sent as JSON (%s); read repaired (fix the row)", what, exc)
        repaired: dict[str, Any] = sanitize_json(value)
        return repaired


def summary(value: Any, what: str) -> dict[str, Any]:
    """A stored summary (non-finite values already decoded to floats) with only scalar values."""
    if not isinstance(value, dict):
        log.warning("%s is %s, not an object; read as {} (fix the row)", what, type(value).__name__)
        return {}
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, str):
            item = escape_surrogates(item)
        elif not (item is None or isinstance(item, (bool, int, float))):
            log.warning("%s[%r] is %s, not a scalar; read as its JSON text", what, key, type(item).__name__)
            item = json.dumps(sanitize_json(item))
        out[escape_surrogates(str(key))] = item
    return out


def text(value: Any, what: str, default: str | None = None) -> str | None:
    if value is None:
        if default is not None:
            log.warning("%s is null; read as %r (fix the row)", what, default)
        return default
    if not isinstance(value, str):
        return str(value)
    return escape_surrogates(value)


def positive_scale(value: Any, what: str) -> float | None:
    """A stored flops or lr: a finite positive float, or None (unknown) for anything else."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        log.warning("%s is %r, not a finite positive number; read as unknown (fix the row)", what, value)
        return None
    return number


def thresholds(value: Any, what: str) -> dict[str, Any]:
    """A group's stored thresholds with only finite numbers (a bad one falls back to the default)."""
    out = json_object(value, what)
    good: dict[str, Any] = {}
    for key, item in out.items():
        if isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item):
            good[key] = item
        else:
            log.warning("%s[%r] = %r is not a finite number; dropped (the default applies)", what, key, item)
    return good


def learn_setting(value: Any, what: str) -> bool | None:
    """A group's ``learn_thresholds``: a boolean, or None (the default) for anything else."""
    if value is None or isinstance(value, bool):
        return value
    log.warning("%s is %r, not a boolean; read as unset (the default applies)", what, value)
    return None


def learned(value: Any, what: str) -> dict[str, Any] | None:
    """What a group learned (a JSON object), or None (not read yet: the defaults apply)."""
    if value is None or isinstance(value, dict):
        return value
    log.warning("%s is %r, not an object; read as not learned yet", what, value)
    return None
