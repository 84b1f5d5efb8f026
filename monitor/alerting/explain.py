"""What an incident says to a person: what rose, by how much, since when, where, and what usually helps.

Composed when incidents are listed (``GET /api/v1/incidents``), from the incident's stored fields,
so a change of wording needs no migration.
"""

from __future__ import annotations

import math

from hyperwatch.monitor.store.incidents import Incident

WHAT: dict[str, str] = {
    "logit_ceiling": "an attention head's max logit passed the ceiling",
    "z_growth": "a steady climb",
    "z_spike": "a sudden jump",
    "loss_spike": "a loss spike",
    "grad_norm_spike": "a gradient-norm spike",
    "loss_shift": "the loss stepped up and stayed up",
    "nan_loss": "the loss became non-finite",
    "nonfinite_value": "an indicator became non-finite",
    "max_vio_collapse": "MoE routing collapsed onto few experts",
    "forecast_band": "a value left its forecast band",
}

QK = "add QK-norm (LayerNorm/RMSNorm on queries and keys) or QK-clip"
LR = "lower the learning rate (or lengthen the warm-up)"
ZLOSS = "add z-loss (1e-4 x LSE^2 of the output logits)"
ROUTER = "add SqrtGate or the load-balancing aux loss; lower the router's learning rate"
CLIP = "check gradient clipping and the data of the spiking steps"
NORMS = "keep the weights' norms bounded (HyperP's MuonH / AdamH, or weight decay)"
REMEDIES: dict[str, tuple[str, ...]] = {
    "attention_z": (QK, LR),
    "attention_lse_max": (QK, LR),
    "output_z": (ZLOSS, LR),
    "attention_rms": (LR, NORMS),
    "mlp_rms": (LR, NORMS),
    "router_z": (ROUTER, "add router z-loss", LR),
    "max_vio": (ROUTER,),
    "loss": (LR, CLIP, "restart from the last checkpoint before the spike, skipping its batches"),
    "grad_norm": (CLIP, LR),
}


def base(name: str) -> str:
    return name.split(".", 1)[0]


def remedies(incident: Incident) -> list[str]:
    return list(REMEDIES.get(base(incident.name), (LR,)))


def run_link(incident: Incident) -> str:
    """The run page at the incident's first step, on the metric that rose."""
    return f"/runs/{incident.run_id}?name={base(incident.name)}&step={incident.first_step}"


def _amount(incident: Incident) -> str:
    peak, start = incident.peak_value, incident.baseline
    if math.isnan(peak):
        return "to NaN"
    if math.isinf(peak):
        return f"to {peak}"
    if incident.rule == "logit_ceiling" and start is not None:
        return f"to {peak:.4g}, above the ceiling {start:.4g}"
    if start is not None and math.isfinite(start) and start > 0:
        return f"from {start:.4g} to {peak:.4g} ({peak / start:.3g}x)"
    return f"to {peak:.4g}"


def _where(incident: Incident) -> str:
    parts = []
    if incident.layers:
        shown = ", ".join(str(x) for x in incident.layers[:12])
        more = f" and {len(incident.layers) - 12} more" if len(incident.layers) > 12 else ""
        parts.append(f"layer{'s' if len(incident.layers) > 1 else ''} {shown}{more}")
    if incident.heads:
        shown = ", ".join(f"{layer}.{head}" for layer, head in incident.heads[:12])
        more = f" and {len(incident.heads) - 12} more" if len(incident.heads) > 12 else ""
        parts.append(f"heads (layer.head) {shown}{more}")
    return "; ".join(parts) if parts else "the run"


def summary(incident: Incident) -> str:
    """One paragraph: what rose, by how much, since which step, where, how often."""
    what = WHAT.get(incident.rule, incident.rule)
    metric = base(incident.name)
    span = (
        f"at step {incident.first_step}"
        if incident.first_step == incident.last_step
        else f"from step {incident.first_step} to {incident.last_step}"
    )
    events = f"{incident.events} alert event{'s' if incident.events != 1 else ''}"
    return f"{what}: {metric} rose {_amount(incident)} {span} in {_where(incident)} ({events}). {incident.message}"
