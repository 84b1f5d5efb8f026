"""``hyperwatch runs delete|archive|unarchive`` (issue 35): over the real service's HTTP API with the write
token, and on the database directly (``--db``); on SQLite and PostgreSQL."""

from __future__ import annotations

import argparse

import pytest
from fastapi.testclient import TestClient

from hyperwatch.cli import main
from hyperwatch.monitor.cli import runs
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import WRITE_TOKEN, create_run, post_points
from tests.monitor.live_server import serve


def _args(*argv: str) -> argparse.Namespace:
    return runs.build_parser("hyperwatch runs").parse_args(list(argv))


def _names(store: SqlStore, archived: bool | None = False) -> list[str]:
    return [r.name for r in store.list_runs(archived=archived)]


def test_over_http_archive_unarchive_and_delete_after_typing_the_name(client: TestClient, store: SqlStore) -> None:
    for name in ("keep", "scratch"):
        create_run(client, name, group="g")
        post_points(client, name, [{"name": "loss", "layer": None, "step": 0, "value": 1.0}])
    with serve(store) as base:
        http = ("--server", base, "--token", WRITE_TOKEN)
        assert runs.act(_args("archive", "default/scratch", *http)) == "archived run default/scratch (id 2)"
        assert _names(store) == ["keep"]
        assert runs.act(_args("unarchive", "scratch", *http)) == "unarchived run default/scratch (id 2)"
        assert _names(store) == ["keep", "scratch"]
        with pytest.raises(runs._Failed, match="not deleted"):
            runs.act(_args("delete", "2", *http), ask=lambda _prompt: "keep")
        assert _names(store) == ["keep", "scratch"]
        prompts: list[str] = []

        def ask(prompt: str) -> str:
            prompts.append(prompt)
            return "scratch"

        line = runs.act(_args("delete", "2", *http), ask=ask)
        assert line == "deleted run default/scratch (id 2): 1 series"
        assert "cannot be undone" in prompts[0] and "scratch" in prompts[0]
        assert _names(store, None) == ["keep"]
        with pytest.raises(runs._Failed, match="write token"):  # the service refuses without it
            runs.act(_args("archive", "1", "--server", base, "--token", "wrong"))
        with pytest.raises(runs._Failed, match="no run 'gone'"):
            runs.act(_args("archive", "default/gone", *http))


def test_on_the_database_with_yes(client: TestClient, store: SqlStore, capsys: pytest.CaptureFixture[str]) -> None:
    create_run(client, "a")
    create_run(client, "b", project="other")
    url = store.engine.url.render_as_string(hide_password=False)
    assert main(["runs", "archive", "other/b", "--db", url]) == 0
    assert _names(store, True) == ["b"]
    assert main(["runs", "delete", "other/b", "--db", url, "--yes"]) == 0
    assert "deleted run other/b (id 2): 0 series" in capsys.readouterr().out
    assert _names(store, None) == ["a"]
    assert main(["runs", "delete", "7", "--db", url, "--yes"]) == 1
    assert "run id 7 not found" in capsys.readouterr().err
