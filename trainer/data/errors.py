"""The one exception type of the trainer's data layer."""

from __future__ import annotations


class DataError(ValueError):
    """A data input that cannot be used: a missing path, an empty corpus, a malformed JSONL line,
    non-UTF-8 text, a corrupt or truncated token file, a tokenizer that does not fit the data.

    Messages name the offending file (and line, field or byte count) and say how to fix it.
    It is a ``ValueError`` so configuration code that maps ``ValueError`` to a user error keeps working.
    """
