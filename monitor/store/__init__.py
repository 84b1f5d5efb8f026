"""Storage: an abstract :class:`Store` and its SQLAlchemy implementation.

ORM rows never leave this package; callers get the dataclasses of :mod:`monitor.store.entities`
and the errors of :mod:`monitor.core.errors`.

Which file does what on the write path and the read path: ``monitor/store/README.md``.
"""

from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.sql import SqlStore

__all__ = ["SqlStore", "Store"]
