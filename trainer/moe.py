"""Transformer-Next-MoE's mixture of experts (spec section 3).

With sparsity S and granularity k, active parameters equal the dense model's: kS - 1 routed
experts plus one always-on shared expert, Top-(k-1) routed experts per token, each expert a
SwiGLU of intermediate size 4w/k. (Without the shared expert: kS routed experts, Top-k.)

- Router: logits z = x W_r over the routed experts, computed in fp32 (autocast off).
- Softmax *after* Top-k (as gpt-oss): gates g = softmax over the selected logits only.
- SqrtGate: routed experts are combined with sqrt(g_i), so the routed branch keeps RMS r for
  experts of RMS r with weakly correlated outputs whatever k (classical g_i gives r/sqrt(k)).
- With a shared expert the output is (routed + shared) / sqrt(2); then the residual multiplier.
- Switch load-balancing loss over the *global* batch: L_aux = gamma * N * sum_i f_i * P_i with
  f_i the fraction of dispatched tokens (hard counts) and P_i the mean full-softmax router
  probability of expert i. Counts and probability sums are all-reduced over data-parallel ranks
  first; the probability all-reduce is autograd-aware, so after DDP's gradient averaging each
  rank's router receives exactly the gradient of the global loss. It is computed per micro-batch.

Experts are stored as 3-D tensors (E, out, in): one kernel-friendly parameter, while the
optimizer treats each expert as its own matrix (own Frobenius norm under MuonH).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hyperwatch.trainer.config import ModelConfig
from hyperwatch.trainer.layers import SwiGLU


def max_vio(counts: torch.Tensor) -> torch.Tensor:
    """MaxVio = (max_i c_i - mean_i c_i) / mean_i c_i over routed experts; 0 is perfectly balanced."""
    c = counts.float()
    mean = c.mean()
    return (c.max() - mean) / mean


def switch_aux_loss(counts_E: torch.Tensor, prob_sum_E: torch.Tensor, n_tokens: float, gamma: float) -> torch.Tensor:
    """gamma * N * sum_i f_i * P_i from global hard counts and global summed router probabilities."""
    n_experts = counts_E.numel()
    f = counts_E.float() / counts_E.sum().clamp_min(1)
    p = prob_sum_E / n_tokens
    return gamma * n_experts * (f * p).sum()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class GroupedExperts(nn.Module):
    """E SwiGLU experts held as (E, out, in) weights, each initialised like a default nn.Linear."""

    def __init__(self, n_experts: int, width: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, width))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, width))
        self.w2 = nn.Parameter(torch.empty(n_experts, width, hidden))
        for w in (self.w1, self.w3, self.w2):
            bound = 1.0 / math.sqrt(w.shape[-1])  # PyTorch's Linear default: U(-1/sqrt(in), 1/sqrt(in))
            nn.init.uniform_(w, -bound, bound)

    def forward(self, x_NW: torch.Tensor, expert_NK: torch.Tensor, weight_NK: torch.Tensor) -> torch.Tensor:
        """sum_k weight[n,k] * expert_{idx[n,k]}(x[n]); tokens are sorted by expert, one matmul each."""
        K = expert_NK.shape[1]
        flat = expert_NK.reshape(-1)
        order = flat.argsort(stable=True)
        token_of = order // K
        counts = torch.bincount(flat, minlength=self.w1.shape[0]).tolist()
        xs = x_NW[token_of]
        outs = []
        for e, chunk in enumerate(xs.split(counts)):
            if chunk.shape[0] == 0:
                continue
            h = F.silu(chunk @ self.w1[e].t()) * (chunk @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
        ys = torch.cat(outs) * weight_NK.reshape(-1)[order].unsqueeze(-1).to(x_NW.dtype)
        return torch.zeros_like(x_NW).index_add_(0, token_of, ys)


class MoE(nn.Module):
    """Router + routed experts (+ shared expert). Keeps ``counts``/``aux_loss`` (and router logits on demand).

    ``capture``: when set, forward keeps ``router_logits`` ((tokens, E) fp32, detached, before
    Top-k) for the router Z-value. ``counts`` ((E,) int64, this micro-batch on this rank) and
    ``aux_loss`` are kept on every forward: the loss needs them anyway.
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_experts = cfg.n_routed_experts
        self.top_k = cfg.moe_top_k
        self.sqrt_gate = cfg.sqrt_gate
        self.gamma = cfg.aux_loss_gamma
        self.residual_multiplier = cfg.residual_multiplier
        self.router = nn.Linear(cfg.width, self.n_experts, bias=False)
        self.experts = GroupedExperts(self.n_experts, cfg.width, cfg.expert_hidden)
        self.shared = SwiGLU(cfg.width, cfg.expert_hidden) if cfg.shared_expert else None
        self.capture = False
        self.router_logits: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.aux_loss: torch.Tensor | None = None

    def route(self, x_NW: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(router logits fp32 (N, E), selected experts (N, K), combine weights (N, K))."""
        with torch.autocast(device_type=x_NW.device.type, enabled=False):
            logits_NE = F.linear(x_NW.float(), self.router.weight.float())
        top_logits, top_idx = logits_NE.topk(self.top_k, dim=-1)
        gates = torch.softmax(top_logits, dim=-1)  # softmax after Top-k
        weights = gates.sqrt() if self.sqrt_gate else gates
        return logits_NE, top_idx, weights

    def forward(self, x_BTW: torch.Tensor) -> torch.Tensor:
        B, T, W = x_BTW.shape
        x_NW = x_BTW.reshape(B * T, W)
        logits_NE, top_idx, weights = self.route(x_NW)
        counts = torch.bincount(top_idx.reshape(-1), minlength=self.n_experts)
        self.counts = counts.detach()
        self.router_logits = logits_NE.detach() if self.capture else None
        self.aux_loss = self._aux_loss(logits_NE, counts)
        out = self.experts(x_NW, top_idx, weights)
        if self.shared is not None:
            out = (out + self.shared(x_NW)) / math.sqrt(2.0)
        return out.view(B, T, W) * self.residual_multiplier

    def _aux_loss(self, logits_NE: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        prob_sum = torch.softmax(logits_NE, dim=-1).sum(0)
        counts_f = counts_E.float()
        n_tokens = float(logits_NE.shape[0])
        if _distributed():
            import torch.distributed.nn.functional as dist_fn

            counts_f = counts_f.clone()
            dist.all_reduce(counts_f)
            prob_sum = dist_fn.all_reduce(prob_sum)
            n_tokens *= dist.get_world_size()  # every rank runs micro-batches of the same shape
        return switch_aux_loss(counts_f, prob_sum, n_tokens, self.gamma)
