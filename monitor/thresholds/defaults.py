"""The detectors' default thresholds: the ONE place they are defined (README "Alerts" has the table).

A group overrides any of them (``PATCH /api/v1/groups/{id}`` with ``thresholds``, validated by
:class:`monitor.api.schemas.Thresholds`); :func:`thresholds_for` merges a group's over these. The
Prometheus rules (prometheus/rules.yml) repeat the same numbers: change both together.

Values calibrated on ``bench/early_warning/run.py``'s table (README "Alerts"):

- ``attention_lse_max_limit`` 50 (QK-clip in Kimi K2 bounds the max logit at 100; 50 from the
  benchmark). A head's max LSE over queries bounds its max logit:
  ``max logit >= attention_lse_max - log T``. Attention Z is a mean of LSE^2 over rows, so
  ``attention_z > limit^2`` means some row's LSE is above the limit: the same ceiling for sources
  that send no per-head values. No history needed.
- growth: the Theil-Sen slope of ln(value) against the step over the last ``growth_window``
  logged points, times the window's span in steps, is the window's fitted rise; at least
  ln(``growth_factor``) is a sustained climb. Only at or above the metric's ``*_growth_floor``
  (below it a series is where healthy runs live, and none is read from the store). The
  attention branch's output RMS climbs too: a pre-norm branch's output sits near 1 at a safe LR
  (at most 1.41 on the benchmark's healthy arms), and it is the one indicator that moves on
  QK-norm runs at too high an LR, where the logits stay bounded (floor 25: the LR-0.03 arms that
  end inside the loss margin peak at 8-31, but never climb 4x above 25). The MLP (or MoE) branch's
  RMS follows the LR more than the loss: runs at LR 0.03 that end inside the margin reach 270, so
  its floor is 500 (about 100x the safe arms' maximum of 5.4); the runs at LR 0.1 that went wrong
  climb to 1,200-3,600 by step 28 (every floor from 300 to 1,000 gave the same table).
- loss / grad-norm spikes (OLMo-core's rule, per indicator): ``<metric>_spike_persist`` logged
  points in a row, each above the mean + ``sigma_spike_multiple`` standard deviations of the
  ``<metric>_spike_window`` values before the first of them, and above that mean by
  ``sigma_spike_min_relative`` x |mean| (a flat series has no deviation to speak of). The loss
  looks back 16 logged points: over 128 the early descent swells the deviation and an LR bump's
  loss jump stays under 4 sigma (1.1 sigma where 16 points give 4.9-7.3). The grad norm keeps
  OLMo-core's 128 and must be confirmed by the next logged point: a one-point blip on a healthy
  run (7.4 sigma) stands taller than an LR bump's (4.3 sigma), and the bump is the loss rule's.
- ``loss_shift``: the loss stepped up and stayed up, which no single point shows: the mean of the
  last ``loss_shift_points`` (6) logged losses, their largest left out (a single spike is the spike
  rule's, not a shift), above the mean of the ``loss_shift_window`` (16) before them by
  ``loss_shift_multiple`` (3) standard errors, sigma / sqrt(5). On the benchmark's three seed sets
  the healthy runs reach at most 1.14 standard errors; the LR bumps 1.1-8.9 (the trainer's at seed
  100, which the spike rules miss, 3.6).
- ``max_vio_collapse``: a layer's MaxVio above ``max_vio_limit`` on ``max_vio_persist`` consecutive
  logged points (an efficiency guard, judged by expert load: a single point over the limit fired on
  healthy and gated runs whose load stayed even; 3 points kept both collapses of the benchmark at
  step 12 of 200 with no false alarm; Prometheus: ``for: 2m`` at one scrape per logged step).
- learning (:mod:`monitor.thresholds.learned`, a group's ``learn_thresholds``, default
  :data:`LEARN_BY_DEFAULT`): the growth floors and ``attention_lse_max_limit`` become
  ``learn_multiple`` x the highest peak of their metric over the group's finished healthy runs (at
  least ``learn_min_runs`` of them) where that is above the default; never below it.
- ``growth_factor`` 8 (was 4) and ``z_spike`` as info: the family benchmark (``make bench-ew``,
  bench/early_warning/FAMILIES.md), six model families each scored with thresholds chosen without it: every
  fold chose 8; at 4 a model's attention Z rising tenfold while it learns reads as a climb (no learning:
  25 false alarms of 68 healthy runs at 4, 14 at 8, 12 with ``z_spike`` as info; 8 with learning).
- ``growth_recent`` 1: a climb counts only while the window's last ``growth_window // 2`` points keep the
  pace the whole window needs (their Theil-Sen slope carried over the window's span reaches
  ln(``growth_factor``)); a model's logits and branch RMS rise while it learns and then level off, and a
  window that still holds the early rise but has gone flat is learning, not trouble. Chosen by all six
  leave-one-family-out folds of ``make bench-ew`` (from 0, the rule before): left out, 10 -> 8 false
  alarms of 71 healthy runs and 3 -> 1 late warnings, for one more miss; ``bench/early_warning/run.py``
  unchanged (bench/early_warning/FAMILIES.md).
- ``z_spike`` (the older rule, info since the family benchmark): a jump over the trailing median by
  robust deviations. Prometheus applies the same three tests to the max over layers, reading the median and its robust
  deviation from gauges (without the deviation it fired on a healthy MoE's warmup climb).
"""

