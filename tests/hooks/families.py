"""Tiny models of many families, built from configs (random init, no download), and where each
family's residual stream receives its branches, written down from each architecture's source
independently of the hooks (the families test checks the hooks against these)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

HIDDEN, LAYERS, VOCAB, SEQ, BATCH = 64, 2, 96, 10, 2
ATTENTION_KEYS = frozenset({"attention_z", "attention_rms", "attention_outlier_ratio"})

Branch = Callable[[nn.Module], tuple[nn.Module, float]]
"""block -> (module whose first output, times the factor, is what the residual adds, factor)."""


@dataclass
class Family:
    kind: str  # dense, moe, encoder, encoder-decoder, vision, no-attention
    build: Callable[[str], nn.Module]  # attention implementation -> model
    blocks: Callable[[nn.Module], list[nn.Module]]
    mlp: Branch
    attention: Branch | None = None
    router: Callable[[nn.Module], nn.Module] | None = None
    top_k: int = 0
    attn: str = "sdpa"  # the implementation the model trains with; the reference runs "eager"
    unavailable: frozenset[str] = frozenset()
    notes: frozenset[str] = frozenset()
    inputs: Callable[[torch.Generator], dict[str, Any]] = field(default=lambda g: _tokens(g))


def _tokens(g: torch.Generator) -> dict[str, Any]:
    x = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": x, "labels": x}


def _images(g: torch.Generator) -> dict[str, Any]:
    return {
        "pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g),
        "labels": torch.randint(0, 3, (BATCH,), generator=g),
    }


def _vectors(g: torch.Generator) -> dict[str, Any]:
    return {"x": torch.randn(BATCH, SEQ, HIDDEN, generator=g)}


def _t():  # type: ignore[no-untyped-def]
    return pytest.importorskip("transformers")


def _common(attn: str) -> dict[str, Any]:
    return dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        attn_implementation=attn,
        num_key_value_heads=2,
    )


def _child(path: str, scale: float = 1.0) -> Branch:
    def get(block: nn.Module) -> tuple[nn.Module, float]:
        return block.get_submodule(path), scale

    return get


class ResidualMLP(nn.Module):
    """A residual MLP stack: no attention anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "norm": nn.LayerNorm(HIDDEN),
                    "ff": nn.Sequential(nn.Linear(HIDDEN, 96), nn.GELU(), nn.Linear(96, HIDDEN)),
                }
            )
            for _ in range(LAYERS)
        )
        self.head = nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> Any:
        for layer in self.layers:
            x = x + layer["ff"](layer["norm"](x))
        return _Out(self.head(x).square().mean())


class _Out:
    def __init__(self, loss: torch.Tensor) -> None:
        self.loss = loss


def _layers(m: nn.Module) -> list[nn.Module]:
    return list(m.model.layers)  # type: ignore[union-attr, arg-type]


