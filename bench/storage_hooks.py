"""A long run through the real hooks, for ``bench/storage.py`` (issue 36).

The real-hooks fixture (``tests/monitor/alerting/data/ewf_series``) holds 13 runs of 200 steps logged
every 4th: 50 points per series, 18,400 points in all, so its bytes per point are mostly what a series
and a request cost once (keys, headers, batch ids), which no long run pays per point. This is the other
end: one run of the family benchmark's ``neox`` model at its best LR (``bench/early_warning``: RoPE, MHA,
pre-LN, AdamW, cosine), trained ``steps`` steps on the Python standard library's bytes with the hooks
attached as a user attaches them (``every=1``, into a ``MemorySink``), every series as long as the run.
Deterministic for one machine type (the recorder's pinned arithmetic is not applied: the bytes, not
the verdicts, are measured here).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "early_warning"))

from ew_models import stdlib_bytes
from ew_record import DATA_BYTES, train
from ew_specs import make_spec

from bench.storage_codecs import hooks_series

FAMILY = "neox"


def long_run(steps: int, every: int = 1) -> list[dict]:
    """The series the hooks sent over one run of ``steps`` steps, logged every ``every`` steps."""
    if steps < 2 or every < 1:
        raise ValueError(f"steps: at least 2 (got {steps}); every: at least 1 (got {every})")
    spec = make_spec(FAMILY, "best", 0, steps=steps)
    assert spec is not None  # "best" applies to every family
    rec = train(spec, stdlib_bytes(DATA_BYTES), every=every, hooked=True)
    return hooks_series([{**rec, "name": f"{spec.name}-long"}])