from __future__ import annotations

import math
from typing import Any

DEFAULT_THRESHOLDS: dict[str, float] = {
    # z_spike: jump over the trailing median (robust deviations), with an absolute minimum
    "spike_window": 50,
    "spike_min_points": 10,
    "spike_mad_multiple": 8.0,
    "spike_min_relative": 0.5,
    "attention_z_min": 100.0,
    "router_z_min": 50.0,
    # max_vio_collapse: above the limit on this many consecutive logged points of a layer
    "max_vio_limit": 2.0,
    "max_vio_persist": 3,
    # logit_ceiling: per-head max LSE (and attention_z above its square)
    "attention_lse_max_limit": 50.0,
    # z_growth: sustained climb of ln(value) over a window of logged points
    "growth_window": 16,
    "growth_min_points": 8,
    "growth_factor": 8.0,
    "attention_z_growth_floor": 50.0,
    "attention_lse_max_growth_floor": 10.0,
    "output_z_growth_floor": 150.0,
    "router_z_growth_floor": 100.0,
    "attention_rms_growth_floor": 25.0,
    "mlp_rms_growth_floor": 500.0,
    # the info tier: a climb at or above this fraction of a metric's floor, but below it, is raised as info
    # (1: none)
    "growth_info_fraction": 1.0,
    # 1: the window's last growth_window // 2 points must climb at the pace the whole window needs (a climb that
    # settles, as a model's logits do while it learns, stops counting); 0: the whole window's fit alone
    "growth_recent": 1.0,
    # loss_spike, grad_norm_spike: mean + k sigma of each indicator's own trailing window, on
    # <metric>_spike_persist logged points in a row (the window ends before the first of them)
    "loss_spike_window": 16,
    "loss_spike_persist": 1,
    "grad_norm_spike_window": 128,
    "grad_norm_spike_persist": 2,
    "sigma_spike_min_points": 16,
    "sigma_spike_multiple": 4.0,
    "sigma_spike_min_relative": 0.02,
    # loss_shift: the mean of the last loss_shift_points logged losses, their largest left out, against
    # the loss_shift_window before them, in standard errors (sigma / sqrt(points - 1)); sigma_spike_min_relative and
    # sigma_spike_min_points apply too
    "loss_shift_window": 16,
    "loss_shift_points": 6,
    "loss_shift_multiple": 3.0,
    # learned thresholds (monitor.thresholds.learned; on per group with learn_thresholds): a growth floor or
    # the logit ceiling becomes learn_multiple x the highest peak of its metric over the group's finished
    # healthy runs when that is above the default, once there are learn_min_runs of them
    "learn_multiple": 2.0,
    "learn_min_runs": 2,
    # a finished run is learned from only when its final loss is within this many nats of the group's best
    "learn_loss_margin": 0.05,
}

LEARN_BY_DEFAULT = True
"""Whether a group that never set ``learn_thresholds`` learns (on: the family benchmark's false alarms on left-out
families fell with it, bench/early_warning/README.md)."""

GROWTH_METRICS = ("attention_z", "attention_lse_max", "output_z", "router_z", "attention_rms", "mlp_rms")
SIGMA_SPIKE_METRICS = {"loss": "loss_spike", "grad_norm": "grad_norm_spike"}  # metric -> rule (and key prefix)


def thresholds_for(group_thresholds: dict[str, Any] | None) -> dict[str, float]:
    """The defaults with a group's overrides (None values left out)."""
    merged = dict(DEFAULT_THRESHOLDS)
    merged.update({k: float(v) for k, v in (group_thresholds or {}).items() if v is not None})
    return merged


def z_ceiling(th: dict[str, float]) -> float:
    """The attention Z above which some row's LSE passes the logit ceiling (Z is a mean of LSE^2)."""
    return th["attention_lse_max_limit"] ** 2


def log_factor(th: dict[str, float]) -> float:
    return math.log(th["growth_factor"])
