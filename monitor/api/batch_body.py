"""The ingest route's body: raw bytes -> a :class:`ParsedBatch` of numpy columns (issue 16).

Two paths, one answer:

- **fast**: msgspec decodes the JSON straight into typed structs (types, ranges, required and
  unknown fields checked in C), the few distinct names and the run name are checked once each,
  and the fields become numpy columns (:class:`hooks.columns.PointColumns`). It accepts only what
  :class:`monitor.api.schemas.BatchIn` accepts, with the same values; anything else (an error, or a
  legal but unusual body: a step written ``12.0``, a bare ``NaN``, an integer beyond the double
  range) returns None.
- **exact**: ``json.loads`` and :class:`BatchIn`, as FastAPI itself would read a declared body, so
  every refusal keeps its status and message: a 422 naming each bad field as
  ``body.points.<index>.<field>`` with the fix, 422 ``JSON decode error``, 400 for a body that is
  not UTF-8 or is nested too deep.

A binary form (``Content-Type: application/vnd.hyperwatch.columns``, :mod:`hooks.columns`) is
already columns: it is only checked, with the same rules. The route reads the body itself
(FastAPI's own reading costs a ``json.loads`` into one dict per point and a validation of each);
:data:`REQUEST_BODY` keeps the OpenAPI description of it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from email.message import Message
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE, NULL_INT, PointColumns, decode_body
from hyperwatch.hooks.schema import (
    MAX_LAYER,
    MAX_POINTS_PER_BATCH,
    MAX_STEP,
    SchemaError,
    validate_name,
    validate_run_name,
)
from hyperwatch.monitor.api.schemas import BatchIn

JSON_MEDIA_TYPE = "application/json"
# FastAPI's words for a body json.loads could not take; the app's error handler words it for us.
FASTAPI_PARSE_ERROR = "There was an error parsing the body"


@dataclass(frozen=True)
class ParsedBatch:
    """A valid ingestion body: what :class:`BatchIn` accepts, its points as columns."""

    batch_id: str
    run: str
    points: PointColumns


class _Point(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str
    step: Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
    value: float | Literal["NaN", "Infinity", "-Infinity"]
    layer: Annotated[int, msgspec.Meta(ge=0, le=MAX_LAYER)] | None = None
    tokens: Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)] | None = None


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    batch_id: str
    run: str
    points: Annotated[list[_Point], msgspec.Meta(max_length=MAX_POINTS_PER_BATCH)]


_DECODER = msgspec.json.Decoder(_Batch)
_BATCH_IN = TypeAdapter(BatchIn)
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")  # fullmatch: BatchIn's anchored pattern
_GOOD_NAMES: set[str] = set()  # names validate_name accepted (a pure function of the name)
_GOOD_MAX = 4096


def _accepted(check: Any, name: str) -> bool:
    if name in _GOOD_NAMES:
        return True
    try:
        check(name)
    except SchemaError:
        return False
    if len(_GOOD_NAMES) < _GOOD_MAX:
        _GOOD_NAMES.add(name)
    return True


def _nullable(column: list[int | None]) -> np.ndarray:
    if None in column:
        column = [NULL_INT if v is None else v for v in column]
    return np.array(column, dtype=np.int64)


def fast_batch(body: bytes) -> ParsedBatch | None:
    """The batch when msgspec reads it as canonical wire JSON and every name is valid, else None."""
    try:
        batch = _DECODER.decode(body)
    except (msgspec.MsgspecError, ValueError, RecursionError):  # ValueError: bytes that are not UTF-8
        return None
    if _BATCH_ID.fullmatch(batch.batch_id) is None or not _accepted(validate_run_name, batch.run):
        return None
    pts = batch.points
    names = [p.name for p in pts]
    distinct = tuple(dict.fromkeys(names))
    if not all(_accepted(validate_name, n) for n in distinct):
        return None
    code = {n: i for i, n in enumerate(distinct)}
    columns = PointColumns(
        distinct,
        np.fromiter(map(code.__getitem__, names), np.int32, len(names)),
        np.array([p.step for p in pts], dtype=np.int64),
        # floats, and the three wire strings, which float() reads as NaN, +Inf and -Inf
        np.array([p.value for p in pts], dtype=np.float64),
        _nullable([p.layer for p in pts]),
        _nullable([p.tokens for p in pts]),
    )
    return ParsedBatch(batch.batch_id, batch.run, columns)


def exact_batch(body: bytes) -> ParsedBatch:
    """The body read as FastAPI reads a declared JSON body and validated by :class:`BatchIn`."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}]) from exc
    except Exception as exc:  # not UTF-8, nested too deep for the parser
        raise HTTPException(400, FASTAPI_PARSE_ERROR) from exc
    try:
        batch = _BATCH_IN.validate_python(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from exc
    points = batch.points
    columns = PointColumns.build(
        [p.name for p in points],
        [p.step for p in points],
        [p.value for p in points],
        [p.layer for p in points],
        [p.tokens for p in points],
    )
    return ParsedBatch(batch.batch_id, batch.run, columns)


def media_type(content_type: str | None) -> str:
    """``application/json; charset=utf-8`` -> ``application/json`` ('' when absent)."""
    if not content_type:
        return ""
    message = Message()
    message["content-type"] = content_type
    return message.get_content_type()


def is_json(kind: str) -> bool:
    main, _, sub = kind.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


def columns_batch(body: bytes) -> ParsedBatch:
    """A :data:`COLUMNS_MEDIA_TYPE` body (:func:`hooks.columns.decode_body`); a 422 names the bad field."""
    try:
        batch_id, run, columns = decode_body(body)
    except SchemaError as exc:
        loc = ("body", *(int(p) if p.isdigit() else p for p in exc.field.split(".")))
        msg = str(exc).split(": ", 1)[-1]
        raise RequestValidationError([{"type": "value_error", "loc": loc, "msg": msg, "input": None}]) from exc
    return ParsedBatch(batch_id, run, columns)


def read_batch(body: bytes, content_type: str | None) -> ParsedBatch:
    """An ingestion body, validated; raises the API's 4xx (naming the field and the fix) otherwise."""
    kind = media_type(content_type)
    if kind == COLUMNS_MEDIA_TYPE:
        return columns_batch(body)
    if not is_json(kind):
        raise HTTPException(
            415,
            f"Content-Type {kind or '(none)'!r} is not accepted for POST /api/v1/points: send the batch as "
            f"JSON with 'Content-Type: {JSON_MEDIA_TYPE}' (or as {COLUMNS_MEDIA_TYPE}, see hooks.columns)",
        )
    if not body:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    return fast_batch(body) or exact_batch(body)


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """A JSON schema with its local ``#/$defs/..`` references replaced by what they name."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return {**_inline(defs[ref.removeprefix("#/$defs/")], defs), **_inline(rest, defs)}
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _body_schema() -> dict[str, Any]:
    schema = BatchIn.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.pop("$defs", {})
    inlined: dict[str, Any] = _inline(schema, defs)
    return inlined


REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            JSON_MEDIA_TYPE: {"schema": _body_schema()},
            COLUMNS_MEDIA_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "the same batch as numpy columns (layout: hyperwatch.hooks.columns)",
                }
            },
        },
    }
}
"""``openapi_extra`` of the route: the body it reads itself, described as :class:`BatchIn`."""
