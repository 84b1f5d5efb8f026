"""Muon, MuonH and AdamH (spec: HYPERP.md section 1).

Shapes: every parameter these optimizers own is a matrix ``(out, in)`` or a batch of matrices
``(..., out, in)`` (MoE experts ``(E, out, in)``). Leading dims are independent matrices: Newton-
Schulz runs batched, and every norm (``c_W``, ``||G||_F``, the renormalisation) is taken per
matrix over the last two dims, so each expert keeps its own initial norm.

Invariant of MuonH and AdamH (checked by tests/trainer/test_optim.py): after every step each
matrix's Frobenius norm equals its norm before the first step, ``c_W = ||W_0||_F``.

Precision: updates are computed in ``promote(param dtype, float32)`` (float32 for bf16/fp32
params, float64 for float64 params); Newton-Schulz itself runs in bf16 on CUDA.

``foreach=True`` (the default) runs a step batched: elementwise state with ``torch._foreach_*``,
Newton-Schulz and the sphere renormalisation once per group of same-shaped matrices
(trainer/optim/batched.py), whole matrices gathered for FSDP-sharded parameters. ``foreach=False``
is the per-matrix reference path the batched one is tested against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from hyperwatch.trainer.optim import batched
from hyperwatch.trainer.optim.newton_schulz import NS_STEPS, newton_schulz5

_NORM_EPS = 1e-12


def _matrix_norm(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each matrix in ``x`` (shape ``(..., m, n)``), kept as ``(..., 1, 1)``."""
    return x.norm(dim=(-2, -1), keepdim=True)


def _work_dtype(p: torch.Tensor) -> torch.dtype:
    return torch.promote_types(p.dtype, torch.float32)


def _param_label(group: dict[str, Any], index: int) -> str:
    names = group.get("param_names")
    if isinstance(names, list) and index < len(names):
        return f"parameter {names[index]!r}"
    return f"parameter #{index} of group {group.get('name', '?')!r}"


def _check_hyper(name: str, value: float, *, low: float = 0.0, high: float = math.inf) -> None:
    if not (math.isfinite(value) and low <= value < high):
        raise ValueError(f"{name} must be in [{low}, {high}), got {value!r}")


def _check_matrices(params: list[torch.Tensor], optimizer: str) -> None:
    for i, p in enumerate(params):
        if p.ndim < 2:
            raise ValueError(
                f"{optimizer} only takes matrices (..., out, in); parameter #{i} has shape "
                f"{tuple(p.shape)}: give vectors and scalars to AdamW instead"
            )


def _muon_defaults(
    lr: float, momentum: float, nesterov: bool, weight_decay: float, ns_steps: int, foreach: bool
) -> dict[str, Any]:
    _check_hyper("lr", lr)
    _check_hyper("momentum", momentum, high=1.0)
    _check_hyper("weight_decay", weight_decay)
    return {
        "lr": lr,
        "momentum": momentum,
        "nesterov": nesterov,
        "weight_decay": weight_decay,
        "ns_steps": ns_steps,
        "foreach": foreach,
    }


def _init_matrix_groups(optimizer: torch.optim.Optimizer, name: str) -> None:
    """Refuse non-matrices and remember each group's peak LR (the schedule scales ``lr``)."""
    for group in optimizer.param_groups:
        _check_matrices(group["params"], name)
        group.setdefault("initial_lr", group["lr"])


def _muon_direction(state: dict[str, Any], g: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
    """Nesterov momentum (``buf <- m*buf + g``, ``u = g + m*buf``), orthogonalised by Newton-Schulz."""
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(g)
    buf: torch.Tensor = state["momentum_buffer"]
    momentum = float(group["momentum"])
    buf.mul_(momentum).add_(g)
    u = g.add(buf, alpha=momentum) if group["nesterov"] else buf
    return newton_schulz5(u, steps=int(group["ns_steps"]))


def _with_grads(group: dict[str, Any]) -> tuple[list[int], list[torch.Tensor]]:
    pairs = [(i, p) for i, p in enumerate(group["params"]) if p.grad is not None]
    return [i for i, _ in pairs], [p for _, p in pairs]


def _muon_directions(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], group: dict[str, Any]
) -> list[torch.Tensor]:
    """:func:`_muon_direction` for a whole group: foreach momentum, batched Newton-Schulz on whole matrices."""
    grads = [p.grad for p in params if p.grad is not None]
    bufs = []
    for p, g in zip(params, grads, strict=True):
        state = optimizer.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(g)
        bufs.append(state["momentum_buffer"])
    momentum = float(group["momentum"])
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, grads)
    us = torch._foreach_add(grads, bufs, alpha=momentum) if group["nesterov"] else bufs
    return batched.orthogonalise([batched.full(u) for u in us], steps=int(group["ns_steps"]))


