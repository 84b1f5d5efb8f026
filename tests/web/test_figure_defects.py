"""Issue 24's chart defects, on the figure JSON the pages draw (tests/web/test_figures.py style)."""

from __future__ import annotations

import pytest

from hyperwatch.monitor.analysis.scaling import compare_methods
from hyperwatch.monitor.read.lines import AggSeries
from hyperwatch.monitor.store.entities import Alert, LayerMatrix
from hyperwatch.web.figures import (
    ALERT_STRIP,
    RunLine,
    compare_figure,
    heatmap_figure,
    run_line_figure,
    stability_figure,
    verdict_rule,
)
from hyperwatch.web.sweeps import scaling_figures
from tests.web.test_figures import NOW, run


def series(values: list[float], steps: list[int] | None = None, per_layer: bool = False) -> AggSeries:
    steps = steps if steps is not None else [10 * i for i in range(len(values))]
    return AggSeries(steps, [s * 100 for s in steps], values, values[-1], per_layer, 4 if per_layer else 0, False)


def alert(step: int) -> Alert:
    return Alert(1, 1, "r1", "p", "z_spike", "warning", "attention_z", 0, step, 9.0, 1.0, "spike", NOW)


def test_a_constant_lr_is_drawn_at_its_value_not_at_zero_on_a_unit_axis() -> None:
    fig = run_line_figure(run(1), "lr", [("lr", series([3e-3] * 5), "#000")], [], "step", False)
    lo, hi = fig["layout"]["yaxis"]["range"]
    assert lo < 3e-3 < hi and hi - lo == pytest.approx(6e-4)  # +-10% of the value, not 3e-3 +- 1
    varying = run_line_figure(run(1), "lr", [("lr", series([3e-3, 2e-3]), "#000")], [], "step", False)
    assert "range" not in varying["layout"]["yaxis"]  # a changing line keeps plotly's autorange


def test_a_constant_line_across_runs_gets_a_range_too() -> None:
    lines = [RunLine(run(i), series([0.0] * 4), f"r{i}", "#000") for i in (1, 2)]
    fig = compare_figure("lr", lines, "step", "mean", False)
    assert fig["layout"]["yaxis"]["range"] == [-1.0, 1.0]  # zero: +-1, the value in the middle
    ratio = compare_figure("mlp_outlier_ratio", lines, "step", "max", False)
    assert ratio["layout"]["yaxis"]["range"] == [0.0, 1.0]  # a ratio's zero line sits on a 0..1 axis


def test_alert_markers_sit_in_their_own_strip_above_the_peak() -> None:
    line = series([1.0, 5.0, 2.0], per_layer=True)
    fig = run_line_figure(run(1), "attention_z", [("max", line, "#000")], [alert(10)], "step", False)
    marks = [t for t in fig["data"] if t.get("meta", {}).get("alerts")]
    assert len(marks) == 1 and marks[0]["yaxis"] == "y3" and marks[0]["x"] == [10.0]
    layout = fig["layout"]
    assert layout["yaxis3"]["domain"] == list(ALERT_STRIP)
    assert layout["yaxis"]["domain"][1] < layout["yaxis3"]["domain"][0]  # no overlap with the lines
    quiet = run_line_figure(run(1), "attention_z", [("max", line, "#000")], [], "step", False)
    empty = [t for t in quiet["data"] if t.get("meta", {}).get("alerts")]
    assert empty and empty[0]["x"] == [] and empty[0]["showlegend"] is False  # live alerts join it


def test_the_peak_final_legend_is_outside_the_plot() -> None:
    verdict = {
        "verdict": "transferable",
        "breaks_at": None,
        "peak": {"scales": [1e6, 1e7], "values": [1.0, 1.0]},
        "final": {"scales": [1e6, 1e7], "values": [0.5, 0.5]},
    }
    fig = stability_figure("attention_z", verdict, "model size (parameters)")
    legend = fig["layout"]["legend"]
    assert legend["x"] > 1.0 and legend["xanchor"] == "left"  # right of the plot area, never on a point


