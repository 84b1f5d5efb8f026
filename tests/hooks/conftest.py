"""Fixtures for the hooks tests (helpers live in support.py)."""

from tests.hooks.support import service

__all__ = ["service"]
