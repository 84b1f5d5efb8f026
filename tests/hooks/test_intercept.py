"""Intercepted SDPA answered by the attention kernel SDPA itself runs, with its log-sum-exp.

Every test runs on CPU and, where a GPU is present, again on CUDA (the same assertions: the
CUDA branch is shaped like the CPU one), so a GPU run checks flash, memory-efficient and cuDNN.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hyperwatch import hooks
from hyperwatch.hooks.intercept import KernelUnavailable, sdpa_with_lse
from hyperwatch.hooks.probes import RECOMPUTED_KEY
from tests.hooks.test_indicators import explicit_lse

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _case(device: str, dtype: torch.dtype, hq: int = 4, hk: int = 2, L: int = 24, D: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(hq * 100 + L + D)
    shapes = [(2, hq, L, D), (2, hk, L, D), (2, hk, L, D)]
    return [(torch.randn(s, generator=g) * 2).to(device, dtype) for s in shapes]


def _compare_with_sdpa(qkv: list[torch.Tensor], exact: bool, **kwargs: Any) -> torch.Tensor:
    """Output and gradients of the kernel path against plain SDPA; returns the kernel's LSE."""
    leaves = [t.clone().requires_grad_() for t in qkv]
    want = F.scaled_dot_product_attention(*leaves, **kwargs)
    want.float().square().sum().backward()
    want_grads = [t.grad for t in leaves]
    leaves = [t.clone().requires_grad_() for t in qkv]
    out, lse = sdpa_with_lse({"query": leaves[0], "key": leaves[1], "value": leaves[2], **kwargs})
    out.float().square().sum().backward()
    got_grads = [t.grad for t in leaves]
    assert out.dtype == want.dtype and out.shape == want.shape
    assert all(g is not None for g in got_grads + want_grads)
    if exact:  # the very kernel SDPA runs: bit for bit
        assert torch.equal(out, want)
        assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))  # type: ignore[arg-type]
    else:
        torch.testing.assert_close(out, want)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b)
    assert lse.dtype == torch.float32 and not lse.requires_grad
    return lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_lse_causal_gqa_scale_equals_fp32_reference(device: str, dtype: torch.dtype) -> None:
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.float16  # fp32 on CUDA goes to the math backend: the fallback test covers it
    q, k, v = _case(device, dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for kwargs in (
        {"is_causal": True, "enable_gqa": True},
        {"is_causal": True, "enable_gqa": True, "scale": 0.37},
        {"is_causal": False, "enable_gqa": True},
    ):
        lse = _compare_with_sdpa([q, k, v], exact=True, **kwargs)
        ref = explicit_lse(q.cpu().double(), k.cpu().double(), is_causal=bool(kwargs["is_causal"]),
                           scale=kwargs.get("scale"), enable_gqa=True)  # fmt: skip
        assert lse.shape == q.shape[:-1]
        torch.testing.assert_close(lse.cpu().double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_lse_with_masks_marks_fully_masked_rows(device: str) -> None:
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = _case(device, dtype, hq=2, hk=2, L=20)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 1, 20, 20, generator=g) > 0.4
    mask[..., 0] = True
    mask[1, 0, 7] = False  # a fully masked query row: no softmax, LSE -inf
    mask = mask.to(device)
    additive = torch.zeros(mask.shape, device=device).masked_fill_(~mask, -math.inf).to(dtype)
    for m in (mask, additive):
        try:
            lse = _compare_with_sdpa([q, k, v], exact=True, attn_mask=m, scale=0.3)
        except KernelUnavailable:
            assert device == "cuda"  # this GPU's fused kernels refuse masks: the fallback covers it
            continue
        ref = explicit_lse(q.cpu().double(), k.cpu().double(), mask.cpu(), scale=0.3)
        torch.testing.assert_close(lse.cpu().double(), ref, rtol=2e-3, atol=2e-3)
        assert torch.isneginf(lse[1, :, 7]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_path_under_autocast_matches_sdpa_under_autocast(device: str) -> None:
    """Autocast casts SDPA's arguments to bf16 before dispatch; the kernel path makes the same casts."""
    q, k, v = _case(device, torch.float32)
    with torch.autocast(device, dtype=torch.bfloat16):
        lse = _compare_with_sdpa([q, k, v], exact=True, is_causal=True, enable_gqa=True)
    ref = explicit_lse(q.bfloat16().cpu().double(), k.bfloat16().cpu().double(), is_causal=True, enable_gqa=True)
    torch.testing.assert_close(lse.cpu().double(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA backends need a GPU")
@pytest.mark.parametrize(
    "backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
)
@pytest.mark.parametrize("head_dim", [64, 20])  # 20: flash pads the head dim to a multiple of 8
def test_each_cuda_backend_returns_its_lse(backend: SDPBackend, head_dim: int) -> None:
    q, k, v = _case("cuda", torch.bfloat16, hq=4, hk=4, L=77, D=head_dim)
    with sdpa_kernel(backend):
        try:
            lse = _compare_with_sdpa([q, k, v], exact=True, is_causal=True)
        except (KernelUnavailable, RuntimeError) as exc:
            pytest.skip(f"{backend} cannot run this shape on this GPU: {exc}")
    ref = explicit_lse(q.cpu().double(), k.cpu().double(), is_causal=True)
    torch.testing.assert_close(lse.cpu().double(), ref, rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_no_lse_kernel_means_kernel_unavailable(device: str) -> None:
    q, k, v = _case(device, torch.float32)
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(KernelUnavailable, match="math backend"):
        sdpa_with_lse({"query": q, "key": k, "value": v, "is_causal": True, "enable_gqa": True})
    if device == "cpu":  # dropout on CPU: SDPA itself runs the math backend
        with pytest.raises(KernelUnavailable, match="math"):
            sdpa_with_lse({"query": q, "key": q, "value": q, "dropout_p": 0.5})


class _SdpaAttention(torch.nn.Module):
    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _SdpaAttention()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


def _z(model: torch.nn.Module, x: torch.Tensor, backend: SDPBackend | None) -> tuple[list[float], dict[str, str]]:
    """Attention Z per layer, and the monitor's notes (the costly path is a note: the value is there)."""
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="t", sink=sink, every=1, attention="*.attn", mlp="*.mlp")
    if backend is None:
        model(x).square().sum().backward()
    else:
        with sdpa_kernel(backend):
            model(x).square().sum().backward()
    mon.step(0)
    assert mon.unavailable == {}
    notes = dict(mon.notes)
    mon.close()
    assert sink.runs[0].config["_hyperwatch"].get(RECOMPUTED_KEY) == notes.get(RECOMPUTED_KEY)  # with the run
    z = sorted((p.layer, p.value) for b in sink.batches for p in b.points if p.name == "attention_z")
    return [v for _, v in z], notes


@pytest.mark.parametrize("device", DEVICES)
def test_fallback_is_reported_once_and_measures_the_same_z(device: str, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = torch.nn.Sequential(_Block(), _Block()).to(device, dtype)
    x = torch.randn(2, 16, 32, device=device, dtype=dtype)
    fast, notes = _z(model, x, None)
    assert RECOMPUTED_KEY not in notes and len(fast) == 2
    with caplog.at_level(logging.WARNING, logger="hyperwatch.hooks.monitor"):
        slow, notes = _z(model, x, SDPBackend.MATH)
    assert "costly path" in notes[RECOMPUTED_KEY] and "math backend" in notes[RECOMPUTED_KEY]
    assert sum(RECOMPUTED_KEY in r.getMessage() for r in caplog.records) == 1  # two layers, one report
    assert slow == pytest.approx(fast, rel=1e-4 if dtype == torch.float32 else 2e-2)
