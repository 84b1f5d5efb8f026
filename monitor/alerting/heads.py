"""Per-head names on the service side (the hooks' ``attention_lse_max.h<k>``, see hooks.heads)."""

from __future__ import annotations

from hyperwatch.hooks.schema import head_of


def is_head(name: str) -> bool:
    return head_of(name) is not None


__all__ = ["head_of", "is_head"]