class _HypersphereState(torch.optim.Optimizer):
    """Shared by MuonH and AdamH: the stored ``c_W`` and the sphere-projected weight update.

    ``c_W`` lives in ``state[p]["c_W"]`` with shape ``(..., 1, 1)`` in float32 (float64 for float64
    params); AdamH's moments use the same precision. ``torch.optim.Optimizer.load_state_dict``
    would cast every floating state tensor to the parameter's dtype (a bf16 parameter would get
    its norm rounded to 3 digits), so :meth:`load_state_dict` puts the saved tensors back in their
    saved dtype: a resumed run renormalises to exactly the same radius.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = {
            int(key): {name: value for name, value in entry.items() if isinstance(value, torch.Tensor)}
            for key, entry in state_dict["state"].items()
        }
        super().load_state_dict(state_dict)
        id_to_param = {
            int(saved_id): p
            for saved_group, group in zip(state_dict["param_groups"], self.param_groups, strict=True)
            for saved_id, p in zip(saved_group["params"], group["params"], strict=True)
        }
        for key, tensors in saved.items():
            p = id_to_param[key]
            for name, value in tensors.items():
                self.state[p][name] = value.detach().to(device=p.device, copy=True)

    def _initial_norm(
        self, group: dict[str, Any], index: int, p: torch.Tensor, whole: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``c_W`` of ``p`` (recorded at its first step); ``whole`` is ``p`` gathered when it is sharded."""
        state = self.state[p]
        if "c_W" not in state:
            w = p if whole is None else whole
            c_w = _matrix_norm(w.detach().to(_work_dtype(w)))
            if bool(torch.any(c_w == 0)):
                raise ValueError(
                    f"{_param_label(group, index)} has a matrix with zero Frobenius norm at the first "
                    f"step; {type(self).__name__} keeps each matrix at its initial norm, so initialise "
                    f"it non-zero or give it to AdamW"
                )
            state["c_W"] = c_w
        c_w_stored: torch.Tensor = state["c_W"]
        return c_w_stored

    def _sphere_step(
        self, group: dict[str, Any], indices: list[int], params: list[torch.Tensor], directions: list[torch.Tensor]
    ) -> None:
        """The batched :meth:`_sphere_update` of a group (``directions`` whole matrices)."""
        weights = [batched.full(p.detach()) for p in params]
        c_ws = [self._initial_norm(group, i, p, w) for i, p, w in zip(indices, params, weights, strict=True)]
        batched.sphere_update(params, weights, directions, c_ws, float(group["lr"]), float(group["weight_decay"]))

    @staticmethod
    def _sphere_update(
        p: torch.Tensor, direction: torch.Tensor, c_w: torch.Tensor, lr: float, weight_decay: float
    ) -> None:
        """``W+ = c_W * (W' - lr*G_hat) / ||W' - lr*G_hat||_F`` with ``G_hat = c_W * G/||G||_F``.

        ``W' = (1 - lr*weight_decay) * W`` (decay coupled to the LR, as AdamW's). The decay only
        shrinks W radially, and the projection removes the radial part, so its whole effect is to
        enlarge the effective step by ``1/(1 - lr*weight_decay)``: a change of order
        ``lr^2 * weight_decay`` (spec section 1: weight decay is a first-order no-op on the sphere).
        """
        dtype = _work_dtype(p)
        w = p.detach().to(dtype)
        if weight_decay != 0.0:
            w = w * (1.0 - lr * weight_decay)
        g = direction.to(dtype)
        g_hat = c_w * g / (_matrix_norm(g) + _NORM_EPS)
        w = w - lr * g_hat
        w = c_w * w / _matrix_norm(w)
        p.copy_(w)


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al. 2024): Nesterov momentum, then Newton-Schulz orthogonalisation.

    Per step, for each matrix ``W`` with gradient ``g`` (spec section 1)::

        buf <- momentum * buf + g
        u   <- g + momentum * buf                 (Nesterov; plain momentum uses u = buf)
        O   <- newton_schulz5(u)                   (singular values ~0.7..1.2)
        W   <- W - (lr / initial_lr) * weight_decay * W     (independent weight decay)
        W   <- W - lr * O

    No shape scaling happens here: the muP++ multiplier ``sqrt(d_out/d_in) * sqrt(d_0/d)`` is
    carried by the group's ``lr`` (see trainer.optim.build_optimizers). Weight decay is
    *independent* (the paper's Muon arm): its size follows the schedule, ``lr_t / lr_peak``, but
    not the peak LR itself, so ``lambda = lambda_0 * w_0/w`` means the same at every LR; the peak
    is the group's ``initial_lr`` (set to ``lr`` at construction when absent).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_steps: int = NS_STEPS,
        foreach: bool = True,
    ) -> None:
        super().__init__(params, _muon_defaults(lr, momentum, nesterov, weight_decay, ns_steps, foreach))
        _init_matrix_groups(self, "Muon")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            peak = float(group["initial_lr"])
            decay = float(group["weight_decay"]) * (lr / peak if peak > 0 else 0.0)
            if group.get("foreach", True):
                self._step_batched(group, lr, decay)
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = _muon_direction(self.state[p], p.grad, group)
                if decay != 0.0:
                    p.mul_(1.0 - decay)
                p.add_(update.to(p.dtype), alpha=-lr)
        return loss

    def _step_batched(self, group: dict[str, Any], lr: float, decay: float) -> None:
        _, params = _with_grads(group)
        if not params:
            return
        updates = _muon_directions(self, params, group)
        if any(batched.is_sharded(p) for p in params):
            whole = [batched.full(p.detach()) * (1.0 - decay) - lr * u.to(p.dtype) for p, u in zip(params, updates)]
            batched.write_back(params, whole)
            return
        if decay != 0.0:
            torch._foreach_mul_(params, 1.0 - decay)
        torch._foreach_add_(params, [u.to(p.dtype) for p, u in zip(params, updates, strict=True)], alpha=-lr)


