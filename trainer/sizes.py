"""Parameter counts, token budgets and training FLOPs, from formulas (no weights allocated).

FLOPs follow Chinchilla's accounting (Hoffmann et al. 2022, appendix F; spec section 5): a
multiply-add is 2 FLOPs; per token the forward pass counts the embedding and LM-head matmuls,
the Q/K/V/O and gate projections (GQA shrinks K/V), attention logits and values (seq^2 terms,
no causal halving), the softmax (3 FLOPs per score) and the MLP (SwiGLU's three matrices; an
MoE counts its router and the experts a token actually visits). Norms, RoPE and the gates'
element-wise products are left out, as Chinchilla leaves out non-matmul terms. Backward = 2 x
forward, so training FLOPs = 3 x forward x tokens.

Token budgets: T = TPP x N with N the (active) parameter count including embeddings, which
reproduces the reference runs' T_0 = 10.4e9 for the depth-8 dense model at 50 TPP.

The formulas are checked against the model built on the meta device in the tests.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from hyperwatch.trainer.config import ModelConfig


@dataclass(frozen=True)
class ModelSize:
    depth: int
    width: int
    n_heads: int
    total_params: int
    active_params: int
    embedding_params: int  # input embedding + LM head
    forward_flops_per_token: int
    tokens: int
    training_flops: float
    tokens_per_param: float


def attention_params(cfg: ModelConfig) -> int:
    W, H, K, D = cfg.width, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    n = W * H * D + 2 * W * K * D + H * D * W + W  # q, k, v, o, pre-norm gain
    n += W * H if cfg.gated_attention else 0
    n += 2 * D if cfg.qk_norm else 0
    return n


def mlp_params(cfg: ModelConfig, active: bool) -> int:
    W = cfg.width
    if not cfg.moe:
        return 3 * W * cfg.mlp_hidden + W
    expert = 3 * W * cfg.expert_hidden
    routed = cfg.moe_top_k if active else cfg.n_routed_experts
    n = W * cfg.n_routed_experts + routed * expert + W  # router, experts, pre-norm gain
    return n + (expert if cfg.shared_expert else 0)


def param_counts(cfg: ModelConfig) -> tuple[int, int, int]:
    """(total, active, embedding+head) parameters."""
    emb = 2 * cfg.vocab_size * cfg.width
    per_layer_total = attention_params(cfg) + mlp_params(cfg, active=False)
    per_layer_active = attention_params(cfg) + mlp_params(cfg, active=True)
    final_norm = cfg.width
    return (
        emb + cfg.depth * per_layer_total + final_norm,
        emb + cfg.depth * per_layer_active + final_norm,
        emb,
    )


def forward_flops_per_token(cfg: ModelConfig) -> int:
    W, H, K, D, T, V = cfg.width, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.seq_len, cfg.vocab_size
    attn = 2 * W * (H * D + 2 * K * D)  # q, k, v projections
    attn += 2 * W * H if cfg.gated_attention else 0  # head gates
    attn += 2 * T * H * D  # logits q.k
    attn += 3 * H * T  # softmax
    attn += 2 * T * H * D  # softmax @ V
    attn += 2 * H * D * W  # output projection
    if cfg.moe:
        visited = cfg.moe_top_k + (1 if cfg.shared_expert else 0)
        mlp = 2 * W * cfg.n_routed_experts + visited * 2 * 3 * W * cfg.expert_hidden
    else:
        mlp = 2 * 3 * W * cfg.mlp_hidden
    return 2 * V * W + cfg.depth * (attn + mlp) + 2 * W * V  # embedding, blocks, LM head


def model_size(cfg: ModelConfig, tokens: int = 0, tpp: float = 50.0) -> ModelSize:
    """Sizes of ``cfg``; ``tokens = 0`` derives the budget from ``tpp`` x active parameters."""
    total, active, emb = param_counts(cfg)
    fwd = forward_flops_per_token(cfg)
    tokens = tokens or round(tpp * active)
    return ModelSize(
        depth=cfg.depth,
        width=cfg.width,
        n_heads=cfg.n_heads,
        total_params=total,
        active_params=active,
        embedding_params=emb,
        forward_flops_per_token=fwd,
        tokens=tokens,
        training_flops=3.0 * fwd * tokens,
        tokens_per_param=tokens / active,
    )


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Sizes, token budget and training FLOPs of a model.")
    p.add_argument("--depth", type=int, required=True, help="number of blocks d (width = alpha * d)")
    p.add_argument("--alpha", type=int, default=128, help="width per unit of depth (default 128)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--n-kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--moe-sparsity", type=int, default=0, help="S; with --moe-granularity makes an MoE")
    p.add_argument("--moe-granularity", type=int, default=0, help="k: kS-1 routed experts, Top-(k-1)")
    p.add_argument("--no-shared-expert", action="store_true")
    p.add_argument("--no-gate", action="store_true", help="without head-wise gated attention")
    p.add_argument("--no-qk-norm", action="store_true")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--tpp", type=float, default=None, help="tokens per active parameter (default 50)")
    budget.add_argument("--tokens", type=float, default=None, help="training tokens (e.g. 10.4e9)")
    return p


def run(args: argparse.Namespace) -> int:
    moe = bool(args.moe_sparsity or args.moe_granularity)
    if moe and not (args.moe_sparsity and args.moe_granularity):
        raise SystemExit("hyperwatch size: give both --moe-sparsity and --moe-granularity for an MoE")
    if args.tokens is not None and args.tokens <= 0:
        raise SystemExit("hyperwatch size: --tokens must be > 0")
    if args.tpp is not None and args.tpp <= 0:
        raise SystemExit("hyperwatch size: --tpp must be > 0")
    try:
        cfg = ModelConfig(
            depth=args.depth,
            alpha=args.alpha,
            head_dim=args.head_dim,
            n_kv_heads=args.n_kv_heads,
            vocab_size=args.vocab,
            seq_len=args.seq_len,
            qk_norm=not args.no_qk_norm,
            gated_attention=not args.no_gate,
            moe=moe,
            moe_sparsity=args.moe_sparsity or 8,
            moe_granularity=args.moe_granularity or 8,
            shared_expert=not args.no_shared_expert,
        )
    except ValueError as exc:
        raise SystemExit(f"hyperwatch size: {exc}") from exc
    if cfg.vocab_size < 1:
        raise SystemExit("hyperwatch size: --vocab must be >= 1")
    size = model_size(cfg, tokens=int(args.tokens or 0), tpp=args.tpp or 50.0)
    out = asdict(size)
    out["moe"] = (
        {
            "sparsity": cfg.moe_sparsity,
            "granularity": cfg.moe_granularity,
            "routed_experts": cfg.n_routed_experts,
            "top_k": cfg.moe_top_k,
            "shared_expert": cfg.shared_expert,
            "expert_hidden": cfg.expert_hidden,
        }
        if moe
        else None
    )
    print(json.dumps(out, indent=2))
    return 0
