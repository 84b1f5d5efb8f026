"""HYPERWATCH_MAX_CONCURRENT_READS: series and figure reads wait for a slot; ingest and plain reads do not."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest

from hyperwatch.monitor.api.deps import ReadSlots
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import WRITE_TOKEN, create_run, make_client, post_points


def test_slots_admit_n_at_once_and_the_next_when_one_leaves() -> None:
    async def scenario() -> list[str]:
        slots, order = ReadSlots(2), []
        gate = asyncio.Event()

        async def read(name: str) -> None:
            async with slots.hold():
                order.append(f"in {name}")
                await gate.wait()
            order.append(f"out {name}")

        tasks = [asyncio.create_task(read(n)) for n in "abc"]
        await asyncio.sleep(0.05)
        assert order == ["in a", "in b"]  # c waits for a slot
        gate.set()
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(scenario())
    assert order.index("in c") > order.index("out a")


def test_zero_means_no_limit() -> None:
    async def scenario() -> int:
        slots, inside = ReadSlots(0), 0
        gate = asyncio.Event()

        async def read() -> None:
            nonlocal inside
            async with slots.hold():
                inside += 1
                await gate.wait()

        tasks = [asyncio.create_task(read()) for _ in range(50)]
        await asyncio.sleep(0.05)
        seen = inside
        gate.set()
        await asyncio.gather(*tasks)
        return seen

    assert asyncio.run(scenario()) == 50


@pytest.mark.parametrize("limit", [1, 0])
def test_a_held_slot_holds_series_reads_back_but_not_ingest(sqlite_store: SqlStore, limit: int) -> None:
    with make_client(sqlite_store, max_concurrent_reads=limit) as client:
        run_id = create_run(client, "slots")["id"]
        post_points(client, "slots", [{"name": "loss", "step": 1, "value": 2.0}])
        release, held = threading.Event(), threading.Event()

        async def hold() -> None:  # another read, computing in the app's event loop
            async with client.app.state.read_slots.hold():  # type: ignore[attr-defined]
                held.set()
                await anyio.to_thread.run_sync(release.wait)

        holder = client.portal.start_task_soon(hold)  # type: ignore[union-attr]
        assert held.wait(30)
        try:
            with ThreadPoolExecutor(1) as pool:
                series = pool.submit(client.get, f"/api/v1/runs/{run_id}/series", params={"name": "loss"})
                post_points(client, "slots", [{"name": "loss", "step": 2, "value": 1.5}])  # ingest goes on
                assert client.get(f"/api/v1/runs/{run_id}").json()["last_step"] == 2  # plain reads too
                if limit:
                    assert not series.done(), "the series read ran while the only read slot was held"
                else:
                    assert series.result(timeout=30).status_code == 200
                release.set()
                answer = series.result(timeout=30)
        finally:
            release.set()
            holder.result(timeout=30)
        assert answer.status_code == 200, answer.text
        assert [p["step"] for p in answer.json()["points"]] in ([1], [1, 2])


def test_serve_names_the_setting_and_the_flag_of_a_bad_limit(tmp_path: object) -> None:
    db = f"sqlite:///{tmp_path}/x.db"
    cmd = [sys.executable, "-m", "hyperwatch", "serve", "--db", db, "--max-concurrent-reads", "-1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "HYPERWATCH_MAX_CONCURRENT_READS / --max-concurrent-reads: Input should be greater" in done.stderr


@pytest.mark.parametrize(
    ("url", "given", "expected"),
    [
        ("sqlite:///hw.db", None, 1),  # reads in the service's process, under its GIL
        ("postgresql+psycopg://u@h:5432/d", None, 8),  # reads waiting on the server overlap
        ("postgresql+psycopg://u@h:5432/d", 0, 0),
        ("sqlite:///hw.db", 3, 3),
    ],
)
def test_the_default_follows_the_database(url: str, given: int | None, expected: int) -> None:
    extra = {} if given is None else {"max_concurrent_reads": given}
    settings = Settings(database_url=url, write_token=WRITE_TOKEN, **extra)  # type: ignore[arg-type]
    assert settings.concurrent_reads() == expected


def test_the_service_takes_the_database_default(sqlite_store: SqlStore) -> None:
    assert make_client(sqlite_store).app.state.read_slots.n == 1  # type: ignore[attr-defined]
