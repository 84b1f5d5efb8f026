"""Numbers in request text (query and path parameters), read one strict way.

Python's own readers are lenient where a URL must not be: ``str.isdigit()`` takes ``"²"``, which
``int()`` then refuses (a 500, issue 37); ``int()`` and pydantic take full-width or Arabic-Indic
digits, blanks around the number, ``1_000`` and ``12.0``; and nothing bounds the size, so a 20-digit
number reached the database (OverflowError on SQLite, after a stream had started). Here a number is
ASCII digits (a sign only where a negative value means something), checked against its range before
anything reads it; a refusal is a 422 naming the parameter, what it got, the range and the fix.

- :func:`parse_int` / :func:`parse_float`: the rule, for text a route splits itself (``cursor=``).
- :func:`int_query` / :func:`float_query`: the same rule as a FastAPI query parameter type, with its
  range in the OpenAPI schema (so the fuzzer knows it).
- :func:`parse_names` / :func:`names_query`: metric names, repeated or comma-separated
  (``summary=loss,val_loss``), each checked as the hooks' wire schema checks it.
- :func:`parse_line` / :func:`layer_number`: a page's line choice, ``mean``, ``max``, ``heat`` or a
  layer number, canonical (``"007"`` is layer ``"7"``), so the read layer never parses text again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import Query
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from hyperwatch.hooks.schema import MAX_LAYER, MAX_STEP, SchemaError, validate_name
from hyperwatch.monitor.core.errors import InvalidInputError, NotFoundError

MAX_ROW_ID = 2**31 - 1
"""Ids are SQL integers (PostgreSQL int4): none is larger."""
MAX_INT64 = 2**63 - 1
MAX_TEXT = 40
"""Longest number text read at all: no parameter needs more, and a longer one is refused before
``int()`` or ``float()`` spends time on it."""

_UNSIGNED = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class ParameterError(InvalidInputError):
    """A query or path parameter that is not a number of its range (422, the message names it)."""


def _shown(text: object) -> str:
    s = str(text)
    return repr(s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "...")


def _int_range(lo: int, hi: int) -> str:
    return f"a whole number from {lo} to {hi}"


def parse_int(text: str, field: str, lo: int, hi: int, hint: str = "") -> int:
    """``text`` as an integer in ``[lo, hi]``: ASCII digits, a sign only when ``lo < 0``.

    Raises :class:`ParameterError` naming ``field``, the text, the range and the fix."""
    pattern = _SIGNED if lo < 0 else _UNSIGNED
    if not isinstance(text, str) or len(text) > MAX_TEXT or not pattern.fullmatch(text):
        sign = " (a leading - for a negative one)" if lo < 0 else ""
        raise ParameterError(
            f"{field}: {_shown(text)} is not {_int_range(lo, hi)}; write it in ASCII digits 0-9{sign}, "
            f"nothing else (e.g. {field}={max(lo, min(hi, 1))})"
        )
    number = int(text)
    if not lo <= number <= hi:
        raise ParameterError(f"{field}: {_shown(text)} is out of range; give {_int_range(lo, hi)}{hint}")
    return number


def check_id(text: str, field: str) -> int:
    """A row id (``run_id``, ``group_id``, ``id``): ASCII digits with an optional sign; beyond the
    id range it names no row and never can (:class:`NotFoundError`, 404, as an unknown id)."""
    if not isinstance(text, str) or not _SIGNED.fullmatch(text):
        raise ParameterError(
            f"{field}: {_shown(text)} is not an id; write it in ASCII digits 0-9, nothing else (e.g. {field}=12)"
        )
    number = int(text) if len(text) <= MAX_TEXT else MAX_INT64 + 1  # longer: out of range, unread
    if not -MAX_ROW_ID <= number <= MAX_ROW_ID:
        what = field.removesuffix("_id").replace("_", " ") or "row"
        raise NotFoundError(f"no {what} with id {_shown(text)[1:-1]}: ids are at most {MAX_ROW_ID}")
    return number


def _float_range(lo: float, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    low = f"{'above' if lo_open else 'at least'} {lo:g}"
    if hi is None:
        return f"a finite number {low}"
    return f"a number {low} and {'below' if hi_open else 'at most'} {hi:g}"


def parse_float(
    text: str, field: str, lo: float, hi: float | None, *, lo_open: bool = False, hi_open: bool = False
) -> float:
    """``text`` as a finite float in the range (``hi`` None: no upper bound): ASCII decimal or
    scientific notation (``0.5``, ``1e21``), no ``nan``/``inf``, no blanks, no underscores."""
    want = _float_range(lo, hi, lo_open, hi_open)
    if not isinstance(text, str) or len(text) > MAX_TEXT or not _DECIMAL.fullmatch(text):
        raise ParameterError(
            f"{field}: {_shown(text)} is not {want}; write it in ASCII digits with an optional . and "
            f"exponent (e.g. {field}=0.5 or {field}=1e21), nothing else"
        )
    number = float(text)
    below = number <= lo if lo_open else number < lo
    above = hi is not None and (number >= hi if hi_open else number > hi)
    if not math.isfinite(number) or below or above:
        raise ParameterError(f"{field}: {_shown(text)} is out of range; give {want}")
    return number


def _with_rule(query: Any, parse: Any) -> Any:
    """``query`` (a FastAPI ``Query``) that first reads the raw text by ``parse``; a default passes as it is."""

    def check(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse(value)
        except ParameterError as exc:
            raise PydanticCustomError("number_parsing", "{message}", {"message": str(exc)}) from None

    query.metadata.append(BeforeValidator(check))
    return query


def int_query(field: str, lo: int, hi: int, description: str | None = None, hint: str = "") -> Any:
    """A query parameter's ``Query``: :func:`parse_int` of its text, the range in the OpenAPI schema.
    Use as ``Annotated[int, int_query("limit", 1, MAX_INT64)]``."""
    return _with_rule(Query(ge=lo, le=hi, description=description), lambda t: parse_int(t, field, lo, hi, hint))


def float_query(
    field: str,
    lo: float,
    hi: float | None,
    description: str | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Any:
    """A query parameter's ``Query``: :func:`parse_float` of its text, the range in the OpenAPI schema."""
    bounds: dict[str, float] = {"gt" if lo_open else "ge": lo}
    if hi is not None:
        bounds["lt" if hi_open else "le"] = hi
    query = Query(allow_inf_nan=False, description=description, **bounds)  # type: ignore[arg-type]
    return _with_rule(query, lambda t: parse_float(t, field, lo, hi, lo_open=lo_open, hi_open=hi_open))


