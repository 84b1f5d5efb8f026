"""A group of runs at several scales, ingested through the real HTTP API (used by the web tests).

Four runs d=8..20 (params growing) with every stability indicator per layer (a NaN at one step of
the largest run), loss and lr; and a run named like an XSS payload written through the store.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import httpx

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.entities import NewAlert

XSS_NAME = "<img src=x onerror=alert(1)>"
XSS_TAG = "x<script>alert(2)</script>"
INDICATORS = (
    "attention_z",
    "router_z",
    "attention_rms",
    "mlp_rms",
    "attention_outlier_ratio",
    "mlp_outlier_ratio",
    "max_vio",
)
DEPTHS = (8, 12, 16, 20)
STEPS = 120
NAN_STEP = 90


def params_of(depth: int) -> int:
    return 12 * (128 * depth) ** 2 * depth + 2 * 32000 * 128 * depth


def _value(name: str, depth: int, layer: int, step: int) -> float:
    """Indicators that fall with depth (transferable stability), with a mild trend over steps."""
    base = {
        "attention_z": 60.0,
        "router_z": 30.0,
        "attention_rms": 0.8,
        "mlp_rms": 0.9,
        "attention_outlier_ratio": 0.01,
        "mlp_outlier_ratio": 0.02,
        "max_vio": 0.5,
    }[name]
    return base * (8.0 / depth) ** 0.3 * (1.0 + 0.2 * math.sin(step / 15.0 + layer)) * (1.0 + 0.3 * step / STEPS)


def seed(base_url: str, write_token: str, project: str = "web") -> dict[str, Any]:
    """Create the group and its runs; returns ids: {"group_id", "runs": {name: id}, "xss_run_id"}."""
    headers = {"Authorization": f"Bearer {write_token}"}
    out: dict[str, Any] = {"runs": {}}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as c:
        group = c.post("/api/v1/groups", json={"name": "ladder", "project": project})
        group.raise_for_status()
        out["group_id"] = group.json()["id"]
        for depth in DEPTHS:
            name = f"hyperp-d{depth}"
            tokens_per_step = 4096 * depth
            body = {
                "name": name,
                "project": project,
                "group": "ladder",
                "status": "finished",
                "depth": depth,
                "width": 128 * depth,
                "total_params": params_of(depth),
                "active_params": params_of(depth),
                "tokens": tokens_per_step * STEPS,
                "total_steps": STEPS,
                "flops": 6.0 * params_of(depth) * tokens_per_step * STEPS,
                "lr": 0.02,
                "optimizer": "muonh_hyperp",
                "tags": ["ladder", f"d{depth}"],
                "config": {"optim": {"arm": "hyperp"}, "note": XSS_NAME},
                "summary": {"val_loss": 3.5 - 0.1 * depth / 4},
            }
            r = c.post("/api/v1/runs", json=body)
            r.raise_for_status()
            out["runs"][name] = r.json()["id"]
            points: list[dict[str, Any]] = []
            for step in range(STEPS):
                tok = tokens_per_step * (step + 1)
                for n in INDICATORS:
                    for layer in range(min(depth, 4)):
                        v: float | str = _value(n, depth, layer, step)
                        if depth == 20 and n == "attention_z" and step == NAN_STEP and layer == 1:
                            v = "NaN"
                        points.append({"name": n, "layer": layer, "step": step, "tokens": tok, "value": v})
                points.append({"name": "loss", "step": step, "tokens": tok, "value": 4.0 - step / STEPS - depth / 40})
                points.append({"name": "lr", "step": step, "tokens": tok, "value": 0.02 * (1 - 0.9 * step / STEPS)})
            for i in range(0, len(points), 20_000):
                batch = {"batch_id": uuid.uuid4().hex, "run": name, "points": points[i : i + 20_000]}
                c.post(f"/api/v1/points?project={project}", json=batch).raise_for_status()
    return out


def seed_xss(store: SqlStore, project: str = "web", group: str = "xss") -> int:
    """A run named like an XSS payload, written through the store (the API's name rules refuse it:
    the pages must escape on their own), in its own group beside a normal run, with points, a NaN
    and an alert."""
    run, _ = store.upsert_run(
        project,
        XSS_NAME,
        {"group": group, "tags": [XSS_TAG], "config": {"evil": XSS_NAME, XSS_TAG: 1}, "status": "failed"},
    )
    pts = [Point("attention_z", s, 50.0 + s % 7, layer=0, tokens=4096 * (s + 1)) for s in range(STEPS)]
    pts += [Point("loss", s, 4.0 - s / STEPS, tokens=4096 * (s + 1)) for s in range(STEPS)]
    pts.append(Point("attention_z", STEPS, math.nan, layer=0, tokens=4096 * (STEPS + 1)))
    store.ingest(run.id, uuid.uuid4().hex, pts)
    store.add_alerts(
        run.id, [NewAlert("nonfinite_value", "critical", "attention_z", 0, STEPS, math.nan, None, XSS_NAME)]
    )
    plain, _ = store.upsert_run(project, "plain-d4", {"group": group, "depth": 4, "total_params": params_of(4)})
    store.ingest(plain.id, uuid.uuid4().hex, [Point("attention_z", s, 40.0, layer=0) for s in range(STEPS)])
    return run.id


SWEEP_DEPTHS = (8, 12, 16)
SWEEP_LRS = (0.005, 0.01, 0.02, 0.04, 0.08)
SWEEP_TOKENS = 1_000_000_000


def sweep_loss(depth: int, lr: float, method: str) -> float:
    """A parabola in ln(lr) whose optimum falls with depth as depth^-0.5; "muon" is 5% worse."""
    opt = 0.02 * (8 / depth) ** 0.5
    worse = 1.05 if method == "muon" else 1.0
    return (3.6 - 0.3 * math.log(depth / 8) + 0.05 * (math.log(lr / opt)) ** 2) * worse


def seed_sweep(base_url: str, write_token: str, project: str = "web") -> int:
    """Group "sweep": two methods x 3 depths x 5 LRs, each run with flops and a summary val_loss."""
    headers = {"Authorization": f"Bearer {write_token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as c:
        group = c.post("/api/v1/groups", json={"name": "sweep", "project": project})
        group.raise_for_status()
        for method in ("hyperp", "muon"):
            for depth in SWEEP_DEPTHS:
                for lr in SWEEP_LRS:
                    r = c.post(
                        "/api/v1/runs",
                        json={
                            "name": f"{method}-d{depth}-lr{lr:g}",
                            "project": project,
                            "group": "sweep",
                            "status": "finished",
                            "depth": depth,
                            "total_params": params_of(depth),
                            "lr": lr,
                            "tokens": SWEEP_TOKENS,
                            "flops": 6.0 * params_of(depth) * SWEEP_TOKENS,
                            "optimizer": method,
                            "summary": {"val_loss": sweep_loss(depth, lr, method)},
                        },
                    )
                    r.raise_for_status()
        return int(group.json()["id"])
