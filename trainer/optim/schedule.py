"""HyperP learning-rate transfer, per-parameterization multipliers and the LR schedule.

Everything here is a pure function of numbers, so the optimizer builder, the model and the sweep
runner share one definition of each rule (spec: HYPERP.md section 2).

Parameterizations (the rows of the spec's table):

- ``"vanilla"``: no multipliers at all (the paper's plain MuonH arm).
- ``"mup"``: hidden matrices get LR ``sqrt(d_out/d_in)`` and weight decay ``lambda * w_0/w``;
  the LM head's output is multiplied by ``w_0/w``; no depth scaling.
- ``"mup++"``: muP plus depth-muP: every LR carries ``sqrt(d_0/d)``, each residual branch is
  multiplied by ``1/sqrt(2d)``; only hidden matrices are decayed (``lambda * w_0/w``).
- ``"hyperp"``: one LR ``eta(d, T) = eta_0 * sqrt(d_0/d) * (T_0/T)^0.32`` for every parameter,
  residual multiplier ``1/sqrt(2d)``, head multiplier 1, no weight decay (the hypersphere
  makes decay a first-order no-op).

"Proportional to" in the spec means relative to the base model (depth ``d_0``, width ``w_0``,
tokens ``T_0``) on which ``eta_0`` and ``lambda_0`` were tuned, so every multiplier is 1 there.
"""

from __future__ import annotations

import math

PARAMETERIZATIONS: tuple[str, ...] = ("vanilla", "mup", "mup++", "hyperp")
ROLES: tuple[str, ...] = ("embedding", "head", "hidden", "vector")

#: The paper's comparison arms (one flag each) and the parameterization each one uses.
ARM_PARAMETERIZATION: dict[str, str] = {
    "muon": "mup++",
    "muonh": "vanilla",
    "hyperp": "hyperp",
    "hyperp_moe": "hyperp",
}
ARMS: tuple[str, ...] = tuple(ARM_PARAMETERIZATION)

#: Reference-run base scale (spec section 2): d_0 = 8 blocks, T_0 = 10.4e9 tokens.
BASE_DEPTH = 8
BASE_TOKENS = 10.4e9
#: Fitted exponent of the optimal LR against training tokens (spec sections 2 and 5).
TOKEN_EXPONENT = 0.32


def _positive(name: str, value: float) -> float:
    """Return ``value`` as a float, or raise if it is not a finite positive number."""
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def _check_parameterization(parameterization: str) -> str:
    if parameterization not in PARAMETERIZATIONS:
        raise ValueError(f"parameterization must be one of {', '.join(PARAMETERIZATIONS)}; got {parameterization!r}")
    return parameterization


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    return role


def check_arm(arm: str) -> str:
    """Return ``arm`` unchanged, or raise a ValueError that lists the valid arms."""
    if arm not in ARM_PARAMETERIZATION:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}; got {arm!r}")
    return arm


def parameterization_for_arm(arm: str) -> str:
    """The parameterization an arm trains with: muon -> mup++, muonh -> vanilla, hyperp* -> hyperp."""
    return ARM_PARAMETERIZATION[check_arm(arm)]


def hyperp_lr(
    eta0: float,
    depth: float,
    tokens: float,
    base_depth: float = BASE_DEPTH,
    base_tokens: float = BASE_TOKENS,
    exponent: float = TOKEN_EXPONENT,
) -> float:
    """HyperP's transferred peak LR: ``eta(d, T) = eta_0 * sqrt(d_0/d) * (T_0/T)^exponent``.

    ``eta0`` is the LR tuned once at the base model (depth ``base_depth`` trained on
    ``base_tokens`` tokens); the paper uses 0.02 dense / 0.01 MoE with ``d_0 = 8`` and
    ``T_0 = 10.4e9``. Depth enters through depth-muP's ``1/sqrt(d)`` and the token budget through
    the fitted power law with exponent 0.32 (spec section 2). Width does not appear: on the
    hypersphere the relative update size ``||dW||/||W||`` is width-independent.
    """
    eta0 = _positive("eta0", eta0)
    depth = _positive("depth", depth)
    tokens = _positive("tokens", tokens)
    base_depth = _positive("base_depth", base_depth)
    base_tokens = _positive("base_tokens", base_tokens)
    exponent = float(exponent)
    if not math.isfinite(exponent):
        raise ValueError(f"exponent must be a finite number, got {exponent!r}")
    return eta0 * math.sqrt(base_depth / depth) * (base_tokens / tokens) ** exponent


