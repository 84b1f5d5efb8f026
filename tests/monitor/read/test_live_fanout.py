"""Live news fanned out once (issue 37), on SQLite and PostgreSQL, over real HTTP: N watchers of a run
cost one read of it per new step (counted on the store's engine), every watcher gets every point, and
live requests over the caps are told to retry before their stream starts."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH
from tests.monitor.live_server import Stream, post, read_stream, serve, until, waiting

LAYERS = 3


def _step(s: int) -> list[dict[str, Any]]:
    z = [{"name": "attention_z", "layer": la, "step": s, "tokens": 1000 * (s + 1), "value": 10.0 + s + la}
         for la in range(LAYERS)]  # fmt: skip
    return [*z, {"name": "loss", "layer": None, "step": s, "tokens": 1000 * (s + 1), "value": 5.0 - 0.1 * s}]


async def _seed(client: httpx.AsyncClient, name: str, steps: range) -> int:
    r = await client.post("/api/v1/runs", json={"name": name, "total_steps": 100, "tokens": 100_000}, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    for s in steps:
        await post(client, name, _step(s))
    return int(r.json()["id"])


class Selects:
    """The SELECT statements run on the store's engine, by the thread that ran them."""

    def __init__(self, store: SqlStore) -> None:
        self.engine, self.lock, self.seen = store.engine, threading.Lock(), list[tuple[str, str]]()
        event.listen(self.engine, "before_cursor_execute", self._on)

    def _on(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            with self.lock:
                self.seen.append((threading.current_thread().name, statement))

    def take(self) -> list[tuple[str, str]]:
        with self.lock:
            out, self.seen = self.seen, []
        return out

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._on)


def _waiting_at_least(run_id: int, n: int) -> bool:
    return waiting(run_id) >= n


def _all_drew(streams: list[Stream], step: int) -> bool:
    """Every stream has drawn ``step`` (of the loss, or of the heatmap for those that ask no loss)."""
    return all(step in max(s.steps("loss", "run"), s.steps("attention_z", "heat"), key=len) for s in streams)


def _run_rows(found: list[tuple[str, str]]) -> int:
    """Reads of a run's row (``store.get_run``)."""
    return sum(st.lstrip().startswith("SELECT runs.id,") for _thread, st in found)


async def _reads_per_step(base: str, store: SqlStore, counts: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """For each N in ``counts``: N streams wait on the run at its last step, one step is posted, and the
    SELECTs run until every stream has drawn it are counted, less those of the same post unwatched:
    (reads of the run's row, all statements)."""
    selects = Selects(store)
    out: dict[int, tuple[int, int]] = {}
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=None)) as c:
            rid = await _seed(c, "fan", range(3))
            step = 3
            for n in counts:
                # the same post with nobody watching: what the write itself reads
                selects.take()
                await post(c, "fan", _step(step))
                alone = selects.take()
                step += 1
                params = {"cursor": f"{rid}:{step - 1}:running", "name": ["attention_z", "loss"], "wait": 30, "gap": 0}
                streams = [Stream(params) for _ in range(n)]
                tasks = [asyncio.create_task(read_stream(c, s)) for s in streams]
                await until(partial(_waiting_at_least, rid, n), what=f"{n} streams waiting")
                await asyncio.sleep(0.2)  # the streams' own checks before they wait are done
                selects.take()
                await post(c, "fan", _step(step))
                await until(partial(_all_drew, streams, step), what="the step drawn")
                watched = selects.take()
                out[n] = (_run_rows(watched) - _run_rows(alone), len(watched) - len(alone))
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                step += 1
    finally:
        selects.close()
    return out


def test_n_watchers_of_a_run_cost_one_read_per_step(store: SqlStore) -> None:
    """1 and 40 streams on one run: the new step costs one read of the run's row, and all 40 draw it.
    Before, each watcher read it (and its delta) in the request thread pool: 40 reads and more."""
    with serve(store, live_max_per_client=100) as base:
        reads = asyncio.run(_reads_per_step(base, store, (1, 40)))
    assert reads[1][0] == reads[40][0] == 1, reads
    # besides: the run's tags, whether its newest points are still this process's (they are served from
    # the store's memory), and the run's alerts when their cache is due: the same for 1 and for 40
    assert reads[40][1] <= 4 and reads[40][1] <= reads[1][1] + 1, reads


async def _deliver(base: str) -> list[Stream]:
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=None)) as c:
        rid = await _seed(c, "every", range(3))
        asks: list[dict[str, Any]] = [
            {"name": ["attention_z", "loss"], "line": ["mean", "max"]},
            {"name": ["attention_z"], "line": ["heat", "1"]},
            {"name": ["loss"], "x": "tokens"},
        ]
        streams = [Stream({"cursor": f"{rid}:2:running", "wait": 30, "gap": 0, **asks[i % 3]}) for i in range(24)]
        tasks = [asyncio.create_task(read_stream(c, s)) for s in streams]
        await until(lambda: waiting(rid) >= len(streams), what="the streams waiting")
        for step in range(3, 9):
            await post(c, "every", _step(step))
            if step % 2:  # every other step waits for the streams; the others arrive while they answer
                await until(partial(_all_drew, streams, step), what=f"step {step}")
        await until(lambda: _all_drew(streams, 8), what="the last step")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return streams


