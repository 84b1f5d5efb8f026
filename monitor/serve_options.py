"""Defaults of ``hyperwatch serve``'s connection options, in a module that imports nothing.

:mod:`monitor.api.connections` applies them (it imports uvicorn); ``hyperwatch serve --help``
shows them without loading the server stack."""

DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
HTTP_CHOICES = ("auto", "httptools", "h11")
DEFAULT_MAX_CONCURRENT_READS = 1
"""Series and figure reads computed at once (``HYPERWATCH_MAX_CONCURRENT_READS``). The reads are
Python under one GIL: more at once finish no sooner in all, and each takes the GIL from ingest.
bench/page_open.py (8 runs x 512 points per step at 2 steps/s, SQLite, a run page opening with its
8 figure reads at once, 2-core machine): the writers' POST p95 while the page opened was 1133 ms
with no limit, 867 ms with 2, 158 ms with 1, and the page opened as fast (1.54 / 1.71 / 1.52 s)."""