def linear_decay(step: int, total_steps: int, final_fraction: float = 0.1) -> float:
    """LR multiplier for ``step`` (0-based): 1 at step 0, ``final_fraction`` at ``total_steps - 1``.

    No warm-up and a straight line in between (spec section 2: "no warm-up, linear decay from
    the peak to 10% of the peak at the end"). A one-step run has only its first step and gets 1.
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < total_steps:
        raise ValueError(f"step must be an integer in [0, total_steps - 1] = [0, {total_steps - 1}], got {step!r}")
    fraction = float(final_fraction)
    if not math.isfinite(fraction) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"final_fraction must be in [0, 1], got {final_fraction!r}")
    if total_steps == 1:
        return 1.0
    progress = step / (total_steps - 1)
    return 1.0 - (1.0 - fraction) * progress


def residual_multiplier(parameterization: str, depth: int) -> float:
    """Factor applied to each residual branch's output before it joins the stream.

    ``1/sqrt(2d)`` for mup++ and hyperp (depth-muP: 2d branches, attention and MLP per block),
    1 for mup and vanilla (spec section 2, "residual mult" column).
    """
    _check_parameterization(parameterization)
    d = _positive("depth", depth)
    if parameterization in ("mup++", "hyperp"):
        return 1.0 / math.sqrt(2.0 * d)
    return 1.0


def head_multiplier(parameterization: str, width: int, base_width: float) -> float:
    """Factor on the LM head's logits: ``w_0/w`` for mup and mup++, 1 for hyperp and vanilla.

    muP's "weight mult 1/w" on the unembedding, taken relative to the base width so the base
    model is unchanged; HyperP drops it because the head lives on the hypersphere (AdamH).
    """
    _check_parameterization(parameterization)
    w = _positive("width", width)
    w0 = _positive("base_width", base_width)
    if parameterization in ("mup", "mup++"):
        return w0 / w
    return 1.0


def lr_multiplier(
    parameterization: str,
    role: str,
    *,
    depth: float,
    tokens: float,
    d_out: int | None = None,
    d_in: int | None = None,
    base_depth: float = BASE_DEPTH,
    base_tokens: float = BASE_TOKENS,
    exponent: float = TOKEN_EXPONENT,
) -> float:
    """Per-parameter LR multiplier on top of the base LR ``eta_0`` (spec section 2, "LR mult").

    - vanilla: 1 everywhere.
    - mup: hidden ``sqrt(d_out/d_in)``, everything else 1.
    - mup++: hidden ``sqrt(d_out/d_in) * sqrt(d_0/d)``, everything else ``sqrt(d_0/d)``.
    - hyperp: ``sqrt(d_0/d) * (T_0/T)^0.32`` for every role. The table lists only ``1/sqrt(d)``
      for embeddings, vectors and head; we apply the token factor to them too, so the whole
      model shares the single transferred LR ``eta(d, T)`` (the paper states one shared LR for
      MuonH and AdamH; extending it to the AdamW groups keeps one global LR per run).

    ``d_out`` and ``d_in`` are the per-matrix output and input sizes (for a 3-D expert tensor
    ``(E, out, in)`` the last two dims) and are required for hidden matrices under mup/mup++.
    """
    _check_parameterization(parameterization)
    _check_role(role)
    depth = _positive("depth", depth)
    base_depth = _positive("base_depth", base_depth)
    tokens = _positive("tokens", tokens)
    if parameterization == "vanilla":
        return 1.0
    if parameterization == "hyperp":
        return hyperp_lr(1.0, depth, tokens, base_depth, base_tokens, exponent)
    multiplier = 1.0 if parameterization == "mup" else math.sqrt(base_depth / depth)
    if role == "hidden":
        if d_out is None or d_in is None:
            raise ValueError(f"d_out and d_in are required for hidden matrices under {parameterization}")
        multiplier *= math.sqrt(_positive("d_out", d_out) / _positive("d_in", d_in))
    return multiplier


def weight_decay_for(
    parameterization: str, role: str, *, weight_decay: float, width: float, base_width: float
) -> float:
    """Weight-decay coefficient for one role (spec section 2, "weight decay" column).

    mup: hidden ``lambda_0 * w_0/w`` (proportional to 1/w), the other roles ``lambda_0``;
    mup++: hidden ``lambda_0 * w_0/w``, the other roles 0; hyperp and vanilla: 0 everywhere
    (MuonH/AdamH keep norms fixed, so decay is a first-order no-op).
    """
    _check_parameterization(parameterization)
    _check_role(role)
    lam = float(weight_decay)
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    ratio = _positive("base_width", base_width) / _positive("width", width)
    if parameterization in ("hyperp", "vanilla"):
        return 0.0
    if role == "hidden":
        return lam * ratio
    return lam if parameterization == "mup" else 0.0
