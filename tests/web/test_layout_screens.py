"""No clipped or overlapping text on any page at 1280, 1600 and 1920 px (issue 35).

Every page is loaded in headless Chromium against a real service seeded with what strains a
layout: long run, group and method names, a 48-layer model with 16 heads, runs of unequal length,
numbers from 1e-6 to 7e10 and a loss whose tick labels need many digits. Once its figures are
drawn the page is measured in the DOM: each Plotly text (ticks, axis titles, titles, annotations,
legend, colour bars) lies inside its figure's SVG and overlaps no other text of that figure; no
HTML element's content runs past its box horizontally and the page has no horizontal scrollbar.
A screenshot of each page and width is saved under test-artifacts/web/layout/ and named in any
failure.
"""

from __future__ import annotations

import base64
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store.entities import NewAlert
from tests.web.browser import console_errors, wait_ready
from tests.web.conftest import ARTIFACTS, Live, _live

pytestmark = pytest.mark.slow
WIDTHS = (1280, 1600, 1920)
HEIGHT = 1000
PROJECT = "layout-check-project-with-a-long-name"
GROUP = "uneven-ladder-of-scales-with-a-rather-long-group-name"
SWEEP = "lr-sweep-with-long-method-names"
LAYERS, HEADS = 48, 16
SHOTS = ARTIFACTS / "layout"
RUNS_COLUMNS = (
    *(f"summary.{m}" for m in ("loss.last", "loss.min", "loss.min_step", "val_loss.last")),
    *(f"config.{k}" for k in ("data.path", "optim.lr", "optim.betas", "_hyperwatch.host", "_hyperwatch.device_name")),
    "config._hyperwatch.git_commit",
)
"""The runs table's extra columns the "runs-columns" page shows: every loss summary, and config keys
with long names and long unbroken values (the data path, the commit)."""


def _name(depth: int) -> str:
    return f"pretrain-d{depth}-muonh-hyperp-qkclip-warmup2000-cosine-seed1234-{'x' * 12}"


def _ladder_run(store: Any, depth: int, params: int, steps: int, total: int, layers: int) -> int:
    """A run of the scale group: per-layer indicators over ``steps`` logged steps of ``total``."""
    status = "finished" if steps == total else "running"
    tokens_per_step = 2048 * depth
    config = {
        "data": {"path": "/datasets/" + "fineweb-edu-dedup-tokenized-" * 6 + "shard-00000-of-01024.bin"},
        "optim": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1},
        "_hyperwatch": {
            "git_commit": "0123456789abcdef0123456789abcdef01234567",
            "git_dirty": True,
            "host": "gpu-node-0042.cluster.example.org",
            "torch": "2.6.0+cu126",
            "cuda": "12.6",
            "device": "cuda",
            "device_name": "NVIDIA H200 141GB HBM3e",
            "device_count": 8,
        },
    }
    run, _ = store.upsert_run(
        PROJECT,
        _name(depth),
        {
            "group": GROUP,
            "status": status,
            "depth": depth,
            "width": 128 * depth,
            "total_params": params,
            "tokens": tokens_per_step * total,
            "total_steps": total,
            "flops": 6.0 * params * tokens_per_step * total,
            "lr": 3e-4,
            "optimizer": "muonh_hyperp_with_qk_clip",
            "tags": ["layout", f"d{depth}", "a-tag-with-a-fairly-long-name"],
            "config": config,
        },
    )
    pts: list[Point] = []
    for s in range(steps):
        tok = tokens_per_step * (s + 1)
        wave = 1.0 + 0.2 * math.sin(s / 9.0)
        pts.append(Point("loss", s, 2.0 + 1e-5 * (1 + math.sin(s / 7.0)) + depth * 1e-6, tokens=tok))
        pts.append(Point("lr", s, 3e-4 * (1 - 0.99 * s / total), tokens=tok))
        pts.append(Point("grad_norm", s, 1.2e5 * wave, tokens=tok))
        for la in range(layers):
            z = 60.0 * wave * (1 + la / layers)
            if depth == 48 and la == layers - 1 and s == steps - 20:
                z = 2.2e7
            pts.append(Point("attention_z", s, z, layer=la, tokens=tok))
            pts.append(Point("attention_rms", s, 0.8 * wave, layer=la, tokens=tok))
            pts.append(Point("attention_outlier_ratio", s, 1e-6 * wave * (1 + depth / 48), layer=la, tokens=tok))
            if s % 20 == 0 or s == steps - 1:
                heads = [40.0 + la + h * wave for h in range(HEADS)]
                pts += [Point(f"attention_lse_max.h{h}", s, v, layer=la, tokens=tok) for h, v in enumerate(heads)]
                pts.append(Point("attention_lse_max", s, max(heads), layer=la, tokens=tok))
    store.ingest(run.id, uuid.uuid4().hex, pts)
    return run.id


