"""What the commands that talk to a running service share: its address and write token from the
flags or the environment (``HYPERWATCH_SERVER``, ``HYPERWATCH_WRITE_TOKEN``), one call with the
hooks' HTTP client, and a refusal in words for the terminal."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8000"


class Failed(Exception):
    """What went wrong, in words for the terminal."""


def add_service_flags(p: argparse.ArgumentParser, server: argparse._ActionsContainer | None = None) -> None:
    """``--server`` (on ``server``: a mutually exclusive group, when the command has another source)
    and ``--token``."""
    (server or p).add_argument("--server", help=f"service URL (default: HYPERWATCH_SERVER or {DEFAULT_SERVER})")
    p.add_argument("--token", help="write token of the service (default: HYPERWATCH_WRITE_TOKEN)")


class Service:
    """The service ``args`` name, called over its HTTP API with the write token."""

    def __init__(self, args: argparse.Namespace, timeout: float = 120.0) -> None:
        from hyperwatch.hooks.sinks.client import api, request

        self.base = args.server or os.environ.get("HYPERWATCH_SERVER") or DEFAULT_SERVER
        self.token = args.token or os.environ.get("HYPERWATCH_WRITE_TOKEN")
        self.timeout = timeout
        self._api, self._request = api, request

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """The answer's JSON; a refusal or a failure raises :class:`Failed` with the service's reason."""
        resp = self._request(method, self._api(self.base, path), body, self.token, timeout=self.timeout)
        if resp.status // 100 != 2:
            detail = resp.body if isinstance(resp.body, dict) else {}
            why = detail.get("message") or detail.get("detail") or resp.error or resp.status
            raise Failed(f"{self.base}: {method} {path}: {why}")
        return resp.body
