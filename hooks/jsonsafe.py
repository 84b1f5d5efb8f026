"""JSON-safe run metadata: the one rule set for a run's ``config`` (and a group's), both sides.

A run's config is free-form, but it is stored as JSON and must read back as UTF-8 JSON, so three
things a Python dict can hold are not allowed as they are:

- a lone surrogate in a string or a key. It is what ``os.fsdecode`` gives for a non-UTF-8 path
  (``os.fsdecode(b"/data/caf\\xe9") == "/data/caf\\udce9"``), so it is normal in a training config;
  it cannot be encoded as UTF-8, so a response holding it could never be sent;
- a NUL character (``\\u0000``) in a string or a key: stored text cannot hold it (PostgreSQL refuses
  it; the README promises text without it everywhere);
- NaN and +/-Inf floats: standard JSON has no literal for them (PostgreSQL refuses them, SQLite
  reads them back as null);
- nesting deeper than :data:`MAX_JSON_DEPTH` levels (reading and serialising it back recurses).

The hooks *repair* with :func:`sanitize_json` before they send (a training job must never stop
over its config): a surrogate-escaped byte becomes the text ``\\xNN`` (so the path above becomes
``/data/caf\\\\xe9``, i.e. the characters ``/data/caf\\xe9``), any other lone surrogate ``\\uDNNN``, a
NUL the text ``\\x00``;
NaN and +/-Inf become the wire strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (as for metric
values); objects JSON has no type for (paths, dtypes, enums) become ``str(obj)``; tuples and sets
become lists; what lies deeper than the limit becomes a short string saying so.

The service *checks* with :func:`check_json`: a lone surrogate, a NUL, a non-JSON type or too deep a
nesting is a :class:`~hooks.schema.SchemaError` naming the path (``config.data.dir``); NaN and
+/-Inf are the one normalisation (to the wire strings, on every database).

Standard library only (the hooks import it in training processes).
"""

from __future__ import annotations

import math
import re
from typing import Any

from hyperwatch.hooks.schema import NONFINITE_TO_WIRE, SchemaError

MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and lists in a config (a training config is rarely deeper than 5)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_one(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's image of the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def escape_surrogates(text: str) -> str:
    """``text`` with every lone surrogate written as ``\\xNN`` (an undecodable byte) or ``\\uDNNN``."""
    return _SURROGATE.sub(_escape_one, text)


def escape_text(text: str) -> str:
    """``text`` as stored text can hold it: lone surrogates escaped (:func:`escape_surrogates`), NUL as ``\\x00``."""
    return escape_surrogates(text).replace("\x00", "\\x00")


def _wire_float(value: float) -> float | str:
    return value if math.isfinite(value) else NONFINITE_TO_WIRE[repr(value)]


def sanitize_json(obj: Any, _depth: int = 0) -> Any:
    """A copy of ``obj`` that :func:`check_json` accepts, repairing instead of refusing (see module doc)."""
    if obj is None or isinstance(obj, (bool, int)):
        return obj
    if isinstance(obj, float):
        return _wire_float(obj)
    if isinstance(obj, str):
        return escape_text(obj)
    if isinstance(obj, (dict, list, tuple, set, frozenset)) and _depth >= MAX_JSON_DEPTH:
        return f"<a {type(obj).__name__} nested deeper than {MAX_JSON_DEPTH} levels, left out>"  # no repr: it recurses
    if isinstance(obj, dict):
        return {escape_text(str(k)): sanitize_json(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize_json(v, _depth + 1) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((sanitize_json(v, _depth + 1) for v in obj), key=repr)
    return escape_text(str(obj))


_NUL_FIX = "remove it (hyperwatch.hooks.jsonsafe.sanitize_json writes it as the text \\x00)"


def _surrogate_error(path: str, text: str, what: str) -> SchemaError:
    return SchemaError(
        path,
        f"{what} {escape_surrogates(text)[:80]!r} holds a lone surrogate (not valid UTF-8; e.g. os.fsdecode of a "
        "non-UTF-8 path); send it escaped (hyperwatch.hooks.jsonsafe.sanitize_json does this) or as UTF-8",
    )


def check_json(obj: Any, field: str = "config") -> Any:
    """``obj`` as it will be stored: NaN/+-Inf as the wire strings; anything else not storable raises.

    Raises :class:`SchemaError` whose field is the dotted path of the first bad value.
    """
    stack: list[tuple[Any, str, int]] = [(obj, field, 0)]
    while stack:  # iterative: a hostile body nested 10^5 deep must not exhaust the Python stack
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise _surrogate_error(path, value, "the string")
            if "\x00" in value:
                raise SchemaError(path, f"holds a NUL character (\\u0000), which stored text cannot hold; {_NUL_FIX}")
        elif isinstance(value, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise SchemaError(
                    path, f"is nested deeper than {MAX_JSON_DEPTH} levels; flatten it or store it as a string"
                )
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(value, dict):
                    if not isinstance(key, str):
                        raise SchemaError(path, f"has a key of type {type(key).__name__}; keys must be strings")
                    if _SURROGATE.search(key):
                        raise _surrogate_error(f"{path}.{escape_surrogates(key)}", key, "the key")
                    if "\x00" in key:
                        raise SchemaError(
                            f"{path}.{escape_text(key)}",
                            f"the key holds a NUL character (\\u0000), which stored text cannot hold; {_NUL_FIX}",
                        )
                stack.append((item, f"{path}.{key}" if isinstance(value, dict) else f"{path}[{key}]", depth + 1))
        elif not (value is None or isinstance(value, (bool, int, float))):
            raise SchemaError(path, f"is a {type(value).__name__}; a config holds only JSON values")
    return _nonfinite_to_wire(obj)


def _nonfinite_to_wire(obj: Any) -> Any:
    if isinstance(obj, float):
        return _wire_float(obj)
    if isinstance(obj, dict):
        return {k: _nonfinite_to_wire(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nonfinite_to_wire(v) for v in obj]
    return obj