def _sweep(store: Any) -> int:
    """Two methods with long names x 3 depths x 4 learning rates, each run with FLOPs and val_loss."""
    for method in ("adamw-baseline-with-a-long-method-name", "muonh-hyperp-with-qk-clip-and-long-name"):
        for depth in (8, 12, 16):
            params = 12 * (128 * depth) ** 2 * depth
            for lr in (0.005, 0.01, 0.02, 0.04):
                opt = 0.02 * (8 / depth) ** 0.5
                loss = (3.6 - 0.3 * math.log(depth / 8) + 0.05 * math.log(lr / opt) ** 2) * (
                    1.05 if method.startswith("adamw") else 1.0
                )
                store.upsert_run(
                    PROJECT,
                    f"{method}-d{depth}-lr{lr:g}",
                    {
                        "group": SWEEP,
                        "status": "finished",
                        "depth": depth,
                        "total_params": params,
                        "lr": lr,
                        "tokens": 10**9,
                        "flops": 6.0 * params * 1e9,
                        "optimizer": method,
                        "summary": {"val_loss": loss},
                    },
                )
    return int(store.find_run(PROJECT, f"{method}-d8-lr0.01").group_id)


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, dict[str, str]]]:
    for lv in _live(tmp_path_factory.mktemp("layout")):
        ids = {
            d: _ladder_run(lv.store, d, p, n, t, la)
            for d, p, n, t, la in (
                (8, 125_000_000, 60, 60, 8),
                (16, 1_300_000_000, 120, 120, 16),
                (24, 6_700_000_000, 200, 200, 24),
                (48, 70_000_000_000, 200, 400, LAYERS),
            )
        }
        wide = ids[48]
        long_msg = (
            "attention Z rose from 6.1e+01 to 2.2e+07 in 20 steps at layer 47, past the learned ceiling "
            "of 1.0e+04; the usual remedies are QK-norm, a lower learning rate or z-loss"
        )
        lv.store.add_alerts(
            wide,
            [
                NewAlert("z_spike", "critical", "attention_z", LAYERS - 1, 180, 2.2e7, 61.0, long_msg),
                NewAlert("grad_norm_spike", "warning", "grad_norm", None, 150, 1.5e5, 1.2e5, "gradient norm spiked"),
                NewAlert("loss_spike", "warning", "loss", None, 40, 2.00002, 2.00001, "loss rose"),
            ],
        )
        lv.store.add_alerts(ids[8], [NewAlert("z_growth", "warning", "attention_z", 3, 50, 90.0, 60.0, long_msg)])
        group_id = lv.store.get_run(wide).group_id
        sweep_id = _sweep(lv.store)
        compare = "&".join(f"run_id={i}" for i in ids.values())
        pages = {
            "runs": "/runs",
            "runs-columns": "/runs?archived=1&" + "&".join(f"col={c}" for c in RUNS_COLUMNS),
            "run": f"/runs/{wide}",
            "run-small": f"/runs/{ids[8]}",
            "scale": f"/groups/{group_id}",
            "sweeps": f"/groups/{sweep_id}/sweeps",
            "compare": f"/compare?{compare}&name=attention_z",
            "alerts": "/alerts",
        }
        yield lv, pages


OPEN = """
document.querySelectorAll("details").forEach((d) => { d.open = true; });
const more = document.querySelector("#alerts-table button.expand");
if (more) more.click();
return new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
"""
"""Show what a reader opens: every <details> (the config's long values) and the first incident."""

