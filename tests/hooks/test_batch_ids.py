"""The hooks' batch ids (``hooks.schema.new_batch_id``): a writer session and each run's batch number, so
the service keeps a run's ids as one range (issue 36); merged requests take their range's id; a forked
child is a session of its own."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hyperwatch.hooks import schema
from hyperwatch.hooks.schema import Batch, Point, SchemaError, range_batch_id, sequence_range
from hyperwatch.hooks.sinks.folder import merge, merged_id

SESSION = "0123456789abcdef" * 2


def test_ids_count_each_runs_batches_within_the_session() -> None:
    a = [Batch("ids-run-a", []).batch_id for _ in range(3)]
    b = Batch("ids-run-b", []).batch_id
    a.append(Batch("ids-run-a", []).batch_id)
    parsed = [sequence_range(i) for i in a]
    assert all(p is not None for p in parsed)
    sessions = {p[0] for p in parsed if p}
    assert sessions == {schema._session} and len(schema._session) == 32
    numbers = [p[1] for p in parsed if p]
    assert numbers == list(range(numbers[0], numbers[0] + 4)), "another run's batch took a number of this run's"
    assert sequence_range(b) == (schema._session, 0, 0)  # runs count apart
    assert Batch.from_json(Batch("ids-run-a", [Point("loss", 1, 1.0)]).to_json()).batch_id != a[-1]


def test_sequence_ids_parse_and_other_ids_do_not() -> None:
    assert sequence_range(f"{SESSION}-ff") == (SESSION, 255, 255)
    assert sequence_range(f"{SESSION}-a-1f") == (SESSION, 10, 31)
    assert range_batch_id(SESSION, 10, 31) == f"{SESSION}-a-1f" and range_batch_id(SESSION, 7, 7) == f"{SESSION}-7"
    assert sequence_range(f"{SESSION}-1f-a") == (SESSION, 10, 31)  # written high to low: the same numbers
    for other in (SESSION, f"{SESSION.upper()}-1", f"{SESSION}-", f"{SESSION}-1-2-3", f"{SESSION}-1g", "m" + SESSION):
        assert sequence_range(other) is None, other
    longest = range_batch_id(SESSION, 2**48 - 2, 2**48 - 1)
    assert len(longest) <= 64 and Batch.from_json({"batch_id": longest, "run": "r", "points": []}).batch_id == longest
    with pytest.raises(SchemaError, match="batch_id"):
        Batch.from_json({"batch_id": f"{SESSION}-1.5", "run": "r", "points": []})


def test_merged_batches_take_their_ranges_id_when_consecutive() -> None:
    ids = [f"{SESSION}-{n:x}" for n in (12, 10, 11)]  # spooled out of order by two threads: still a range
    assert merged_id(ids) == f"{SESSION}-a-c"
    assert merged_id([f"{SESSION}-a-b", f"{SESSION}-c"]) == f"{SESSION}-a-c"  # a group resent after a split
    gap = [f"{SESSION}-a", f"{SESSION}-c"]  # a batch dropped between them (the spool was full)
    two = [f"{SESSION}-a", f"{'f' * 32}-b"]  # two processes' batches in one spool
    for ids in (gap, two, [f"{SESSION}-a", "my-own-batch-1"], [f"{SESSION}-a", f"{SESSION}-a"]):
        merged = merged_id(ids)
        assert merged.startswith("m") and sequence_range(merged) is None and merged == merged_id(ids), ids
    batches = [Batch("r", [Point("loss", n, 1.0)], batch_id=f"{SESSION}-{n:x}") for n in range(3)]
    assert merge(batches).batch_id == f"{SESSION}-0-2" and len(merge(batches).points) == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_is_a_session_of_its_own_even_with_the_lock_held() -> None:
    parent = Batch("fork-run", []).batch_id
    read, write = os.pipe()
    with schema._id_lock:  # another thread of the training process is making an id at the fork
        pid = os.fork()
        if pid == 0:
            os.write(write, Batch("fork-run", []).batch_id.encode())
            os._exit(0)
        deadline = time.monotonic() + 20
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child hung on the parent's lock"
    child = os.read(read, 100).decode()
    os.close(read)
    os.close(write)
    mine, theirs = sequence_range(parent), sequence_range(child)
    assert mine and theirs and theirs[0] != mine[0] and theirs[1] == 0  # its own session, counting from 0
    assert sequence_range(Batch("fork-run", []).batch_id) == (mine[0], mine[1] + 1, mine[1] + 1)
