"""The hooks repair a run's config before sending; the service checks it with the same rules."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from hyperwatch.hooks.jsonsafe import MAX_JSON_DEPTH, check_json, sanitize_json
from hyperwatch.hooks.schema import SchemaError
from hyperwatch.hooks.sinks import RunInfo


def deep(n: int) -> dict[str, object]:
    obj: dict[str, object] = {}
    for _ in range(n):
        obj = {"a": obj}
    return obj


def test_sanitize_repairs_what_json_cannot_carry_and_check_accepts_the_result() -> None:
    raw = {
        "data_dir": os.fsdecode(b"/data/caf\xe9"),
        "odd": "x\ud800y",
        os.fsdecode(b"k\xff"): 1,
        "out": Path("/tmp/o"),
        "vals": (1.0, math.nan, math.inf, -math.inf),
        "set": {2, 1},
        "deep": deep(MAX_JSON_DEPTH + 10),
        3: "int key",
    }
    got = sanitize_json(raw)
    assert got["data_dir"] == "/data/caf\\xe9" and got["odd"] == "x\\ud800y" and got["k\\xff"] == 1
    assert got["out"] == "/tmp/o" and got["vals"] == [1.0, "NaN", "Infinity", "-Infinity"] and got["set"] == [1, 2]
    assert got["3"] == "int key"
    assert check_json(got) == got
    json.dumps(got, allow_nan=False).encode("utf-8")  # sendable as strict UTF-8 JSON


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"d": os.fsdecode(b"/x\xe9")}, "config.d"),
        ({"l": [1, "\udce9"]}, "config.l[1]"),
        ({"x": deep(MAX_JSON_DEPTH)}, "nested deeper"),
        ({"p": Path("/x")}, "config.p"),
    ],
)
def test_check_names_the_path_of_the_first_bad_value(bad: dict[str, object], where: str) -> None:
    with pytest.raises(SchemaError, match=__import__("re").escape(where)):
        check_json(bad)


def test_check_is_iterative_and_sanitize_bounded_on_a_hostile_depth() -> None:
    with pytest.raises(SchemaError, match="nested deeper"):
        check_json(deep(100_000))
    check_json(sanitize_json(deep(100_000)))


def test_run_info_sends_a_repaired_config() -> None:
    info = RunInfo("r1", config={"d": os.fsdecode(b"/caf\xe9"), "eps": math.nan}, fields={"summary": {"x": math.inf}})
    body = json.loads(json.dumps(info.to_json(), allow_nan=False))
    attach_id, resume = body.pop("attach_id"), body.pop("resume")  # the process's identity (issue 24)
    assert len(attach_id) == 32 and int(attach_id, 16) >= 0 and resume is False
    assert body == {"name": "r1", "config": {"d": "/caf\\xe9", "eps": "NaN"}, "summary": {"x": "Infinity"}}