CHECK = """
const TOL = 1, out = [];
const txt = (e) => (e.textContent || "").replace(/\\s+/g, " ").trim().slice(0, 90);
const box = (r) => [r.left, r.top, r.right, r.bottom].map(Math.round);
const shown = (e) => {
  const r = e.getBoundingClientRect();
  if (r.width < 0.5 || r.height < 0.5) return false;
  for (let n = e; n && n.nodeType === 1; n = n.parentNode) {
    const cs = getComputedStyle(n);
    if (cs.display === "none" || cs.visibility === "hidden" || cs.opacity === "0") return false;
  }
  return true;
};
const where = (e) => {
  const c = e.closest("[id]");
  return c ? "#" + c.id : e.tagName.toLowerCase();
};
const role = (t) => {
  const g = t.closest(".xtick,.ytick,.g-xtitle,.g-ytitle,.g-gtitle,.annotation,.legend,.colorbar,.cbaxis");
  return g ? g.getAttribute("class").split(" ")[0] : (t.getAttribute("class") || "text");
};
/* a text's own box, turned as drawn (tilted tick labels), in page pixels */
const quad = (t) => {
  const b = t.getBBox(), m = t.getScreenCTM();
  return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
    .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
};
/* how far two boxes overlap along the axis where they overlap least (separating axes); <= 0: apart */
const depth = (p, q) => {
  let least = Infinity;
  for (const poly of [p, q]) {
    for (let i = 0; i < 4; i++) {
      const [x1, y1] = poly[i], [x2, y2] = poly[(i + 1) % 4], n = Math.hypot(x2 - x1, y2 - y1) || 1;
      const along = (P) => P.map(([x, y]) => (x * (y1 - y2) + y * (x2 - x1)) / n);
      const a = along(p), b = along(q);
      least = Math.min(least, Math.min(Math.max(...a), Math.max(...b)) - Math.max(Math.min(...a), Math.min(...b)));
    }
  }
  return least;
};
for (const gd of document.querySelectorAll(".js-plotly-plot")) {
  if (!shown(gd)) continue;
  const svg = gd.querySelector(".svg-container");
  const sb = svg.getBoundingClientRect();
  const texts = [...gd.querySelectorAll("svg text")].filter((t) => txt(t) && shown(t) && !t.closest(".hoverlayer"));
  const rs = texts.map((t) => t.getBoundingClientRect());
  texts.forEach((t, i) => {
    const r = rs[i];
    if (r.left < sb.left - TOL || r.right > sb.right + TOL || r.top < sb.top - TOL || r.bottom > sb.bottom + TOL) {
      out.push({kind: "clipped", figure: where(gd), role: role(t), text: txt(t), rect: box(r), svg: box(sb)});
    }
  });
  const quads = texts.map(quad);
  for (let i = 0; i < texts.length; i++) {
    for (let j = i + 1; j < texts.length; j++) {
      if (depth(quads[i], quads[j]) > 2) {
        out.push({kind: "overlap", figure: where(gd), role: "", text: `${role(texts[i])} "${txt(texts[i])}" / ` +
          `${role(texts[j])} "${txt(texts[j])}"`, rect: box(rs[i]), other: box(rs[j])});
      }
    }
  }
}
const SKIP = new Set(["INPUT", "SELECT", "TEXTAREA", "OPTION", "SCRIPT", "STYLE", "svg"]);
for (const e of document.querySelectorAll("body, body *")) {
  if (SKIP.has(e.tagName) || (e.closest(".js-plotly-plot") && !e.classList.contains("js-plotly-plot"))) continue;
  if (e.closest("svg") || !shown(e)) continue;
  const cs = getComputedStyle(e);
  if (cs.display === "inline" || cs.overflowX === "auto" || cs.overflowX === "scroll") continue;
  if (e.scrollWidth <= e.clientWidth + TOL) continue;
  const right = e.getBoundingClientRect().left + e.clientWidth + TOL;
  const past = [...e.querySelectorAll("*")].filter((c) => c.getBoundingClientRect().right > right);
  const culprit = past.find((c) => c.children.length === 0 && txt(c)) || past[0];
  const cls = (c) => (typeof c.className === "string" && c.className ? "." + c.className : "");
  const name = (c) => c.tagName.toLowerCase() + cls(c);
  out.push({kind: "overflow", figure: where(e), role: name(e), rect: [e.scrollWidth, e.clientWidth],
            text: culprit ? `${name(culprit)} ${txt(culprit)}` : txt(e)});
}
const doc = document.documentElement;
if (doc.scrollWidth > doc.clientWidth) {
  const rect = [doc.scrollWidth, doc.clientWidth];
  out.push({kind: "horizontal scrollbar", figure: "page", role: "html", text: "", rect});
}
return {problems: out, figures: document.querySelectorAll(".js-plotly-plot").length};
"""


def _full_page(driver: Any, path: Path) -> None:
    """The whole page (not only the viewport) as a PNG, through the DevTools protocol."""
    size = driver.execute_script("return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    clip = {"x": 0, "y": 0, "width": size[0], "height": min(size[1], 16000), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})
    path.write_bytes(base64.b64decode(shot["data"]))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", ["runs", "runs-columns", "run", "run-small", "scale", "sweeps", "compare", "alerts"])
def test_no_text_is_clipped_or_overlapping(
    screens: tuple[Live, dict[str, str]], browser: Any, page: str, width: int
) -> None:
    lv, pages = screens
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.set_window_size(width, HEIGHT)
    console_errors(browser)
    browser.get(lv.base + pages[page] + ("&" if "?" in pages[page] else "?") + "live=0")
    wait_ready(browser)
    browser.execute_script(OPEN)
    wait_ready(browser)
    found = browser.execute_script(CHECK)
    shot = SHOTS / f"{page}-{width}.png"
    browser.save_screenshot(str(shot))
    _full_page(browser, SHOTS / f"{page}-{width}-full.png")
    inner = browser.execute_script("return window.innerWidth")
    assert abs(inner - width) <= 20, f"{page} at {width} px: the window is {inner} px wide"
    assert found["figures"] > 0 or page in ("runs", "runs-columns"), (
        f"{page} at {width} px drew no figure (screenshot {shot})"
    )
    problems = [
        f"{p['kind']}: {p['figure']} {p['role']} {p['text']!r} {p['rect']}"
        + (f" outside {p['svg']}" if "svg" in p else "")
        + (f" over {p['other']}" if "other" in p else "")
        for p in found["problems"]
    ]
    assert not problems, f"{page} at {width} px (screenshot {shot}):\n" + "\n".join(problems)
    assert console_errors(browser) == [], f"{page} at {width} px: console errors (screenshot {shot})"
