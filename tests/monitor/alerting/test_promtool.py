"""The alert rules pass `promtool check rules` and their unit tests (`promtool test rules`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.monitor.conftest import promtool

RULES = Path(__file__).resolve().parents[3] / "prometheus"


def test_check_rules() -> None:
    r = subprocess.run(
        [promtool(), "check", "rules", "rules.yml"], cwd=RULES, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rules = yaml.safe_load((RULES / "rules.yml").read_text())
    count = sum(len(g["rules"]) for g in rules["groups"])
    assert count >= 13 and f"{count} rules found" in r.stdout + r.stderr  # every rule parsed, trend rules included


def test_rule_unit_tests() -> None:
    r = subprocess.run(
        [promtool(), "test", "rules", "rules_test.yml", "rules_pace_test.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_check_config(tmp_path: Path) -> None:
    # prometheus.yml names /etc/prometheus/rules.yml (the container path): check a copy pointing here.
    cfg = (RULES / "prometheus.yml").read_text().replace("/etc/prometheus/rules.yml", str(RULES / "rules.yml"))
    path = tmp_path / "prometheus.yml"
    path.write_text(cfg)
    r = subprocess.run([promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
