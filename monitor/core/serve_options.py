"""Defaults of ``hyperwatch serve``'s connection options, in a module that imports nothing.

:mod:`monitor.api.connections` applies them (it imports uvicorn); ``hyperwatch serve --help``
shows them without loading the server stack."""

DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
HTTP_CHOICES = ("auto", "httptools", "h11")
DEFAULT_MAX_CONCURRENT_READS = {"sqlite": 1, "postgresql": 8}
"""Series and figure reads computed at once, by database (``HYPERWATCH_MAX_CONCURRENT_READS`` sets
one number for either). bench/page_open.py: 8 runs x 512 points per step at 2 steps/s, a run page
opening with its 8 figure reads at once, 2-core machine, 4-5 opens per line:

- SQLite reads run in the service's process, Python under one GIL: more at once finish no sooner
  and each takes the GIL from ingest. The writers' POST p95 while the page opened: 1133 ms with no
  limit, 867 ms with 2, 158 ms with 1; the page opened as fast (1.54 / 1.71 / 1.52 s).
- PostgreSQL reads wait on the database server, so they overlap: the page opened in 2.21 s with no
  limit, 2.22 with 8, 2.51 with 4, 3.07 with 2, 3.61 with 1; POST p95 stayed 91-269 ms in all.
  8 (one page's reads) keeps that and still bounds many pages opening at once."""


def default_concurrent_reads(database_url: str) -> int:
    """The default of ``max_concurrent_reads`` for a database URL."""
    return DEFAULT_MAX_CONCURRENT_READS["sqlite" if database_url.startswith("sqlite") else "postgresql"]
