"""Figure builders without a browser: labels, colours, escaping, non-finite markers, x-axes."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from hyperwatch.monitor.read.lines import AggSeries
from hyperwatch.monitor.store.entities import LayerMatrix, Run
from hyperwatch.web.figures import RunLine, XAxisError, compare_figure, heatmap_figure, note, stability_figure, x_values
from hyperwatch.web.scale import colours, esc, human_count, labels, order_by_size, scale_label
from hyperwatch.web.sweeps import law_text

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BASE = Run(
    id=1,
    project="p",
    name="r",
    status="finished",
    group=None,
    group_id=None,
    config={},
    summary={},
    tags=[],
    depth=None,
    width=None,
    total_params=None,
    active_params=None,
    tokens=None,
    total_steps=None,
    flops=None,
    lr=None,
    optimizer=None,
    parameterization=None,
    export_layers=False,
    last_step=None,
    last_point_at=None,
    created_at=NOW,
    updated_at=NOW,
)


def run(i: int, **fields: object) -> Run:
    return replace(BASE, **{"id": i, "name": f"r{i}", **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "text"), [(570e6, "570M"), (1.74e9, "1.74B"), (35_000, "35K"), (999, "999"), (2.5e12, "2.5T")]
)
def test_human_count(n: float, text: str) -> None:
    assert human_count(n) == text


def test_scale_labels_and_uniqueness() -> None:
    a = run(1, depth=12, total_params=570_000_000)
    b = run(2, depth=12, total_params=570_000_000)
    moe = run(3, depth=8, total_params=2_000_000_000, active_params=300_000_000)
    assert scale_label(a) == "d=12 · 570M"
    assert scale_label(moe) == "d=8 · 2B · 300M active"
    assert scale_label(run(4)) == "r4"  # no scale fields: the run's name
    assert labels([a, b, moe]) == {1: "d=12 · 570M · r1", 2: "d=12 · 570M · r2", 3: "d=8 · 2B · 300M active"}


def test_colours_are_sequential_by_size() -> None:
    runs = [run(i, total_params=10 ** (6 + i)) for i in range(4)] + [run(9)]
    c = colours(runs)
    assert c[9] == "#7f7f7f"  # unknown size
    # darker (smaller luminance) for smaller models along viridis
    lum = [sum(int(c[i][k : k + 2], 16) for k in (1, 3, 5)) for i in range(4)]
    assert lum == sorted(lum) and len(set(c.values())) == 5
    assert [r.id for r in order_by_size(list(reversed(runs)))] == [0, 1, 2, 3, 9]


def test_esc_turns_tags_into_text() -> None:
    assert esc("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    assert esc("a\"b'c&") == "a&quot;b&#x27;c&amp;"


def test_x_values_axes_and_errors() -> None:
    r = run(1, tokens=1000, total_steps=10, flops=6e6)
    steps, tokens = [0, 5, 9], [100, 600, 1000]
    assert x_values(r, steps, tokens, "step") == [0.0, 5.0, 9.0]
    assert x_values(r, steps, tokens, "tokens") == [100, 600, 1000]
    assert x_values(r, steps, tokens, "flops") == [6e5, 3.6e6, 6e6]  # tokens x FLOPs per token
    assert x_values(r, steps, tokens, "fraction") == [0.1, 0.6, 1.0]
    assert x_values(run(2, total_steps=10), steps, tokens, "fraction") == [0.0, 0.5, 0.9]
    with pytest.raises(XAxisError, match=r"x=flops: run 'r3' .* has no flops"):
        x_values(run(3, tokens=1000), steps, tokens, "flops")
    with pytest.raises(XAxisError, match="neither tokens nor total_steps"):
        x_values(run(4), steps, tokens, "fraction")
    with pytest.raises(XAxisError, match="carry no tokens"):
        x_values(r, steps, [None, None, None], "tokens")


def _line(values: list[float]) -> AggSeries:
    steps = list(range(len(values)))
    return AggSeries(steps, [s * 10 for s in steps], values, values[-1], True, 2, False)


def test_compare_figure_marks_non_finite_values_and_skips_runs_without_the_axis() -> None:
    a = run(1, depth=8, total_params=10**8, tokens=100)
    b = run(2, name="<b>bold</b>")
    lines = [
        RunLine(a, _line([1.0, math.nan, 3.0, math.inf, -math.inf]), "d=8 · 100M", "#440154"),
        RunLine(b, _line([1.0, 2.0, 3.0, 4.0, 5.0]), "<b>bold</b>", "#7f7f7f"),
    ]
    fig = compare_figure("attention_z", lines, "step", "mean", gl=False)
    line, other, marks = fig["data"]
    assert line["y"] == [1.0, None, 3.0, None, None]  # gaps, never clamped values
    assert marks["x"] == [1.0, 3.0, 4.0] and marks["text"] == ["NaN", "Infinity", "-Infinity"]
    assert marks["marker"]["symbol"] == ["x", "triangle-up", "triangle-down"] and marks["yaxis"] == "y2"
    assert other["name"] == "&lt;b&gt;bold&lt;/b&gt;" and other["meta"]["label"] == "<b>bold</b>"
    assert "mean over layers" in fig["layout"]["title"]["text"]
    frac = compare_figure("attention_z", lines, "fraction", "mean", gl=True)
    assert [t["type"] for t in frac["data"]] == ["scattergl", "scatter"]  # line, then markers
    assert frac["data"][0]["x"][-1] == pytest.approx(0.4)
    assert len(frac["meta"]["missing"]) == 1 and "<b>bold</b>" in frac["meta"]["missing"][0]


def test_stability_figure_titles_the_verdict() -> None:
    verdict = {
        "verdict": "breaks",
        "breaks_at": 1.74e9,
        "peak": {"scales": [1e8, 1.74e9], "values": [5.0, "NaN"]},
        "final": {"scales": [1e8, 1.74e9], "values": [4.0, 3.0]},
    }
    fig = stability_figure("attention_z", verdict, "params")
    assert "breaks</span>" not in fig["layout"]["title"]["text"] and "breaks at 1.74B" in fig["layout"]["title"]["text"]
    peak = fig["data"][0]
    assert peak["y"] == [5.0, None]
    assert fig["data"][1]["text"] == ["NaN"] and fig["data"][1]["x"] == [1.74e9]
    assert stability_figure("x", None, "params")["data"] == []


def test_heatmap_marks_non_finite_cells() -> None:
    m = LayerMatrix(1, "attention_z", [0, 1], [0, 10, 20], 10, [[1.0, math.nan, None], [2.0, 3.0, math.inf]])
    fig = heatmap_figure(run(1), m, [0.0, 10.0, 20.0], "step")
    heat, marks = fig["data"]
    assert heat["z"] == [[1.0, None, None], [2.0, 3.0, None]]
    assert list(zip(marks["x"], marks["y"], marks["text"], strict=True)) == [(10.0, 0, "NaN"), (20.0, 1, "Infinity")]


def test_law_text_signs() -> None:
    assert law_text(2.35, 0.05, None) == "2.35·C^-0.050"
    assert law_text(2.35, -0.003, 1.7) == "2.35·C^0.003 + 1.7"  # a loss growing with compute


def test_note_wraps_and_escapes_a_long_reason() -> None:
    why = "no learning-rate sweep: the 3 finished runs use one learning rate (1); " * 2 + "<b>x</b>"
    text = note(why, width=40)["text"]
    lines = text.split("<br>")
    assert len(lines) >= 4 and all(len(line) <= 60 for line in lines)  # escaping may lengthen a line
    assert "<b>" not in text and "&lt;b&gt;" in text
