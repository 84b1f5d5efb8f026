"""The write token the hooks send: ``token=``, else ``$HYPERWATCH_WRITE_TOKEN``, else ``$HYPERWATCH_TOKEN``.

``HYPERWATCH_WRITE_TOKEN`` is the one name both sides read: the service checks writes against it,
and the training process (the hooks, ``hyperwatch upload``) sends it. ``HYPERWATCH_TOKEN`` is the
hooks' older name, still read as an alias. When both are set and differ, ``HYPERWATCH_WRITE_TOKEN``
wins and a WARNING says so (once per process).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

TOKEN_ENV = "HYPERWATCH_WRITE_TOKEN"
ALIAS_ENV = "HYPERWATCH_TOKEN"
_warned = False


def resolve_token(token: str | None) -> tuple[str | None, str]:
    """(the token to send, where it came from: ``token=``, an environment variable's name, or "")."""
    global _warned
    if token is not None:
        return token, "token="
    write, alias = os.environ.get(TOKEN_ENV) or None, os.environ.get(ALIAS_ENV) or None
    if write and alias and write != alias and not _warned:
        _warned = True
        log.warning(
            "hooks: %s and %s are both set and differ; sending %s (the name the service reads). "
            "Unset %s (an older alias) to silence this",
            TOKEN_ENV,
            ALIAS_ENV,
            TOKEN_ENV,
            ALIAS_ENV,
        )
    if write:
        return write, TOKEN_ENV
    if alias:
        return alias, ALIAS_ENV
    return None, ""


def refused_message(status: int, source: str) -> str:
    """What a 401/403 means for the training process: which variable to set, and what was sent."""
    sent = f"the token from {source} is not the service's write token" if source else "no token was sent"
    return (
        f"the service refused the write (HTTP {status}): {sent}. Set {TOKEN_ENV} in the training "
        f"process's environment to the service's {TOKEN_ENV} (or pass hooks.attach(..., token=...)); "
        "the spool keeps every batch and the sink keeps retrying"
    )
