"""Defaults of ``hyperwatch serve``'s connection options, in a module that imports nothing.

:mod:`monitor.api.connections` applies them (it imports uvicorn); ``hyperwatch serve --help``
shows them without loading the server stack."""

DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
HTTP_CHOICES = ("auto", "httptools", "h11")