def parse_line(text: str, field: str, named: Sequence[str]) -> str:
    """A line choice: one of ``named`` (``mean``, ``max``, ``heat``) or a layer number, as canonical
    text (``"7"``; the read layer keys its answer by it and reads the layer with :func:`layer_number`)."""
    if text in named:
        return text
    if isinstance(text, str) and _UNSIGNED.fullmatch(text) and len(text) <= MAX_TEXT:
        return str(parse_int(text, field, 0, MAX_LAYER))
    raise ParameterError(
        f"{field}: {_shown(text)} is not one of {', '.join(named)} or a layer number from 0 to {MAX_LAYER} "
        f"(ASCII digits, e.g. {field}={named[0]} or {field}=3)"
    )


def line_query(field: str, named: Sequence[str], description: str) -> Any:
    """A query parameter's ``Query`` for a line choice (:func:`parse_line`)."""
    return _with_rule(Query(description=description), lambda t: parse_line(t, field, named))


def parse_names(texts: Sequence[str], field: str, most: int) -> list[str]:
    """Metric names from a repeated or comma-separated parameter (``summary=loss,val_loss`` is
    ``summary=loss&summary=val_loss``): each a metric name the hooks could send
    (:func:`hooks.schema.validate_name`), each once, at most ``most`` of them."""
    names: list[str] = []
    for text in texts:
        for part in str(text).split(","):
            if not part:
                raise ParameterError(
                    f"{field}: {_shown(text)} holds an empty name; separate names with one comma, no blanks "
                    f"(e.g. {field}=loss,val_loss)"
                )
            try:
                validate_name(part, field)
            except SchemaError as exc:
                raise ParameterError(str(exc)) from None
            if part not in names:
                names.append(part)
    if len(names) > most:
        raise ParameterError(f"{field}: {len(names)} names; ask for at most {most} per request")
    return names


def names_query(field: str, most: int, description: str) -> Any:
    """A repeatable query parameter of metric names (:func:`parse_names`)."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        try:
            return parse_names(value if isinstance(value, list) else [value], field, most)
        except ParameterError as exc:
            raise PydanticCustomError("names_parsing", "{message}", {"message": str(exc)}) from None

    query = Query(description=description)
    query.metadata.append(BeforeValidator(check))
    return query


# The parameters several routes share.
Layer = Annotated[int | None, int_query("layer", 0, MAX_LAYER, "block index; omit for a run-level metric")]
Start = Annotated[int | None, int_query("start", 0, MAX_STEP, "first step (inclusive)")]
End = Annotated[int | None, int_query("end", 0, MAX_STEP, "last step (inclusive)")]
Limit = Annotated[int, int_query("limit", 1, MAX_INT64, "page size (at most HYPERWATCH_MAX_PAGE_SIZE entries come)")]
Offset = Annotated[int, int_query("offset", 0, MAX_INT64, "entries to skip")]
MAX_BUCKETS = 100_000
"""The largest ``HYPERWATCH_MAX_BUCKETS`` allowed; the setting's own value is checked by the read layer."""


def buckets_query(lo: int, description: str | None = None) -> Any:
    """``buckets``: a whole number from ``lo``; above the service's setting the read layer says so."""
    hint = " (and at most this service's HYPERWATCH_MAX_BUCKETS, 10000 unless set)"
    return int_query("buckets", lo, MAX_BUCKETS, description, hint)
