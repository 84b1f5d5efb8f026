"""``hyperwatch upload DIR --server URL [--token T]``: replay an offline JSONL folder or an HTTP spool.

DIR is a run folder (with ``run.json``) or a folder of them: the JSONL sink's output, or an
HTTP sink's spool left by a service outage or a crashed training process. For each run: create
it (POST /api/v1/runs), post its batches (``batches.jsonl`` lines and ``pending/*.json`` files,
several merged per request under a key derived from theirs, so a replay is idempotent), then set
its final status. Spool files are deleted once acknowledged, and a spool run folder whose every
batch, field update and status was acknowledged is removed (one holding ``rejected/`` batches or a
``dropped.json`` record stays, for a person to look at); JSONL files are kept. A group a crashed
sender was posting (``inflight.json``) is resent first, as that same group under its same key, so
the service stores it once even if it had stored it before the crash. The write token is
``--token``, else ``$HYPERWATCH_WRITE_TOKEN`` (the service's name), else ``$HYPERWATCH_TOKEN``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hyperwatch.hooks.schema import Batch, SchemaError
from hyperwatch.hooks.sinks import client
from hyperwatch.hooks.sinks.base import RunInfo, SinkError
from hyperwatch.hooks.sinks.folder import (
    DROPPED_FILE,
    JSONL_FILE,
    PENDING_DIR,
    RUN_FILE,
    STATUS_FILE,
    UPDATE_FILE,
    clear_inflight,
    find_run_folders,
    iter_jsonl,
    merge,
    pending_files,
    read_json,
    recover_inflight,
)
from hyperwatch.hooks.sinks.identity import remove_delivered
from hyperwatch.hooks.sinks.settings import base_url_hint
from hyperwatch.hooks.sinks.token import TOKEN_ENV, resolve_token


class UploadError(RuntimeError):
    """The service could not take a run's data; the message says which run and why."""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("dir", type=Path, help="a run folder (with run.json) or a folder of run folders")
    p.add_argument("--server", required=True, help="the service's base URL, e.g. http://localhost:8000")
    p.add_argument("--token", default=None, help=f"write token (default: ${TOKEN_ENV})")
    p.add_argument("--max-points", type=int, default=20_000, help="points per request (default 20000)")
    p.add_argument("--retries", type=int, default=8, help="attempts per request before giving up (default 8)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    return p


def _read_object(path: Path) -> dict[str, Any]:
    """A JSON object from a spool file, or an UploadError naming the file."""
    try:
        obj = read_json(path)
    except (OSError, ValueError) as exc:
        raise UploadError(f"{path}: not readable JSON ({exc}); fix or remove the file") from exc
    if not isinstance(obj, dict):
        raise UploadError(f"{path}: must hold a JSON object, not {type(obj).__name__}; fix or remove the file")
    return obj


class Uploader:
    def __init__(self, server: str, token: str | None, max_points: int, retries: int, timeout: float) -> None:
        if not server.startswith(("http://", "https://")):
            raise UploadError(f"--server: {server!r} is not an http(s) URL; pass e.g. http://localhost:8000")
        if max_points < 1 or retries < 1 or timeout <= 0:
            raise UploadError("--max-points, --retries and --timeout must be positive")
        self.server, self.token = server.rstrip("/"), token
        self.max_points, self.retries, self.timeout = max_points, retries, timeout

    def _call(self, method: str, path: str, body: object, key: str | None = None) -> client.Response:
        delay = 0.5
        resp = client.Response(0, None)
        for attempt in range(self.retries):
            resp = client.request(method, client.api(self.server, path), body, self.token, self.timeout, key)
            if client.classify(resp) != client.RETRY:
                return resp
            if attempt + 1 < self.retries:
                time.sleep(resp.retry_after if resp.retry_after is not None else delay)
                delay = min(delay * 2, 30.0)
        return resp

    def _check(self, resp: client.Response, what: str) -> None:
        kind = client.classify(resp)
        if kind == client.DELIVERED:
            return
        hint = f" (set {TOKEN_ENV} to the service's write token, or pass --token)" if kind == client.AUTH else ""
        if kind == client.UNKNOWN_RUN and what.startswith("creating run"):
            better = base_url_hint(self.server)
            example = better if better != self.server else "http://localhost:8000"
            hint = f" ({self.server} is not the service's base URL; give it without /api/v1, e.g. --server {example})"
        raise UploadError(f"{what}: HTTP {resp.status or 'no answer'} {resp.error or resp.body}{hint}")

    def upload(self, folder: Path) -> int:
        """Upload one run folder; returns the number of points sent."""
        run = RunInfo.from_json(_read_object(folder / RUN_FILE), str(folder / RUN_FILE))
        body = run.create_body()
        if "attach_id" in body:  # replaying a folder continues the run it holds (as a resumed process)
            body["resume"] = True
        resp = self._call("POST", "/api/v1/runs", body)
        self._check(resp, f"creating run {run.name!r}")
        body = resp.body if isinstance(resp.body, dict) else {}
        run_id = str(body.get("id", run.name))
        project = run.fields.get("project")
        sent = 0
        inflight = recover_inflight(folder)
        if inflight:
            sent += self._post([self._read_spooled(p) for p in inflight], inflight, project)
            clear_inflight(folder)
        group: list[Batch] = []
        files: list[Path] = []
        sources: list[tuple[Batch, Path | None]] = []
        if (folder / JSONL_FILE).is_file():
            try:
                sources += [(b, None) for b in iter_jsonl(folder / JSONL_FILE)]
            except (OSError, UnicodeDecodeError) as exc:
                raise UploadError(f"{folder / JSONL_FILE}: not readable UTF-8 JSONL ({exc}); fix the file") from exc
        for spooled in pending_files(folder):
            sources.append((self._read_spooled(spooled), spooled))
        for batch, path in sources:
            if batch.run != run.name:
                raise UploadError(f"{path or folder / JSONL_FILE}: batch of run {batch.run!r} in {run.name!r}'s folder")
            if group and sum(len(b.points) for b in group) + len(batch.points) > self.max_points:
                sent += self._post(group, files, project)
                group, files = [], []
            group.append(batch)
            if path is not None:
                files.append(path)
        if group:
            sent += self._post(group, files, project)
        if (folder / UPDATE_FILE).is_file():  # run fields a crashed sender had not PATCHed yet
            resp = self._call("PATCH", f"/api/v1/runs/{run_id}", _read_object(folder / UPDATE_FILE))
            if client.classify(resp) != client.REFUSED:  # refused (an older service): the data matter more
                self._check(resp, f"updating run {run.name!r}")
            (folder / UPDATE_FILE).unlink(missing_ok=True)
        status = None
        if (folder / STATUS_FILE).is_file():
            status = _read_object(folder / STATUS_FILE).get("status")
            if status is not None and not isinstance(status, str):
                raise UploadError(f"{folder / STATUS_FILE}: 'status' must be a string; fix or remove the file")
        elif run.fields.get("status") not in (None, "running"):
            status = run.fields["status"]
        if status:
            resp = self._call("PATCH", f"/api/v1/runs/{run_id}", {"status": status})
            self._check(resp, f"setting run {run.name!r} status")
            (folder / STATUS_FILE).unlink(missing_ok=True)
        if (folder / PENDING_DIR).is_dir() and not (folder / JSONL_FILE).exists():  # an HTTP sink's spool
            remove_delivered(folder, run.name)
        return sent

    @staticmethod
    def _read_spooled(path: Path) -> Batch:
        try:
            return Batch.from_json(read_json(path))
        except (OSError, ValueError, SchemaError) as exc:
            raise UploadError(f"{path}: {exc}; fix or remove the file") from exc

    def _post(self, group: list[Batch], files: list[Path], project: str | None) -> int:
        batch = merge(group)
        resp = self._call("POST", client.points_path(project), batch.to_json(), key=batch.batch_id)
        self._check(resp, f"posting {len(batch.points)} points of run {batch.run!r}")
        for path in files:
            path.unlink(missing_ok=True)
        return len(batch.points)


def run(args: argparse.Namespace) -> int:
    root: Path = args.dir
    if not root.is_dir():
        print(f"hyperwatch upload: {root} is not a folder; pass a run folder or a folder of them")
        return 2
    folders = find_run_folders(root)
    if not folders and not any(root.iterdir()):
        print(f"hyperwatch upload: {root} is empty: nothing left to upload")
        return 0
    if not folders:
        print(f"hyperwatch upload: no run folder (with {RUN_FILE}) in {root}")
        return 2
    token, _source = resolve_token(args.token)
    try:
        uploader = Uploader(args.server, token, args.max_points, args.retries, args.timeout)
    except UploadError as exc:
        print(f"hyperwatch upload: {exc}")
        return 2
    failed = 0
    for folder in folders:
        try:
            n = uploader.upload(folder)
            print(f"{folder.name}: {n} points uploaded" + ("" if folder.exists() else "; spool folder removed"))
            if (folder / DROPPED_FILE).is_file():
                dropped = _read_object(folder / DROPPED_FILE)
                print(
                    f"{folder.name}: note: {dropped.get('points')} points (steps {dropped.get('steps')}) were "
                    f"dropped by the training process while its spool was full; see {folder / DROPPED_FILE}"
                )
        except (UploadError, SinkError, SchemaError) as exc:
            failed += 1
            print(f"{folder.name}: FAILED: {exc}")
    return 1 if failed else 0
