"""Value types of run and group fields: not-null, JSON-safe config, summary values, one-line labels.

Split from :mod:`monitor.api.schemas` (which declares the models): each type here validates a value on
the way in so that the same model reads it back and sends it as UTF-8 JSON (issue 14). Explicit
``null`` in a field stored NOT NULL is refused with what to send instead; leaving the field out
(default :data:`KEEP`) keeps the stored value.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

from hyperwatch.hooks.jsonsafe import check_json, escape_surrogates
from hyperwatch.hooks.schema import WIRE_TO_NONFINITE, SchemaError, encode_value

MAX_INT64 = 2**63 - 1
KEEP: Any = None
"""Default of a NOT NULL field in a create/update: left out, it keeps the stored value (never stored as null)."""
MAX_SUMMARY_KEYS = 1000


def not_null(hint: str) -> Any:
    def check(value: Any) -> Any:
        if value is None:
            raise ValueError(f"must not be null; {hint}, or leave the field out to keep the stored value")
        return value

    return BeforeValidator(check)


def json_object(field: str) -> Any:
    def check(value: Any) -> Any:
        if value is None:
            raise ValueError("must be an object, not null; send {} to clear it, or leave the field out to keep it")
        if not isinstance(value, dict):
            raise ValueError(f"must be a JSON object, got {type(value).__name__}")
        try:
            return check_json(value, field)
        except SchemaError as exc:
            raise ValueError(str(exc)) from exc

    return BeforeValidator(check)


def _plain_text(value: Any) -> Any:
    """Text stored in a column: no NUL (PostgreSQL text cannot hold it) and no lone surrogate (not UTF-8)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("contains a NUL character (\\x00), which cannot be stored; remove it")
        if escape_surrogates(value) != value:
            raise ValueError("contains a lone surrogate (not valid UTF-8); send UTF-8 text")
    return value


def _label(value: Any) -> Any:
    """A short name (optimizer, parameterization): printable, one line."""
    value = _plain_text(value)
    if isinstance(value, str) and (not value.isprintable() or not value.strip()):
        raise ValueError(f"must be printable text on one line (no control characters), got {value!r}")
    return value


def _summary_value(value: Any) -> Any:
    """A summary value: a number (non-finite as its wire string), text, a boolean or null.

    An integer too large for a float is stored as +/-Infinity, exactly as the JSON number ``1e400``
    already is (Python's parser reads it as inf): one rule for any number beyond the float range.
    """
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
        return value
    if isinstance(value, str):
        if value in WIRE_TO_NONFINITE:
            return WIRE_TO_NONFINITE[value]
        return _plain_text(value)
    raise ValueError(f"must be a number, a string, a boolean or null; got {type(value).__name__}")


def _summary(value: Any) -> Any:
    if value is None:
        raise ValueError("must be an object, not null; send {} to change nothing, or leave the field out")
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object of name -> value, got {type(value).__name__}")
    if len(value) > MAX_SUMMARY_KEYS:
        raise ValueError(f"has {len(value)} entries; the limit is {MAX_SUMMARY_KEYS}")
    for key in value:
        if isinstance(key, str):
            _plain_text(key)
    return value


def _summary_out(value: Any) -> Any:
    if isinstance(value, float):
        return encode_value(value)
    return value


SummaryValue = Annotated[
    bool | int | float | str | None,
    BeforeValidator(_summary_value),
    PlainSerializer(_summary_out, return_type=Any, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [{"type": "number"}, {"type": "string"}, {"type": "boolean"}, {"type": "null"}],
            "description": "a number (NaN, Infinity, -Infinity as those strings), text, a boolean or null",
        }
    ),
]
Summary = Annotated[dict[str, SummaryValue], BeforeValidator(_summary)]
Label = Annotated[str, BeforeValidator(_label), Field(min_length=1, max_length=64)]
Text = Annotated[str, BeforeValidator(_plain_text)]
