"""Transformer-Next and Transformer-Next-MoE (spec section 3), top to bottom.

A depth-d model has width w = alpha*d, 2d query heads of ``head_dim``, GQA with ``n_kv_heads``
key/value heads, RoPE, QK-Norm and head-wise gated attention (both switchable), a SwiGLU MLP of
intermediate size 4w (or the MoE of ``trainer/moe.py``), pre-norm RMSNorm and an untied
embedding and LM head.

Parameterization (spec section 2) enters the model in two places: the residual multiplier
(1/sqrt(2d) under muP++ and HyperP) that scales each branch's output *inside* the branch module,
so that a forward hook on ``block.attn`` / ``block.mlp`` sees exactly what is added to the
residual stream (where the spec measures RMS and outliers); and the LM-head weight multiplier
(w_0/w under muP and muP++). Initialization: embedding N(0, 1); every Linear keeps PyTorch's
default (Kaiming uniform, std 1/sqrt(3 d_in), so ||W_0||_F ~ sqrt(d_out/3)); the LM head too —
the spec's "init std 1" for the unembedding is read as a unit multiplier on that default, since
an absolute std of 1 with weight multiplier 1 (HyperP) would start logits at std ~sqrt(w).

Names with shape suffixes: B batch, T time, W width, H query heads, K key/value heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch.trainer.attention import causal_attention
from hyperwatch.trainer.config import ModelConfig
from hyperwatch.trainer.layers import RMSNorm, SwiGLU, apply_rope, rope_tables
from hyperwatch.trainer.moe import AuxLosses, MoE


class Attention(nn.Module):
    """GQA causal self-attention with QK-Norm, RoPE and a head-wise sigmoid output gate.

    When ``capture_lse`` is set, forward keeps the kernel's log-sum-exp in ``self.lse``
    ((B, H, T), fp32, detached) for the attention Z-value; ``kernel_path`` names the kernel.
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        W, H, K, D = cfg.width, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = H, K, D
        self.scale = D**-0.5
        self.kernel = cfg.attention_kernel
        self.residual_multiplier = cfg.residual_multiplier
        self.q_proj = nn.Linear(W, H * D, bias=False)
        self.k_proj = nn.Linear(W, K * D, bias=False)
        self.v_proj = nn.Linear(W, K * D, bias=False)
        self.o_proj = nn.Linear(H * D, W, bias=False)
        self.gate_proj = nn.Linear(W, H, bias=False) if cfg.gated_attention else None
        self.q_norm = RMSNorm(D, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(D, cfg.norm_eps) if cfg.qk_norm else None
        self.capture_lse = False
        self.lse: torch.Tensor | None = None
        self.kernel_path = ""

    def forward(self, x_BTW: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTW.shape
        H, K, D = self.n_heads, self.n_kv_heads, self.head_dim
        q_BTHD = self.q_proj(x_BTW).view(B, T, H, D)
        k_BTKD = self.k_proj(x_BTW).view(B, T, K, D)
        v_BTKD = self.v_proj(x_BTW).view(B, T, K, D)
        if self.q_norm is not None and self.k_norm is not None:
            q_BTHD, k_BTKD = self.q_norm(q_BTHD), self.k_norm(k_BTKD)
        q_BTHD, k_BTKD = apply_rope(q_BTHD, cos, sin), apply_rope(k_BTKD, cos, sin)
        group = H // K
        q_BHTD = q_BTHD.transpose(1, 2)
        k_BHTD = k_BTKD.transpose(1, 2).repeat_interleave(group, dim=1)
        v_BHTD = v_BTKD.transpose(1, 2).repeat_interleave(group, dim=1)
        out_BHTD, lse, self.kernel_path = causal_attention(
            q_BHTD, k_BHTD, v_BHTD, self.scale, need_lse=self.capture_lse, kernel=self.kernel
        )
        self.lse = lse.detach() if lse is not None else None
        out_BTHD = out_BHTD.transpose(1, 2)
        if self.gate_proj is not None:
            out_BTHD = out_BTHD * torch.sigmoid(self.gate_proj(x_BTW)).unsqueeze(-1)
        return self.o_proj(out_BTHD.reshape(B, T, H * D)) * self.residual_multiplier


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)); branches carry their multiplier."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.mlp: nn.Module = (
            MoE(cfg, layer_idx) if cfg.moe else SwiGLU(cfg.width, cfg.mlp_hidden, cfg.residual_multiplier)
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, aux_out: AuxLosses | None = None
    ) -> torch.Tensor:
        """``aux_out`` collects the MoE's aux loss with its graph (the module keeps only its value)."""
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + (self.mlp(h, aux_out=aux_out) if isinstance(self.mlp, MoE) else self.mlp(h))


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, T, V) fp32
    loss: torch.Tensor | None = None  # lm_loss + aux_loss
    lm_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None  # sum over MoE layers (gamma included)


class Transformer(nn.Module):
    """Transformer-Next; ``cfg.moe`` swaps every MLP for Transformer-Next-MoE's MoE."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("ModelConfig.vocab_size: 0 means 'from the tokenizer'; resolve it before building")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.depth))
        self.final_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        self.head_multiplier = cfg.head_multiplier
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        nn.init.normal_(self.embed.weight, mean=0.0, std=1.0)

    def parameter_roles(self) -> dict[str, str]:
        """Every parameter's optimizer role: embedding, head, hidden (2-D/3-D matrices) or vector."""
        roles = {}
        for name, p in self.named_parameters():
            if name == "embed.weight":
                roles[name] = "embedding"
            elif name == "lm_head.weight":
                roles[name] = "head"
            else:
                roles[name] = "hidden" if p.ndim >= 2 else "vector"
        return roles

    @property
    def moe_layers(self) -> list[MoE]:
        return [b.mlp for b in self.blocks if isinstance(b.mlp, MoE)]  # type: ignore[union-attr]

    def forward(self, idx_BT: torch.Tensor, targets_BT: torch.Tensor | None = None) -> ModelOutput:
        T = idx_BT.shape[1]
        if self.cfg.seq_len < T:
            raise ValueError(f"sequence of {T} tokens is longer than ModelConfig.seq_len={self.cfg.seq_len}")
        x = self.embed(idx_BT)
        aux = AuxLosses()  # per forward, never on a module: deepcopy works after a forward
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin, aux_out=aux)
        x = self.final_norm(x)
        logits = self.lm_head(x * self.head_multiplier).float()
        if targets_BT is None:
            return ModelOutput(logits=logits)
        lm_loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets_BT.reshape(-1))
        if len(aux.losses) != len(self.moe_layers):
            raise RuntimeError(
                f"{len(self.moe_layers)} MoE layers ran but {len(aux.losses)} aux losses reached the model: a "
                "wrapper replaced the aux_out collector; pass it through unchanged"
            )
        aux_loss = aux.total()
        loss = lm_loss + aux_loss if aux_loss is not None else lm_loss
        return ModelOutput(logits=logits, loss=loss, lm_loss=lm_loss, aux_loss=aux_loss)