class MuonH(_HypersphereState):
    """MuonH: Muon's direction, with update normalisation and weight renormalisation.

    Spec section 1 (Wen et al. 2025)::

        buf   <- momentum * buf + g;  u <- g + momentum * buf      (Nesterov, as Muon)
        G     <- newton_schulz5(u)
        G_hat <- c_G * G / ||G||_F,   c_G = c_W = ||W_0||_F
        W+    <- c_W * (W - lr * G_hat) / ||W - lr * G_hat||_F

    Invariant: every matrix (every expert of a 3-D tensor) keeps ``||W||_F = c_W`` after every
    step, and ``||W+ - W||_F / ||W||_F`` is about ``lr`` whatever the matrix's shape, so one LR
    serves all hidden matrices (no shape multiplier). ``c_W`` is recorded at the first step and
    saved in the state dict, so a resumed run renormalises to the same radius.

    ``weight_decay`` (default 0; the paper uses none) is applied as ``W <- (1 - lr*wd) W`` before
    the projection, only to let the tests show its effect is second order in the step size.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.0,
        ns_steps: int = NS_STEPS,
        foreach: bool = True,
    ) -> None:
        super().__init__(params, _muon_defaults(lr, momentum, nesterov, weight_decay, ns_steps, foreach))
        _init_matrix_groups(self, "MuonH")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            if group.get("foreach", True):
                indices, params = _with_grads(group)
                if params:
                    self._sphere_step(group, indices, params, _muon_directions(self, params, group))
                continue
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                c_w = self._initial_norm(group, index, p)
                direction = _muon_direction(self.state[p], p.grad, group)
                self._sphere_update(p, direction, c_w, lr, float(group["weight_decay"]))
        return loss


class AdamH(_HypersphereState):
    """AdamH: Adam's direction on the Frobenius sphere, for the LM head (spec section 1).

    The moments are AdamW's (betas (0.9, 0.95), eps 1e-8, bias correction)::

        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        U <- (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
        U_hat <- c_G * U / ||U||_F,   c_G = c_W = ||W_0||_F
        W+ <- c_W * (W - lr * U_hat) / ||W - lr * U_hat||_F

    Because ``||dW||_F / ||W||_F`` is fixed by ``lr`` as under MuonH, the head shares the hidden
    matrices' LR (one LR for MuonH and AdamH). Same invariant, same ``c_W`` state and the same
    optional second-order ``weight_decay`` as :class:`MuonH`.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.02,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach: bool = True,
    ) -> None:
        _check_hyper("lr", lr)
        _check_hyper("betas[0]", betas[0], high=1.0)
        _check_hyper("betas[1]", betas[1], high=1.0)
        _check_hyper("eps", eps)
        _check_hyper("weight_decay", weight_decay)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "foreach": foreach}
        super().__init__(params, defaults)
        _init_matrix_groups(self, "AdamH")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = float(group["lr"])
            beta1, beta2 = (float(b) for b in group["betas"])
            if group.get("foreach", True):
                indices, params = _with_grads(group)
                if params:
                    self._sphere_step(group, indices, params, self._adam_directions(params, group))
                continue
            for index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                c_w = self._initial_norm(group, index, p)
                state = self.state[p]
                dtype = _work_dtype(p)
                if "exp_avg" not in state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
                g = p.grad.to(dtype)
                state["step"] = int(state["step"]) + 1
                t = state["step"]
                exp_avg: torch.Tensor = state["exp_avg"]
                exp_avg_sq: torch.Tensor = state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(g, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                m_hat = exp_avg / (1.0 - beta1**t)
                v_hat = exp_avg_sq / (1.0 - beta2**t)
                direction = m_hat / (v_hat.sqrt() + float(group["eps"]))
                self._sphere_update(p, direction, c_w, lr, float(group["weight_decay"]))
        return loss

    def _adam_directions(self, params: list[torch.Tensor], group: dict[str, Any]) -> list[torch.Tensor]:
        """Bias-corrected Adam directions of a group with foreach moments, as whole matrices."""
        beta1, beta2 = (float(b) for b in group["betas"])
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        for p in params:
            state = self.state[p]
            dtype = _work_dtype(p)
            if "exp_avg" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
            state["step"] = int(state["step"]) + 1
            steps.append(state["step"])
            grads.append(p.grad.to(dtype))  # type: ignore[union-attr]
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        denom = torch._foreach_div(exp_avg_sqs, [1.0 - beta2**t for t in steps])
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, float(group["eps"]))
        directions = torch._foreach_div(exp_avgs, denom)
        torch._foreach_div_(directions, [1.0 - beta1**t for t in steps])
        return [batched.full(d) for d in directions]
