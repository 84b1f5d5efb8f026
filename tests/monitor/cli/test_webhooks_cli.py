"""``hyperwatch webhooks add|list|test|remove`` over the real service's HTTP API (SQLite; the API's own
tests cover both databases)."""

from __future__ import annotations

import pytest

from hyperwatch.cli import main
from hyperwatch.monitor.store import SqlStore
from tests.monitor.alerting.test_webhooks import SECRET, Receiver
from tests.monitor.conftest import WRITE_TOKEN
from tests.monitor.live_server import serve


def test_add_list_test_remove(sqlite_store: SqlStore, capsys: pytest.CaptureFixture[str]) -> None:
    receiver = Receiver()
    try:
        with serve(sqlite_store, webhook_delivery=False) as base:
            http = ["--server", base, "--token", WRITE_TOKEN]
            assert main(["webhooks", "add", "proj", receiver.url, "--format", "generic", "--name", "#ml", *http]) == 0
            assert main(["webhooks", "list", "proj", *http]) == 0
            assert main(["webhooks", "test", "proj", "1", *http]) == 0
            assert main(["webhooks", "remove", "proj", "1", *http]) == 0
            assert main(["webhooks", "list", "proj", *http]) == 0
            assert main(["webhooks", "add", "proj", "ftp://x.org/a", *http]) == 1
            wrong = ["--server", base, "--token", "wrong-token-0123456789"]
            assert main(["webhooks", "add", "proj", receiver.url, *wrong]) == 1  # a change needs the write token
    finally:
        receiver.close()
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("saved 1 #ml generic >= warning http://127.0.0.1:")
    assert lines[1].startswith("1 #ml generic") and "0 delivered, 0 pending, 0 failed; never sent" in lines[1]
    assert lines[2] == "delivered: the receiver answered HTTP 200"
    assert lines[3].startswith("removed 1 #ml")
    assert lines[4] == "project 'proj' has no webhooks"
    assert SECRET not in out and "http:// or https://" in err and "write token" in err
    assert receiver.requests[0][2]["event"] == "test"
