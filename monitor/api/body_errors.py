"""What a JSON body Python's parser refused says instead of FastAPI's "error parsing the body".

One such refusal is not a malformed body at all: an integer literal longer than Python reads
(``sys.get_int_max_str_digits()``, 4300 digits: a guard against quadratic-time conversion). It was a
400 that blamed nesting (issue 37, a config holding ``10**5000``). :func:`long_integer_error` finds
where that number sits (``config.big``) and says the limit and the fix, as the 422 of any other field.
"""

from __future__ import annotations

import json
import sys
from typing import Any

_LIMIT_WORDS = "integer string conversion"


class _Long:
    """An integer literal too long to read; only its length is kept."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _read_int(text: str) -> int | _Long:
    digits = len(text.lstrip("-"))
    return _Long(digits) if digits > sys.get_int_max_str_digits() else int(text)


def is_long_integer(cause: BaseException | None) -> bool:
    """Whether the parse failure ``cause`` is Python's integer-length guard."""
    return isinstance(cause, ValueError) and _LIMIT_WORDS in str(cause)


def _find(doc: Any) -> tuple[list[str | int], int] | None:
    stack: list[tuple[Any, list[str | int]]] = [(doc, [])]
    while stack:  # iterative: the body may be nested deep
        value, path = stack.pop()
        if isinstance(value, _Long):
            return path, value.digits
        if isinstance(value, dict):
            stack += [(v, [*path, k]) for k, v in reversed(list(value.items()))]
        elif isinstance(value, list):
            stack += [(v, [*path, i]) for i, v in reversed(list(enumerate(value)))]
    return None


def long_integer_error(body: bytes) -> dict[str, Any] | None:
    """The validation error (``loc``, ``msg``, ``type``) of the first over-long integer in ``body``,
    or None when there is none (or the body cannot be read even so)."""
    try:
        found = _find(json.loads(body, parse_int=_read_int))
    except (ValueError, RecursionError):
        return None
    if found is None:
        return None
    path, digits = found
    limit = sys.get_int_max_str_digits()
    msg = (
        f"an integer of {digits} digits is beyond what this service reads (at most {limit} digits; a double, "
        "which JSON readers such as JavaScript's use, reaches about 1.8e308 and keeps integers exact only up "
        'to 2**53); send it as a string, e.g. "1e5000"'
    )
    return {"loc": ["body", *path], "msg": msg, "type": "int_too_long"}