def test_every_watcher_gets_every_point(store: SqlStore) -> None:
    """24 streams asking three different questions (lines, heatmap and a layer, x in tokens) while 6
    steps are stored, some faster than the streams answer: each gets each step once, with its values;
    streams asking the same question receive the same bytes."""
    with serve(store) as base:
        streams = asyncio.run(_deliver(base))
    want = list(range(3, 9))
    for i, s in enumerate(streams):
        assert s.status == 200
        if i % 3 == 0:
            assert s.steps("loss", "run") == want and s.steps("attention_z", "mean") == want
            assert [y for ev in s.events for y in ev["runs"][0]["series"]["attention_z"]["max"]["y"]] == [
                12.0 + k for k in want
            ]
        elif i % 3 == 1:
            assert s.steps("attention_z", "heat") == want and s.steps("attention_z", "1") == want
            assert [y for ev in s.events for y in ev["runs"][0]["series"]["attention_z"]["1"]["y"]] == [
                11.0 + k for k in want
            ]
        else:
            assert [x for ev in s.events for x in ev["runs"][0]["series"]["loss"]["run"]["x"]] == [
                1000 * (k + 1) for k in want
            ]
    by_question: dict[str, set[bytes]] = {}
    for i, s in enumerate(streams):
        # streams of one question that drew the same steps in the same answers got the same bytes
        by_question.setdefault(f"{i % 3}:{[len(ev['runs'][0]['series']) for ev in s.events]}", set()).add(
            b"".join(s.raw)
        )
    assert all(len(v) == 1 for v in by_question.values()), by_question.keys()


async def _caps(base: str) -> dict[str, Stream]:
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=None)) as c:
        rid = await _seed(c, "capped", range(2))
        params: dict[str, Any] = {"cursor": f"{rid}:1:running", "name": "loss", "wait": 30, "gap": 0}
        got = {k: Stream(params) for k in ("a1", "a2", "a3", "b1", "c1", "poll", "a_again")}
        a = {"X-Forwarded-For": "10.0.0.1"}  # uvicorn trusts the proxy on 127.0.0.1: the client is the address
        open_ = [asyncio.create_task(read_stream(c, got["a1"], a)), asyncio.create_task(read_stream(c, got["a2"], a))]
        await until(lambda: waiting(rid) >= 2, what="two streams of client a")
        await read_stream(c, got["a3"], a)  # a third of client a: its share is 2
        open_.append(asyncio.create_task(read_stream(c, got["b1"], {"X-Forwarded-For": "10.0.0.2"})))
        await until(lambda: waiting(rid) >= 3, what="client b's stream")
        await read_stream(c, got["c1"], {"X-Forwarded-For": "10.0.0.3"})  # 3 open: the service's limit
        r = await c.get("/api/v1/live", params={**params, "wait": 0}, headers={"X-Forwarded-For": "10.0.0.4"})
        got["poll"].status, got["poll"].headers, got["poll"].detail = r.status_code, dict(r.headers), r.text
        assert (await c.get("/healthz")).status_code == 200  # other routes are not counted
        open_[0].cancel()  # one of client a's streams closes: a may open one again
        await asyncio.gather(open_[0], return_exceptions=True)
        await until(lambda: waiting(rid) <= 2, what="the closed stream gone")
        await asyncio.sleep(0.2)
        open_.append(asyncio.create_task(read_stream(c, got["a_again"], a)))
        await until(lambda: waiting(rid) >= 3, what="client a's new stream")
        await post(c, "capped", _step(2))
        await until(lambda: all(2 in got[k].steps("loss", "run") for k in ("a2", "b1", "a_again")), what="news")
        for t in open_:
            t.cancel()
        await asyncio.gather(*open_, return_exceptions=True)
    return got


def test_live_caps_refuse_the_excess_with_retry_after(sqlite_store: SqlStore) -> None:
    """At most 2 live requests per client and 3 in all: the third of one client gets 429, a fourth in
    all 503 (long poll too), both with Retry-After and the setting's name; a slot freed is usable again
    and the streams let in still get their news."""
    with serve(sqlite_store, live_max_per_client=2, live_max_total=3) as base:
        got = asyncio.run(_caps(base))
    assert got["a3"].status == 429 and got["a3"].headers["retry-after"].isdigit()
    assert "HYPERWATCH_LIVE_MAX_PER_CLIENT" in got["a3"].detail and "10.0.0.1" in got["a3"].detail
    for k in ("c1", "poll"):
        assert got[k].status == 503 and got[k].headers["retry-after"].isdigit(), got[k]
        assert "HYPERWATCH_LIVE_MAX_TOTAL" in got[k].detail
    assert got["a_again"].status == 200 and got["a_again"].steps("loss", "run") == [2]


@pytest.mark.parametrize("bad", [{"live_max_per_client": 0}, {"live_max_total": 0}, {"live_read_threads": 0}])
def test_live_settings_are_checked(bad: dict[str, int]) -> None:
    from pydantic import ValidationError

    from hyperwatch.monitor.core.config import Settings

    with pytest.raises(ValidationError, match=next(iter(bad))):
        Settings(dev_mode=True, **bad)  # type: ignore[arg-type]
