"""The HTTP sink: batches go to an on-disk spool first, a background thread delivers them.

Losing nothing:

- ``write`` only writes the batch to ``<spool>/<run>/pending/`` (atomic rename) and wakes the
  sender thread; the training thread never waits on the network.
- The sender creates the run once (POST /api/v1/runs, retried), then posts pending batches in
  order, several merged per request, each request carrying an idempotency key (``batch_id`` in
  the body and the ``Idempotency-Key`` header), so a retried request is stored once. A batch file
  is deleted only after the service acknowledged it (2xx).
- Connection errors, 5xx, 429 and 503 (with ``Retry-After``) are retried with exponential
  backoff; 404 means the service forgot the run: it is created again. A batch the service refuses
  as invalid (other 4xx) is moved to ``rejected/`` and logged, never deleted.
- If the process dies, the spool stays: the next ``HttpSink`` on the same spool and run resends
  it when it resumes that run (``resume=True``; else it is set aside, see :mod:`identity`), or
  ``hyperwatch upload <spool> --server URL`` replays it. A delivered run's folder is removed.
- The final status (``finish``) is spooled too and PATCHed after the last batch.
- A crash between the service's acknowledgement and the deletion of the files does not duplicate
  anything: the group being posted is named in ``inflight.json`` first (see :mod:`folder`), and
  the next sender resends exactly that group under the same key, or knows it was acknowledged.

The spool is bounded: ``max_spool_bytes`` (default ``$HYPERWATCH_SPOOL_MAX_BYTES``, else 1 GiB)
caps the bytes of ``pending/`` for the run. Policy when full: **keep the oldest, drop the newest,
never block training.** A batch that does not fit is not written; its points are counted
(``dropped_points``, ``dropped_batches``, also in ``<spool>/<run>/dropped.json`` so a later upload
sees them), an ERROR is logged at the first drop and then at most once a minute with the totals,
and the first and last dropped steps are recorded, so the gap in the run is known exactly. As soon
as the sender has delivered enough to make room, batches are spooled again and a WARNING states the
total lost. A batch that cannot be written at all (disk full, permissions) is counted the same way.
Why the newest: what came before the outage is what explains it; blocking instead would stall
training on a monitoring problem, and an unbounded spool would fill the training job's disk.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hyperwatch.hooks.schema import Batch
from hyperwatch.hooks.sinks import client
from hyperwatch.hooks.sinks.base import RunInfo, Sink, SinkError
from hyperwatch.hooks.sinks.folder import (
    DROPPED_FILE,
    PENDING_DIR,
    REJECTED_DIR,
    RUN_FILE,
    STATUS_FILE,
    UPDATE_FILE,
    clear_inflight,
    load_batches,
    merge,
    pending_files,
    read_json,
    record_drops,
    recover_inflight,
    run_folder,
    widen_steps,
    write_inflight,
    write_json_atomic,
)
from hyperwatch.hooks.sinks.identity import create_refused, remove_delivered, set_aside_earlier
from hyperwatch.hooks.sinks.settings import (
    DEFAULT_SPOOL_MAX_BYTES as DEFAULT_SPOOL_MAX_BYTES,  # re-exported: the bound's documented default
)
from hyperwatch.hooks.sinks.settings import (
    base_url_hint,
    check_close_timeout,
    default_close_timeout,
    default_spool,
    default_spool_max_bytes,
    not_found_message,
    replay_command,
)
from hyperwatch.hooks.sinks.token import TOKEN_ENV, refused_message, resolve_token

log = logging.getLogger(__name__)
DROP_LOG_INTERVAL_S = 60.0


class HttpSink(Sink):
    """Streams batches to the HyperWatch service through a spool; see the module docstring."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        spool: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        max_points: int = 20_000,
        backoff: tuple[float, float] = (0.2, 30.0),
        close_timeout: float | None = None,
        max_spool_bytes: int | None = None,
        columns_body: bool = True,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SinkError(f"sink: {url!r} is not an http(s) URL; pass e.g. sink='http://localhost:8000'")
        if not (0 < backoff[0] <= backoff[1]):
            raise SinkError(f"backoff: {backoff!r} must be (first, max) seconds with 0 < first <= max")
        if max_points < 1:
            raise SinkError(f"max_points: must be >= 1, got {max_points}")
        if max_spool_bytes is None:
            max_spool_bytes = default_spool_max_bytes()
        if isinstance(max_spool_bytes, bool) or not isinstance(max_spool_bytes, int) or max_spool_bytes < 1:
            raise SinkError(f"max_spool_bytes: must be a positive integer number of bytes, got {max_spool_bytes!r}")
        self.max_spool_bytes = max_spool_bytes
        self.spool_bytes = 0  # bytes in pending/ (what the bound applies to)
        self.dropped_points = 0
        self.dropped_batches = 0
        self.dropped_steps: tuple[int, int] | None = None  # first and last step of what was dropped
        self._sizes: dict[str, int] = {}  # pending file name -> bytes
        self._dropping = False
        self._last_drop_log = 0.0
        self.url = url.rstrip("/")
        # token=, else $HYPERWATCH_WRITE_TOKEN (the service's name), else $HYPERWATCH_TOKEN (an alias)
        self.token, self.token_source = resolve_token(token)
        self._auth_logged = False
        self._announced = False  # the run's page was printed (once per run)
        self.spool = Path(spool) if spool is not None else default_spool()
        self.timeout = timeout
        self.max_points = max_points
        self.backoff = backoff
        self.close_timeout = default_close_timeout() if close_timeout is None else check_close_timeout(close_timeout)
        self._not_found_logged = False
        self.refused = ""  # why the service refused the run (409: another process's run of this name)
        self.folder: Path | None = None
        self.run: RunInfo | None = None
        self.run_id: str | None = None
        self.delivered = 0  # batches acknowledged
        self.columns_body = columns_body  # binary columns (hooks.columns) while the service reads them
        self.last_error = ""
        self._seq = 0
        self._single = False  # after a refused merged request, send batches one by one
        self._inflight: list[Path] = []  # the files of the request not yet acknowledged: resent as is
        self._failing = False
        self._delay = 0.0
        self._idle = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()
        self._generation = 0  # bumped by every write/finish: the sender is idle only if unchanged

    # -- Sink interface (called by the monitor's emitter thread) --
    def start(self, run: RunInfo) -> None:
        folder = run_folder(self.spool, run.name)
        set_aside_earlier(folder, run, self.url)
        try:
            (folder / PENDING_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"spool: cannot create {folder}: {exc}; pass a writable spool=... folder") from exc
        write_json_atomic(folder / RUN_FILE, run.to_json())
        self._inflight = recover_inflight(folder)
        existing = pending_files(folder)
        if existing:
            log.info("hooks: %d batches left in the spool %s by an earlier process; resending", len(existing), folder)
            self._seq = int(existing[-1].name.split("-", 1)[0]) + 1
        for path in existing:
            self._sizes[path.name] = path.stat().st_size
        self.spool_bytes = sum(self._sizes.values())
        if (folder / DROPPED_FILE).is_file():
            earlier = read_json(folder / DROPPED_FILE)
            self.dropped_points = int(earlier.get("points", 0))
            self.dropped_batches = int(earlier.get("batches", 0))
        self.folder, self.run = folder, run
        self._thread = threading.Thread(target=self._loop, name="hyperwatch-http-sink", daemon=True)
        self._thread.start()

    def page_url(self) -> str | None:
        """The run's page on the service, once the service gave the run's id."""
        if self.run_id is None:
            return None
        return f"{base_url_hint(self.url).rstrip('/')}/runs/{self.run_id}"

    def write(self, batch: Batch) -> None:
        """Spool the batch (never waits on the network); when the spool is full, drop it and count it."""
        folder = self._require_started()
        data = json.dumps(batch.to_json(), allow_nan=False, separators=(",", ":"))
        size = len(data.encode("utf-8"))
        with self._write_lock:
            if self.spool_bytes + size > self.max_spool_bytes:
                self._drop(batch, f"the spool {folder} is full ({self.spool_bytes} of {self.max_spool_bytes} bytes)")
                return
            name = f"{self._seq:012d}-{batch.batch_id}.json"
            self._seq += 1
            self.spool_bytes += size
            self._sizes[name] = size
        try:
            tmp = folder / PENDING_DIR / f".{name}.tmp"
            tmp.write_text(data, encoding="utf-8")
            os.replace(tmp, folder / PENDING_DIR / name)
        except OSError as exc:
            with self._write_lock:
                self._forget(name)
                self._drop(batch, f"cannot write to the spool {folder}: {exc}")
            return
        with self._write_lock:
            if self._dropping:
                self._dropping = False
                log.warning(
                    "hooks: spooling again for run %r; %d points (%d batches, steps %s) were dropped while "
                    "the spool was full or unwritable",
                    batch.run,
                    self.dropped_points,
                    self.dropped_batches,
                    self.dropped_steps,
                )
        self._touch()

    def _drop(self, batch: Batch, why: str) -> None:
        """Count a batch that was not spooled (caller holds _write_lock); log loudly, never block."""
        self.dropped_batches += 1
        self.dropped_points += len(batch.points)
        self.dropped_steps = widen_steps(self.dropped_steps, batch)
        now = time.monotonic()
        if not self._dropping or now - self._last_drop_log >= DROP_LOG_INTERVAL_S:
            log.error(
                "hooks: %s: DROPPING new batches of run %r (%d points in %d batches so far, steps %s); training "
                "goes on. The service at %s is unreachable or slow (last error: %s); raise max_spool_bytes / "
                "HYPERWATCH_SPOOL_MAX_BYTES or free the disk to keep more",
                why,
                batch.run,
                self.dropped_points,
                self.dropped_batches,
                self.dropped_steps,
                self.url,
                self.last_error or "none",
            )
            self._last_drop_log = now
        self._dropping = True
        if self.folder is not None:
            record_drops(self.folder, self.dropped_points, self.dropped_batches, self.dropped_steps)

    def _forget(self, name: str) -> None:
        """A pending file left the spool (delivered, rejected or never written): free its bytes."""
        self.spool_bytes -= self._sizes.pop(name, 0)

    def update(self, fields: dict[str, Any]) -> None:
        """Merge run fields into the spooled ``run.json`` and PATCH them to the run (after it exists)."""
        folder = self._require_started()
        with self._write_lock:
            pending = read_json(folder / UPDATE_FILE) if (folder / UPDATE_FILE).is_file() else {}
            write_json_atomic(folder / UPDATE_FILE, {**pending, **fields})
            meta = read_json(folder / RUN_FILE)
            meta.update(fields)
            write_json_atomic(folder / RUN_FILE, meta)
        self._touch()

    def finish(self, status: str) -> None:
        folder = self._require_started()
        write_json_atomic(folder / STATUS_FILE, {"status": status})
        meta = read_json(folder / RUN_FILE)
        meta["status"] = status
        write_json_atomic(folder / RUN_FILE, meta)
        self._touch()

    def _touch(self) -> None:
        with self._write_lock:
            self._generation += 1
            self._idle.clear()
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        if self._thread is None:
            return True
        self._wake.set()
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Deliver for at most ``close_timeout`` seconds, then stop; the spool keeps the rest.

        Bounded: a request still in flight at the deadline is abandoned to its (daemon) thread;
        its files stay in the spool until acknowledged, and a replay resends them under the same
        key, so nothing is lost or stored twice.
        """
        if self._thread is None:
            return
        deadline = time.monotonic() + self.close_timeout
        done = self.flush(self.close_timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=max(0.05, deadline - time.monotonic()))
        self._thread = None
        if self.refused:
            log.error(
                "hooks: nothing of run %r was sent: %s; the spool keeps it in %s",
                self._name(),
                self.refused,
                self.folder,
            )
            return
        if done and self.page_url() is not None:
            log.info("hooks: run %r is at %s", self._name(), self.page_url())
        if done and self.run_id is not None and not self.dropped_batches and self.folder is not None:
            remove_delivered(self.folder, self._name())
        if not done and self.folder is not None:
            left = len(pending_files(self.folder)) + int((self.folder / STATUS_FILE).is_file())
            log.warning(
                "hooks: close() gave up after %.1f s (close_timeout / HYPERWATCH_CLOSE_TIMEOUT): %d spooled "
                "items of run %r are not delivered (last error: %s); they stay in %s. Replay them with:\n"
                "    %s",
                self.close_timeout,
                left,
                self._name(),
                self.last_error or "none",
                self.folder,
                self.replay_command(),
            )

    def _name(self) -> str:
        return self.run.name if self.run else "?"

    def replay_command(self) -> str:
        """The exact command that delivers what this sink's spool holds for its run."""
        command = replay_command(self.folder if self.folder is not None else self.spool, self.url, None)
        return command + (f"  # with {TOKEN_ENV} set (or --token)" if self.token else "")

    # -- the sender thread --
    def _require_started(self) -> Path:
        if self.folder is None:
            raise SinkError("HttpSink: start(run) was not called; the monitor calls it in attach()")
        return self.folder

    def _loop(self) -> None:
        while True:
            generation = self._generation
            try:
                state = self._step()
            except Exception as exc:  # the sender must survive anything; the spool keeps the data
                log.exception("hooks: HTTP sink error; retrying")
                self.last_error = repr(exc)
                state = "wait"
            if state == "progress":
                continue
            if state == "idle":
                with self._write_lock:
                    if generation == self._generation:
                        self._idle.set()
                if self._stop.is_set():
                    return
                self._wake.wait(1.0)
            else:
                if self._stop.is_set():
                    return
                self._wake.wait(self._next_delay())
            self._wake.clear()

    def _next_delay(self) -> float:
        first, most = self.backoff
        self._delay = min(most, self._delay * 2 if self._delay else first)
        return self._delay * random.uniform(0.8, 1.2)

    def _fail(self, what: str, resp: client.Response) -> str:
        self.last_error = f"{what}: HTTP {resp.status or 'no answer'} {resp.error}".strip()
        if client.classify(resp) == client.AUTH and not self._auth_logged:
            self._auth_logged = True
            log.error("hooks: %s: %s", what, refused_message(resp.status, self.token_source))
        if not self._failing:
            log.warning("hooks: %s; the spool keeps every batch and the sink keeps retrying", self.last_error)
            self._failing = True
        if resp.retry_after is not None:
            self._delay = max(self.backoff[0], min(resp.retry_after, 60.0)) / 2
        return "wait"

    def _ok(self) -> str:
        if self._failing:
            log.info("hooks: the service answers again; resending the spool")
        self._failing = False
        self._delay = 0.0
        return "progress"

    def _step(self) -> str:
        assert self.folder is not None and self.run is not None
        if self.refused:
            return "idle"  # nothing can be sent; the spool keeps it for an upload or a resume
        if self.run_id is None:
            resp = client.request(
                "POST", client.api(self.url, "/api/v1/runs"), self.run.create_body(), self.token, self.timeout
            )
            kind = client.classify(resp)
            if resp.status in (409, 422):
                self.refused, again = create_refused(resp.status, resp.body, self.run, self.folder, self.url)
                if self.refused or again:
                    return "idle" if self.refused else "progress"
            if kind != client.DELIVERED:
                if kind == client.REFUSED:
                    log.error("hooks: the service refused run %r: %s", self.run.name, resp.body)
                if kind == client.UNKNOWN_RUN and not self._not_found_logged:
                    self._not_found_logged = True
                    log.error("hooks: %s", self.not_found_message())
                return self._fail("creating the run", resp)
            body = resp.body if isinstance(resp.body, dict) else {}
            first = self.run_id is None and not self.delivered
            self.run_id = str(body.get("id", self.run.name))
            if first and "id" in body and not self._announced:
                self._announced = True  # visible without logging set up, as W&B's "View run at" line
                print(f"hyperwatch: view run {self.run.name!r} at {self.page_url()}", file=sys.stderr, flush=True)
            return self._ok()
        update_file = self.folder / UPDATE_FILE
        if update_file.is_file():  # a refusal (an older service without the field): the data matter more
            return self._patch(update_file, "updating the run", logging.WARNING)
        files = pending_files(self.folder)
        if files:
            return self._send(files)
        status_file = self.folder / STATUS_FILE
        if status_file.is_file():
            return self._patch(status_file, "setting the run status", logging.ERROR)
        return "idle"

    def _patch(self, path: Path, what: str, refused_level: int) -> str:
        """PATCH the run with the fields spooled in ``path``; the file goes once the service answered
        (delivered, or refused and logged at ``refused_level``), unless it was extended meanwhile."""
        with self._write_lock:
            fields = read_json(path)
        resp = client.request(
            "PATCH", client.api(self.url, f"/api/v1/runs/{self.run_id}"), fields, self.token, self.timeout
        )
        kind = client.classify(resp)
        if kind == client.DELIVERED or kind == client.REFUSED:
            if kind == client.REFUSED:
                log.log(refused_level, "hooks: the service refused %s %s: %s", what, fields, resp.body)
            with self._write_lock:
                if read_json(path) == fields:
                    path.unlink(missing_ok=True)
            return self._ok()
        if kind == client.UNKNOWN_RUN:
            self.run_id = None
        return self._fail(what, resp)

    def not_found_message(self) -> str:
        """Why creating the run got a 404: the URL is not the service's base URL."""
        return not_found_message(self.url)

    def _reject(self, path: Path, why: str) -> None:
        assert self.folder is not None
        rejected = self.folder / REJECTED_DIR
        rejected.mkdir(exist_ok=True)
        os.replace(path, rejected / path.name)
        with self._write_lock:
            self._forget(path.name)
        log.error("hooks: batch %s moved to %s: %s", path.name, rejected, why)

    def _send(self, files: list[Path]) -> str:
        # A retry resends exactly the same files under the same key, even if more were spooled since:
        # the service may have stored the first attempt without our seeing its answer.
        if self._inflight and all(p.is_file() for p in self._inflight):
            files = self._inflight
        chosen, batches = load_batches(files, self.max_points, self._single, self._reject)
        self._inflight = chosen
        if not batches:
            return "progress"
        batch = merge(batches)
        folder = self._require_started()
        write_inflight(folder, chosen)
        project = self.run.fields.get("project") if self.run else None
        resp, self.columns_body = client.post_points(
            self.url, batch, self.token, self.timeout, self.columns_body, project
        )
        kind = client.classify(resp)
        if kind == client.DELIVERED:
            for path in chosen:
                path.unlink(missing_ok=True)
            clear_inflight(folder)  # after the files: see folder.recover_inflight
            with self._write_lock:
                for path in chosen:
                    self._forget(path.name)
            self._inflight = []
            self.delivered += len(chosen)
            self._single = False
            return self._ok()
        if kind == client.REFUSED:
            clear_inflight(folder)
            self._inflight = []
            if len(chosen) > 1:
                self._single = True  # find the one the service refuses
                return "progress"
            self._reject(chosen[0], f"the service refused it: HTTP {resp.status} {resp.body}")
            self._single = False
            return "progress"
        if kind == client.UNKNOWN_RUN:
            self.run_id = None
        return self._fail("posting points", resp)
