"""Segment blobs that fill PostgreSQL's TOAST pages (revision 0016, issue 36).

A value stored out of line is cut into TOAST chunks of ``TOAST_MAX_CHUNK_SIZE`` bytes (1,996 with
8 KB pages); four full chunks fill a TOAST page. A blob's last chunk is shorter, and the next
blob's first full chunk does not fit beside it: on issue 36's workload that left 0.91 B/pt of free
TOAST space against 4.55 of live bytes (``bench/storage_parts.py``, revision 0015).

So a chunk row keeps its blob in two columns on PostgreSQL: ``data_ext`` (``STORAGE EXTERNAL``)
holds the longest prefix that is a whole number of TOAST chunks, which fills TOAST pages four
chunks at a time, and ``data`` the rest (shorter than one TOAST chunk), inline in the row's heap
page, where rows of every length share pages. ``data_ext`` is NULL when the blob is shorter than
one TOAST chunk (every 16-step chunk). SQLite keeps whole blobs in ``data`` (its rowid table fills
overflow pages already: ``models.MetricChunkRow``). Readers never see the split: every read selects
:data:`DATA` through the view ``chunk_rows``, the prefix joined to the rest.
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

_INFO_KEY = "hyperwatch_toast_chunk"


def chunk_size(block_size: int) -> int:
    """PostgreSQL's ``TOAST_MAX_CHUNK_SIZE`` for a server built with ``block_size`` (its
    ``access/heaptoast.h``): a quarter page less the page's header and four line pointers, rounded
    down to 8 bytes, less the TOAST tuple's header (24), chunk id (4), sequence number (4) and varlena
    header (4). 1,996 for 8 KB pages."""
    if block_size < 1024 or block_size & (block_size - 1):
        raise ValueError(f"block_size: a power of two of at least 1024 bytes, got {block_size}")
    tuple_max = ((block_size - 40) // 4) // 8 * 8
    return tuple_max - 24 - 4 - 4 - 4


def split_size(conn: Connection) -> int:
    """Where blobs are cut on this connection's database: PostgreSQL's TOAST chunk size (asked once
    per pooled connection), 0 on SQLite (never cut)."""
    if conn.dialect.name != "postgresql":
        return 0
    info = conn.connection.info
    size = info.get(_INFO_KEY)
    if size is None:
        size = info[_INFO_KEY] = chunk_size(int(conn.exec_driver_sql("SHOW block_size").scalar_one()))
    return int(size)


def split(blob: bytes, size: int) -> tuple[bytes, bytes | None]:
    """``(data, data_ext)`` of ``blob``: ``data_ext`` the longest prefix of whole ``size``-byte pieces
    (None when there is none or ``size`` is 0), ``data`` the rest; ``data_ext + data == blob``."""
    cut = len(blob) // size * size if size else 0
    if not cut:
        return blob, None
    return blob[cut:], blob[:cut]


def data_expr(dialect: str, alias: str = "") -> str:
    """The SQL of a chunk row's whole blob: the stored prefix joined to the rest (``alias``: the
    table's, e.g. ``t.``)."""
    ext, data = f"{alias}data_ext", f"{alias}data"
    if dialect == "sqlite":  # SQLite's || yields TEXT; CAST gives the same bytes back as a BLOB
        return f"COALESCE(CAST({ext} || {data} AS BLOB), {data})"
    return f"COALESCE({ext} || {data}, {data})"