def test_the_verdict_rule_goes_with_the_figure_with_the_outlier_floor() -> None:
    """The rule is the page's HTML caption under the figure (meta.rule), not an annotation: an
    annotation never wraps and was clipped at the panel's right edge (issue 35)."""
    fig = stability_figure("mlp_outlier_ratio", None, "depth", why="n/a until runs finish")
    rule = fig["meta"]["rule"]
    assert rule == verdict_rule("mlp_outlier_ratio")
    assert "5%" in rule and "1e-05" in rule and "NaN/Inf" in rule and "0.0001" in rule and "spread" in rule
    assert all("5%" not in a["text"] for a in fig["layout"]["annotations"])
    assert "final value never rises" in verdict_rule("loss")  # the loss is judged by its final value


def test_router_panels_of_a_dense_group_say_why_they_are_empty() -> None:
    for name in ("router_z", "max_vio"):
        fig = compare_figure(name, [], "step", "max", False)
        assert "MoE" in fig["meta"]["empty"] and fig["layout"]["annotations"][0]["text"]
    dense = compare_figure("attention_z", [], "step", "max", False)
    assert "empty" not in dense["meta"]


def test_axes_write_billions_as_b_like_the_size_labels() -> None:
    fig = compare_figure("loss", [RunLine(run(1), series([2.0, 1.5]), "r1", "#000")], "step", "mean", False)
    assert fig["layout"]["xaxis"]["exponentformat"] == "B"
    assert fig["layout"]["yaxis"]["exponentformat"] == "B"


def test_an_all_zero_heatmap_has_a_colour_bar_from_zero() -> None:
    m = LayerMatrix(1, "attention_z", [0, 1], [0, 10], 10, [[0.0, 0.0], [0.0, None]])
    trace = heatmap_figure(run(1), m, [0.0, 10.0], "step")["data"][0]
    assert (trace["zmin"], trace["zmax"]) == (0.0, 1.0)  # not plotly's -0.4..0.4 around a constant
    varied = LayerMatrix(1, "attention_z", [0], [0, 10], 10, [[1.0, 2.0]])
    assert "zmax" not in heatmap_figure(run(1), varied, [0.0, 10.0], "step")["data"][0]


def test_switching_the_x_axis_gives_fresh_ticks() -> None:
    line = [RunLine(run(1, tokens=1000, total_steps=40), series([1.0, 2.0]), "r1", "#000")]
    revisions = {compare_figure("loss", line, x, "mean", False)["layout"]["uirevision"] for x in ("step", "tokens")}
    assert len(revisions) == 2  # one uirevision per axis: plotly drops the old axis's ticks and range


def test_runs_missing_a_field_get_one_short_note_with_the_attach_argument() -> None:
    lines = [RunLine(run(i), series([1.0, 2.0]), f"r{i}", "#000") for i in range(1, 6)]
    missing = compare_figure("loss", lines, "fraction", "mean", False)["meta"]["missing"]
    assert len(missing) == 1  # one note, not one paragraph per run
    assert missing[0].startswith("5 runs not drawn on x=fraction (r1, r2, r3 and 2 more)")
    assert "hooks.attach(..., total_steps=N)" in missing[0]
    meta = compare_figure("loss", lines, "fraction", "mean", False)["meta"]
    assert meta["missing_runs"] == ["r1", "r2", "r3", "r4", "r5"]  # the page unions these into one note
    assert meta["missing_fix"].startswith("attach with hooks.attach(")


def test_an_arm_whose_loss_rises_with_compute_does_not_scale() -> None:
    flops = [1e15, 2e15, 4e15, 8e15, 1.6e16, 1e15, 2e15, 4e15, 8e15, 1.6e16]
    rising = [2.35 * f**0.003 / 1e15**0.003 for f in flops[:5]]
    falling = [3.0 * (f / 1e15) ** -0.1 for f in flops[5:]]
    methods = ["baseline"] * 5 + ["hyperp"] * 5
    scaling = compare_methods(methods, flops, rising + falling, None, floor=False)
    records = [
        {"flops": f, "val_loss": v, "method": m} for f, v, m in zip(flops, rising + falling, methods, strict=True)
    ]
    figures, notes = scaling_figures(scaling, records)
    stalled = [n for n in notes if "does not scale" in n]
    assert len(stalled) == 1 and stalled[0].startswith("baseline does not scale: its loss rises")
    names = [t["name"] for t in figures["scaling"]["data"] if t["mode"] == "lines"]
    assert any(n.startswith("baseline: L = ") and "does not scale" in n for n in names)
    assert not any(n.startswith("hyperp") and "does not scale" in n for n in names)
