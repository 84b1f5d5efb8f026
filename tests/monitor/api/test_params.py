"""Every number in a URL is read by one strict rule (monitor/api/params.py, issue 37).

``str.isdigit()`` took ``"²"`` (then ``int()`` refused it: a 500), pydantic took blanks, ``1_0`` and
``+1``, and nothing bounded the size (a 20-digit ``line`` cut a live stream on SQLite). Here every
numeric query and path parameter of the API and the pages gets the odd inputs the fuzzer finds, on
SQLite and PostgreSQL: each is a 4xx naming the parameter, never a 5xx, and a stream never starts.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hyperwatch.hooks.schema import MAX_LAYER
from hyperwatch.monitor.api.params import (
    MAX_ROW_ID,
    ParameterError,
    parse_float,
    parse_int,
    parse_line,
)
from hyperwatch.monitor.read.reader import layer_number
from tests.monitor.conftest import create_run, post_points

TWENTY_DIGITS = "9" * 20
ODD_INTS = ["²", "１２", "٣", TWENTY_DIGITS, "-1", "", " 12", "12 ", "1_0", "+1", "1.0", "0x10", "1e3", "NaN"]
"""Superscript, full-width and Arabic-Indic digits, 20 digits, negative, empty, blanks, and what
pydantic or int() would otherwise read (underscore, sign, decimal point)."""
ODD_FLOATS = ["²", "１", TWENTY_DIGITS + "e300", "-1", "", " 1", "1 ", "1_0", "nan", "inf", "-inf", "1e400", "0x1"]


@pytest.mark.parametrize("text", ODD_INTS)
def test_parse_int_refuses_anything_but_ascii_digits_in_range(text: str) -> None:
    with pytest.raises(ParameterError) as err:
        parse_int(text, "limit", 0, 1000)
    assert str(err.value).startswith("limit: ") and "0 to 1000" in str(err.value)


def test_parse_int_reads_ascii_digits_and_a_sign_only_where_negative_makes_sense() -> None:
    assert parse_int("0", "n", 0, 9) == 0
    assert parse_int("007", "n", 0, 9) == 7
    assert parse_int("-1", "step", -1, 10) == -1
    assert parse_int("+3", "step", -1, 10) == 3
    with pytest.raises(ParameterError, match="out of range"):
        parse_int("-2", "step", -1, 10)
    with pytest.raises(ParameterError, match="ASCII digits"):
        parse_int("9" * 10_000, "n", 0, 9)  # refused before int() reads it


@pytest.mark.parametrize("text", ODD_FLOATS)
def test_parse_float_refuses_non_finite_blank_and_non_ascii_text(text: str) -> None:
    with pytest.raises(ParameterError) as err:
        parse_float(text, "wait", 0, 30)
    assert str(err.value).startswith("wait: ")


def test_parse_float_reads_decimals_and_exponents_in_range() -> None:
    assert parse_float("0.5", "gap", 0, 10) == 0.5
    assert parse_float("3e21", "flops", 0, None, lo_open=True) == 3e21
    assert parse_float(".5", "level", 0, 1, lo_open=True, hi_open=True) == 0.5
    for edge in ("0", "1"):
        with pytest.raises(ParameterError, match="above 0 and below 1"):
            parse_float(edge, "level", 0, 1, lo_open=True, hi_open=True)


def test_line_choices_are_canonical_and_layer_numbers_bounded() -> None:
    modes = ("mean", "max", "heat")
    assert [parse_line(t, "line", modes) for t in ("mean", "heat", "3", "007")] == ["mean", "heat", "3", "7"]
    assert layer_number("7") == 7 and layer_number("mean") is None and layer_number("²") is None
    for bad in ("²", "３", str(MAX_LAYER + 1), TWENTY_DIGITS, "-1", "", " 3", "Mean"):
        with pytest.raises(ParameterError, match=r"^line: "):
            parse_line(bad, "line", modes)


def _seeded(client: TestClient) -> tuple[int, int]:
    run = create_run(client, "r1", group="g", total_params=10**6, tokens=10**9, total_steps=100)
    post_points(client, "r1", [{"name": "attention_z", "layer": i % 2, "step": i, "value": 1.0} for i in range(20)])
    return int(str(run["id"])), int(str(run["group_id"]))


def _numeric_parameters(rid: int, gid: int) -> list[tuple[str, str, str]]:
    """(url with ``{v}`` where the odd value goes, the parameter named in the answer, its kind: int,
    float or step, a signed integer from -1)."""
    live = f"/api/v1/live?cursor={rid}:-1&name=attention_z&wait=0"
    stream = f"/api/v1/live/stream?cursor={rid}:-1&name=attention_z&wait=0"
    return [
        ("/api/v1/runs?limit={v}", "limit", "int"),
        ("/api/v1/runs?offset={v}", "offset", "int"),
        ("/api/v1/alerts?limit={v}", "limit", "int"),
        ("/api/v1/alerts?offset={v}", "offset", "int"),
        ("/api/v1/incidents?offset={v}", "offset", "int"),
        (f"/api/v1/runs/{rid}/series?name=attention_z&layer={{v}}", "layer", "int"),
        (f"/api/v1/runs/{rid}/series?name=attention_z&buckets={{v}}", "buckets", "int"),
        (f"/api/v1/runs/{rid}/series?name=attention_z&layer=0&start={{v}}", "start", "int"),
        (f"/api/v1/runs/{rid}/series?name=attention_z&layer=0&end={{v}}", "end", "int"),
        (f"/api/v1/runs/{rid}/layers?name=attention_z&buckets={{v}}", "buckets", "int"),
        (f"/api/v1/runs/{rid}/layers?name=attention_z&start={{v}}", "start", "int"),
        (f"/api/v1/compare?run_id={rid}&name=attention_z&layer={{v}}", "layer", "int"),
        (f"/api/v1/compare?run_id={rid}&name=attention_z&buckets={{v}}", "buckets", "int"),
        (f"/api/v1/groups/{gid}/stability?buckets={{v}}", "buckets", "int"),
        (f"/api/v1/groups/{gid}/stability?rtol={{v}}", "rtol", "float"),
        (f"/api/v1/groups/{gid}/stability?atol={{v}}", "atol", "float"),
        (f"/api/v1/groups/{gid}/forecast?params={{v}}", "params", "float"),
        (f"/api/v1/groups/{gid}/forecast?flops={{v}}", "flops", "float"),
        (f"/api/v1/groups/{gid}/forecast?level={{v}}", "level", "float"),
        (f"/api/v1/groups/{gid}/forecast?buckets={{v}}", "buckets", "int"),
        (f"/api/v1/runs/{rid}/forecast?level={{v}}", "level", "float"),
        (live + "&every={v}", "every", "int"),
        (live + "&alert_after={v}", "alert_after", "int"),
        (live + "&wait={v}", "wait", "float"),
        (live + "&line={v}", "line", "int"),
        (f"/api/v1/live?cursor={rid}:{{v}}&name=attention_z&wait=0", "cursor", "step"),
        ("/api/v1/live?cursor={v}:-1&name=attention_z&wait=0", "cursor", "int"),
        (stream + "&line={v}", "line", "int"),
        (stream + "&gap={v}", "gap", "float"),
        (stream + "&wait={v}", "wait", "float"),
        (f"/ui/data/compare?run_id={rid}&layer={{v}}", "layer", "int"),
        (f"/ui/data/compare?run_id={rid}&buckets={{v}}", "buckets", "int"),
        ("/ui/data/alerts?limit={v}", "limit", "int"),
        (f"/ui/data/groups/{gid}/forecast?target={{v}}", "target", "float"),
    ]


def test_every_numeric_parameter_answers_odd_text_with_a_422_naming_it(client: TestClient) -> None:
    rid, gid = _seeded(client)
    wrong: list[str] = []
    for url, field, kind in _numeric_parameters(rid, gid):
        for odd in ODD_INTS if kind in ("int", "step") else ODD_FLOATS:
            if kind == "step" and odd in ("-1", "+1"):
                continue  # a cursor step of -1 is "nothing drawn yet"; a signed number may carry its +
            with client.stream("GET", url.format(v=odd)) as r:
                body = r.read().decode()
                ctype = r.headers.get("content-type", "")
            if r.status_code != 422 or field not in body or "event-stream" in ctype:
                wrong.append(f"{url.format(v=odd)!r}: {r.status_code} {body[:160]}")
    assert not wrong, "\n".join(wrong)


def test_the_live_stream_with_a_bad_line_never_starts(client: TestClient) -> None:
    """``line=²`` was a 200 and a cut stream; a 20-digit line cut it on SQLite after the 200."""
    rid, _ = _seeded(client)
    for line in ("²", TWENTY_DIGITS, str(MAX_LAYER + 1), "１"):
        with client.stream("GET", f"/api/v1/live/stream?cursor={rid}:-1&name=attention_z&line={line}&wait=1") as r:
            assert r.status_code == 422, line
            assert r.headers["content-type"].startswith("application/json")
            r.read()
            assert "line" in r.json()["message"] and "0 to 4096" in r.json()["message"]
    with client.stream("GET", f"/api/v1/live/stream?cursor={MAX_ROW_ID}:-1&name=attention_z&wait=1") as r:
        r.read()
        assert r.status_code == 404  # an unknown run: said before the stream starts, not a cut stream
        assert r.headers["content-type"].startswith("application/json")


def test_valid_numbers_still_work_everywhere(client: TestClient) -> None:
    rid, gid = _seeded(client)
    assert client.get("/api/v1/runs?limit=5&offset=0").status_code == 200
    r = client.get(f"/api/v1/runs/{rid}/series?name=attention_z&layer=1&buckets=10&start=0&end=19")
    assert r.status_code == 200 and len(r.json()["points"]) == 10
    r = client.get(f"/api/v1/live?cursor={rid}:-1&name=attention_z&line=mean&line=01&every=2&wait=0")
    assert r.status_code == 200
    series = r.json()["runs"][0]["series"]["attention_z"]
    assert set(series) == {"mean", "1"}  # the layer's line keyed canonically ("01" is layer 1)
    with client.stream("GET", f"/api/v1/live/stream?cursor={rid}:-1&name=attention_z&line=0&wait=0&gap=0") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert b'"0":' in r.read()
    r = client.get(f"/ui/data/compare?run_id={rid}&layer=1&buckets=50")
    assert r.status_code == 200 and "layer 1" in r.json()["figure"]["layout"]["title"]["text"]
    assert client.get(f"/api/v1/groups/{gid}/stability?rtol=0.1&atol=0").status_code == 200


@pytest.mark.parametrize("odd", ["²", "１", " 1", "1_0", "1.0"])
def test_ids_in_the_path_and_query_are_ascii_digits(client: TestClient, odd: str) -> None:
    urls = [
        f"/api/v1/runs/{odd}",
        f"/api/v1/alerts?run_id={odd}",
        f"/api/v1/groups/{odd}",
        f"/ui/data/compare?run_id={odd}",
    ]
    for url, field in zip(urls, ["run_id", "run_id", "group_id", "run_id"], strict=True):
        r = client.get(url)
        assert r.status_code == 422 and field in r.json()["message"], (url, r.text)
    assert client.get(f"/api/v1/runs/{TWENTY_DIGITS}").status_code == 404  # beyond the id range: no such run
