"""The offline sink: a folder per run with ``run.json`` and ``batches.jsonl`` (see :mod:`folder`).

Replay it into the service with ``hyperwatch upload DIR --server URL``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import IO, Any

from hyperwatch.hooks.schema import Batch
from hyperwatch.hooks.sinks.base import RunInfo, Sink, SinkError
from hyperwatch.hooks.sinks.folder import JSONL_FILE, RUN_FILE, read_json, run_folder, write_json_atomic


class JsonlSink(Sink):
    """Appends one batch per line; each line is flushed to the OS (``fsync=True`` for power loss)."""

    def __init__(self, root: str | os.PathLike[str], fsync: bool = False) -> None:
        if not str(root):
            raise SinkError("sink: the JSONL folder path is empty; pass e.g. sink='runs/offline/'")
        self.root = Path(root)
        self.fsync = fsync
        self.folder: Path | None = None
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def start(self, run: RunInfo) -> None:
        folder = run_folder(self.root, run.name)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"sink: cannot create the JSONL folder {folder}: {exc}; pass a writable path") from exc
        write_json_atomic(folder / RUN_FILE, run.to_json())
        self.folder = folder
        self._file = open(folder / JSONL_FILE, "a", encoding="utf-8")  # noqa: SIM115 (kept open until close)

    def write(self, batch: Batch) -> None:
        if self._file is None:
            raise SinkError("JsonlSink.write: start(run) was not called; the monitor calls it in attach()")
        line = json.dumps(batch.to_json(), allow_nan=False, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())

    def update(self, fields: dict[str, Any]) -> None:
        """Merge run fields into ``run.json`` (``hyperwatch upload`` sends them with the run)."""
        if self.folder is None:
            return
        with self._lock:
            meta = read_json(self.folder / RUN_FILE)
            meta.update(fields)
            write_json_atomic(self.folder / RUN_FILE, meta)

    def finish(self, status: str) -> None:
        self.update({"status": status})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