def families() -> dict[str, Family]:
    T = _t()

    def llama(a: str) -> nn.Module:
        return T.LlamaForCausalLM(T.LlamaConfig(**_common(a)))

    def qwen2(a: str) -> nn.Module:
        return T.Qwen2ForCausalLM(T.Qwen2Config(**_common(a)))

    def gemma2(a: str) -> nn.Module:  # sandwich norms, logit soft-capping (eager only)
        return T.Gemma2ForCausalLM(T.Gemma2Config(**_common(a), head_dim=16))

    def gemma3(a: str) -> nn.Module:  # sandwich norms, QK-norm
        return T.Gemma3ForCausalLM(T.Gemma3TextConfig(**_common(a), head_dim=16))

    def granite(a: str) -> nn.Module:  # the residual adds the branch times residual_multiplier
        return T.GraniteForCausalLM(T.GraniteConfig(**_common(a), residual_multiplier=0.37))

    def gpt2(a: str) -> nn.Module:
        cfg = T.GPT2Config(
            vocab_size=VOCAB,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=4,
            n_positions=64,
            attn_implementation=a,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return T.GPT2LMHeadModel(cfg)

    def falcon(a: str) -> nn.Module:  # multi-query attention, attention and MLP in parallel
        cfg = T.FalconConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            multi_query=True,
            parallel_attn=True,
            attn_implementation=a,
        )
        return T.FalconForCausalLM(cfg)

    def neox(a: str) -> nn.Module:  # parallel residual
        c = _common(a)
        c.pop("num_key_value_heads")
        return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**c, use_parallel_residual=True))

    # The experts run one by one ("eager"): the default grouped matmul has no float64 kernel.
    experts = dict(num_experts_per_tok=2, experts_implementation="eager")

    def mixtral(a: str) -> nn.Module:
        return T.MixtralForCausalLM(T.MixtralConfig(**_common(a), num_local_experts=4, **experts))

    def qwen2_moe(a: str) -> nn.Module:  # routed and shared experts
        cfg = T.Qwen2MoeConfig(
            **_common(a), num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, **experts
        )
        return T.Qwen2MoeForCausalLM(cfg)

    def olmoe(a: str) -> nn.Module:
        return T.OlmoeForCausalLM(T.OlmoeConfig(**_common(a), num_experts=4, **experts))

    def bert(a: str) -> nn.Module:  # post-LayerNorm: the residual adds inside attention.output / output
        cfg = T.BertConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=96,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation=a,
        )
        return T.BertForMaskedLM(cfg)

    def t5(a: str) -> nn.Module:  # encoder-decoder; the decoder's cross-attention is a second attention branch
        cfg = T.T5Config(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            d_kv=16,
            d_ff=96,
            num_layers=LAYERS,
            num_heads=4,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
            attn_implementation=a,
        )
        return T.T5ForConditionalGeneration(cfg)

    def vit(a: str) -> nn.Module:
        cfg = T.ViTConfig(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            intermediate_size=96,
            image_size=16,
            patch_size=4,
            num_labels=3,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation=a,
        )
        return T.ViTForImageClassification(cfg)

    def mamba(a: str) -> nn.Module:
        return T.MambaForCausalLM(
            T.MambaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, state_size=8)
        )

    def t5_blocks(m: nn.Module) -> list[nn.Module]:
        return [*m.encoder.block, *m.decoder.block]  # type: ignore[union-attr]

    def router(block: nn.Module) -> nn.Module:
        return block.mlp.gate  # type: ignore[union-attr, return-value]

    llama_like = dict(blocks=_layers, attention=_child("self_attn"), mlp=_child("mlp"))
    moe = dict(**llama_like, router=router, top_k=2)
    no_attention = ATTENTION_KEYS
    return {
        "llama": Family("dense", llama, **llama_like),  # type: ignore[arg-type]
        "qwen2": Family("dense", qwen2, **llama_like),  # type: ignore[arg-type]
        "gemma2": Family(
            "dense",
            gemma2,
            _layers,
            _child("post_feedforward_layernorm"),
            _child("post_attention_layernorm"),
            attn="eager",
            notes=frozenset({"attention_z_softcapped"}),
        ),
        "gemma3": Family(
            "dense", gemma3, _layers, _child("post_feedforward_layernorm"), _child("post_attention_layernorm")
        ),
        "granite": Family("dense", granite, _layers, _child("mlp", 0.37), _child("self_attn", 0.37)),
        "gpt2": Family("dense", gpt2, lambda m: list(m.transformer.h), _child("mlp"), _child("attn")),
        "falcon": Family(
            "dense",
            falcon,
            lambda m: list(m.transformer.h),
            _child("mlp"),
            _child("self_attention"),
            notes=frozenset({"attention_z:recomputed"}),
        ),
        "gpt_neox": Family("dense", neox, lambda m: list(m.gpt_neox.layers), _child("mlp"), _child("attention")),
        "mixtral": Family("moe", mixtral, **moe),  # type: ignore[arg-type]
        "qwen2_moe": Family("moe", qwen2_moe, **moe),  # type: ignore[arg-type]
        "olmoe": Family("moe", olmoe, **moe),  # type: ignore[arg-type]
        "bert": Family(
            "encoder",
            bert,
            lambda m: list(m.bert.encoder.layer),
            _child("output.dense"),
            _child("attention.output.dense"),
        ),
        "t5": Family(
            "encoder-decoder",
            t5,
            t5_blocks,
            lambda b: (b.layer[-1].DenseReluDense, 1.0),
            _child("layer.0.SelfAttention"),
            unavailable=frozenset({"cross_attention"}),
            notes=frozenset({"attention_z:recomputed"}),
        ),
        "vit": Family("vision", vit, lambda m: list(m.vit.layers), _child("mlp"), _child("attention"), inputs=_images),
        "mamba": Family(
            "no-attention", mamba, lambda m: list(m.backbone.layers), _child("mixer"), unavailable=no_attention
        ),
        "residual_mlp": Family(
            "no-attention",
            lambda a: ResidualMLP(),
            lambda m: list(m.layers),
            _child("ff"),
            unavailable=no_attention,
            inputs=_vectors,
        ),
    }
