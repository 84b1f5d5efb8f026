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


class AuxLosses:
    """The MoE layers' aux losses of one forward, with their graph (the Transformer makes one per forward).

    A small object rather than a plain list on purpose: wrappers that rebuild a module's call
    arguments (FSDP2's and DDP's device moves map over lists, tuples and dicts) pass an unknown
    object through untouched, so every layer appends to the caller's one collector.
    """

    __slots__ = ("losses",)

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor) -> None:
        self.losses.append(loss)

    def total(self) -> torch.Tensor | None:
        return torch.stack(self.losses).sum() if self.losses else None


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


def grouped_mm_available(device: torch.device) -> bool:
    """Whether ``torch._grouped_mm`` ships with this torch and runs on ``device``.

    It exists from torch 2.8; CUDA needs compute capability >= 8.0 (bf16 tensor cores); the CPU
    build has a reference implementation (used by the tests to check the fast path on CPU).
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu"


def _aligned(dtype: torch.dtype, *dims: int) -> bool:
    """Grouped-GEMM kernels want every row stride a multiple of 16 bytes."""
    size = dtype.itemsize
    return all((d * size) % 16 == 0 for d in dims)


class GroupedExperts(nn.Module):
    """E SwiGLU experts held as (E, out, in) weights, each initialised like a default nn.Linear.

    Two kernels compute the same thing (``kernel``): ``"loop"`` -- one matmul per expert over its
    slice of the expert-sorted tokens; the slice sizes go to the host (``.tolist()``), which is
    free on CPU and the reference the other is tested against. ``"grouped"`` -- three grouped
    GEMMs (``torch._grouped_mm``) over all experts at once with the group offsets kept on the
    device: no host sync, one launch per projection, what a GPU wants. ``"auto"`` takes
    ``grouped`` on CUDA where it runs (sm80+, bf16 autocast, sizes 16-byte aligned), else ``loop``.
    """

    def __init__(self, n_experts: int, width: int, hidden: int, kernel: str = "auto") -> None:
        super().__init__()
        self.kernel = kernel
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, width))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, width))
        self.w2 = nn.Parameter(torch.empty(n_experts, width, hidden))
        for w in (self.w1, self.w3, self.w2):
            bound = 1.0 / math.sqrt(w.shape[-1])  # PyTorch's Linear default: U(-1/sqrt(in), 1/sqrt(in))
            nn.init.uniform_(w, -bound, bound)

    def _compute_dtype(self, x: torch.Tensor) -> torch.dtype:
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
        return x.dtype

    def use_grouped(self, x: torch.Tensor) -> bool:
        """The kernel this forward takes (see the class docstring); raises if ``grouped`` cannot run."""
        if self.kernel == "loop":
            return False
        dtype = self._compute_dtype(x)
        dtypes = (torch.bfloat16,) if x.device.type == "cuda" else (torch.bfloat16, torch.float16, torch.float32)
        ok = grouped_mm_available(x.device) and dtype in dtypes and _aligned(dtype, self.w1.shape[1], self.w1.shape[2])
        if self.kernel == "grouped":
            if not ok:
                raise RuntimeError(
                    f"ModelConfig.expert_kernel='grouped' cannot run here (torch {torch.__version__}, "
                    f"{x.device.type}, {dtype}, width {self.w1.shape[2]}, expert hidden {self.w1.shape[1]}: "
                    "needs torch._grouped_mm, CUDA sm80+ with bf16 or CPU with bf16/fp16/fp32, and sizes * "
                    "element size multiples of 16 bytes); use expert_kernel='auto'"
                )
            return True
        return ok and x.device.type == "cuda"

    def forward(self, x_NW: torch.Tensor, expert_NK: torch.Tensor, weight_NK: torch.Tensor) -> torch.Tensor:
        """sum_k weight[n,k] * expert_{idx[n,k]}(x[n]); tokens are sorted by expert first."""
        K = expert_NK.shape[1]
        flat = expert_NK.reshape(-1)
        order = flat.argsort(stable=True)
        token_of = order // K
        xs = x_NW[token_of]
        ys = self._grouped(xs, flat) if self.use_grouped(x_NW) else self._loop(xs, flat)
        ys = ys * weight_NK.reshape(-1)[order].unsqueeze(-1).to(x_NW.dtype)  # combined in x's precision
        return torch.zeros_like(x_NW, dtype=ys.dtype).index_add_(0, token_of, ys)

    def _loop(self, xs: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        counts = torch.bincount(flat, minlength=self.w1.shape[0]).tolist()  # host sync: the CPU path
        outs = []
        for e, chunk in enumerate(xs.split(counts)):
            if chunk.shape[0] == 0:
                continue
            h = F.silu(chunk @ self.w1[e].t()) * (chunk @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
        return torch.cat(outs)

    def _grouped(self, xs: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        counts = expert_counts(flat, self.w1.shape[0])  # on the device, no sync
        offs = counts.cumsum(0).to(torch.int32)
        dtype = self._compute_dtype(xs)
        with torch.autocast(device_type=xs.device.type, enabled=False):
            x = xs.to(dtype)
            w1, w3, w2 = (w.to(dtype).transpose(-2, -1) for w in (self.w1, self.w3, self.w2))
            h = F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)
            return torch._grouped_mm(h, w2, offs=offs)


def expert_counts(flat: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens per expert, (E,) int64, without ``bincount`` (whose CUDA kernel reads the max on the host)."""
    counts = torch.zeros(n_experts, dtype=torch.int64, device=flat.device)
    return counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int64))


class MoE(nn.Module):
    """Router + routed experts (+ shared expert).

    Kept after each forward for the hooks, all detached (so ``copy.deepcopy`` of the model works
    after a forward and nothing holds the step's graph alive): ``counts`` ((E,) int64, this
    micro-batch on this rank), ``aux_loss`` (its value) and, when ``capture`` is set,
    ``router_logits`` ((tokens, E) fp32, before Top-k) for the router Z-value. The aux loss *with*
    its graph goes to the caller through ``aux_out`` (an :class:`AuxLosses` the Transformer
    creates per forward and sums into the loss); called without it, the layer's aux loss takes no part in training.
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
        self.experts = GroupedExperts(self.n_experts, cfg.width, cfg.expert_hidden, cfg.expert_kernel)
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

    def forward(self, x_BTW: torch.Tensor, aux_out: AuxLosses | None = None) -> torch.Tensor:
        B, T, W = x_BTW.shape
        x_NW = x_BTW.reshape(B * T, W)
        logits_NE, top_idx, weights = self.route(x_NW)
        counts = expert_counts(top_idx.reshape(-1), self.n_experts)
        aux = self._aux_loss(logits_NE, counts)
        if aux_out is not None:
            aux_out.add(aux)
        self.counts = counts
        self.aux_loss = aux.detach()
        self.router_logits = logits_NE.detach() if self.capture else None
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
