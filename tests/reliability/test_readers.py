"""File readers under hostile bytes (hypothesis): a clear, documented exception or a result, never a crash.

- ``trainer.data.packed.read_header`` / ``read_packed``: :class:`trainer.data.errors.DataError` only.
- ``hyperwatch upload`` over a spool or JSONL folder: :class:`hooks.upload.UploadError`,
  :class:`hooks.sinks.SinkError` or :class:`hooks.schema.SchemaError` only (the CLI prints them).
- ``trainer.sweep.load_sweep``: :class:`trainer.config.ConfigError` only.
"""

from __future__ import annotations

import json
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import SchemaError
from hyperwatch.hooks.sinks import SinkError
from hyperwatch.hooks.upload import Uploader, UploadError
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate
from tests.reliability.support import WRITE_TOKEN, free_port

FAST = settings(
    max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True
)

# -- LITPKDS token files ---------------------------------------------------------------------------
packed = pytest.importorskip("hyperwatch.trainer.data.packed")
DataError = pytest.importorskip("hyperwatch.trainer.data.errors").DataError


@st.composite
def packed_bytes(draw: st.DrawFn) -> bytes:
    """Mostly plausible headers (right magic, random fields, random payload), sometimes pure noise."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=64))
    version = draw(st.sampled_from([1, 1, 1, 0, 2, 2**64 - 1]))
    code = draw(st.integers(0, 255))
    chunk = draw(st.one_of(st.integers(0, 32), st.integers(0, 2**64 - 1)))
    payload = draw(st.binary(max_size=256))
    return struct.pack("<7sQBQ", b"LITPKDS", version, code, chunk) + payload


@FAST
@given(raw=packed_bytes())
def test_packed_reader_raises_only_data_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train-0.bin"
        path.write_bytes(raw)
        try:
            tokens = packed.read_packed(path)
        except DataError as exc:
            assert str(path) in str(exc)  # the message names the file
            return
        header = packed.read_header(path)
        assert len(tokens) == header.chunk_size and tokens.dtype == header.dtype
        del tokens  # release the memmap before the folder goes


# -- hyperwatch upload over a hostile spool ---------------------------------------------------------
@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore(f"sqlite:///{tmp}/up.db")
        migrate.upgrade(store.engine)
        app = create_app(
            Settings(database_url="sqlite://", write_token=WRITE_TOKEN), store=store, registry=CollectorRegistry()
        )
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
        server.should_exit = True
        thread.join(10)
        store.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
run_docs = st.one_of(
    json_values,
    st.fixed_dictionaries({"name": st.sampled_from(["fz-1", "", "../x", "a" * 300])}, optional={"config": json_values}),
)
batch_docs = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "batch_id": st.sampled_from(["fuzz-batch-01", "x", "fuzz-batch-02"]),
            "run": st.sampled_from(["fz-1", "other"]),
            "points": st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["loss", "lossy"]), "step": json_values | st.integers(0, 9)},
                    optional={"value": json_values, "layer": json_values},
                ),
                max_size=3,
            ),
        }
    ),
)
file_bytes = st.one_of(
    st.binary(max_size=80),
    json_values.map(lambda v: json.dumps(v).encode()),
    batch_docs.map(lambda v: json.dumps(v).encode()),
)


VALID_RUN = b'{"name": "fz-1", "status": "finished"}'


@settings(FAST, max_examples=120)
@given(
    run=st.one_of(
        st.just(VALID_RUN), st.just(VALID_RUN), st.just(VALID_RUN), run_docs.map(lambda v: json.dumps(v).encode())
    )
    | st.binary(max_size=40),
    pending=st.lists(file_bytes, max_size=3),
    jsonl=st.none() | st.lists(file_bytes, max_size=3).map(lambda lines: b"\n".join(lines)),
    status=st.none() | file_bytes,
    inflight=st.none() | file_bytes | st.just(b'{"files": ["000000000000-a.json"]}'),
)
def test_upload_reads_hostile_spools_with_clear_errors(
    live_url: str, run: bytes, pending: list[bytes], jsonl: bytes | None, status: bytes | None, inflight: bytes | None
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "fz-1"
        (folder / "pending").mkdir(parents=True)
        (folder / "run.json").write_bytes(run)
        for i, raw in enumerate(pending):
            (folder / "pending" / f"{i:012d}-a.json").write_bytes(raw)
        for name, extra in (("batches.jsonl", jsonl), ("status.json", status), ("inflight.json", inflight)):
            if extra is not None:
                (folder / name).write_bytes(extra)
        uploader = Uploader(live_url, WRITE_TOKEN, max_points=1000, retries=1, timeout=10)
        try:
            sent = uploader.upload(folder)
        except (UploadError, SinkError, SchemaError) as exc:
            assert str(exc)  # a message for the user
            return
        assert sent >= 0


# -- sweep TOML files ----------------------------------------------------------------------------------
sweep_mod = pytest.importorskip("hyperwatch.trainer.sweep")
ConfigError = pytest.importorskip("hyperwatch.trainer.config").ConfigError

toml_lines = st.sampled_from(
    [
        "[sweep]",
        "[base]",
        "[grid]",
        "[other]",
        "sweep = 1",
        "grid = 'x'",
        'name = "s1"',
        "name = 3",
        "workers = 0",
        "workers = 2",
        "workers = 'many'",
        "depth = [2, 4]",
        "depth = []",
        "depth = 'x'",
        "lr = [0.001]",
        "model.qk_norm = [true]",
        "nope = [1]",
        "[base.model]",
        "depth = 2",
        "preset = 'tiny'",
        "base = [1]",
        "\x00",
        "= =",
    ]
)


@FAST
@example(doc="sweep = 1")
@given(doc=st.lists(toml_lines, max_size=8).map("\n".join) | st.binary(max_size=60).map(lambda b: b.decode("latin-1")))
def test_sweep_loader_raises_only_config_error(doc: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.toml"
        path.write_text(doc, encoding="utf-8", errors="surrogateescape")
        try:
            sweep = sweep_mod.load_sweep(path)
        except ConfigError as exc:
            assert str(exc)
            return
        assert sweep.runs is not None
