"""Preallocated per-layer buffers that collect a logged step's sums over micro-batches.

Probes add 0-d device tensors into ``sums`` (L, N_SLOTS) and expert counts into ``experts``
(L, E_max), each through a view made once at construction (an ``add_`` per value, no indexing
ops on the hot path); element counts that follow from tensor shapes alone are kept on the host
in ``host_counts`` (no device work, no synchronization), or, inside a ``torch.compile`` graph,
added in-graph into their device slots.

Every device value lives in one flat float64 buffer, ``flat``: the per-layer sums, the expert
counts, a region for the host counts, then the run-level slots (loss sum and count, output Z sum
and count, which are reduced, and the gradient norm, which is not), then the per-head maxima of the
attention LSE (``heads``, (L, MAX_HEADS), outside the summed region: a maximum does not add; the
monitor all-reduces them with MAX, see :mod:`hooks.heads`). :meth:`Accumulator.pack` writes the host counts
in and returns the region that is all-reduced once across data-parallel ranks (sums and counts
add); :meth:`Accumulator.take` copies the whole buffer to the host once (asynchronously into
pinned memory on CUDA) and zeroes it; :meth:`Accumulator.unpack` turns the host copy into
per-layer values. A logged step therefore costs a handful of ops, whatever the number of layers.

Inside a ``torch.compile`` graph a layer is addressed through :class:`Where`, whose positions
in ``flat`` are device tensors: the traced code reads no per-layer Python number, so dynamo
does not specialize a block's graph on its layer and every block of one class shares one
graph (blocks compiled one by one, as torchtitan does, compile once, not once per layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from hyperwatch.hooks import fused, heads, indicators

# Device slots (sums, and counts that depend on the data).
ATTN_Z, ATTN_Z_N, ROUTER_Z, ROUTER_Z_N, ATTN_SQ, ATTN_OUT, MLP_SQ, MLP_OUT, AUX = range(9)
N_SLOTS = 9
# Host slots (counts that follow from shapes; *_ROWS: LSE rows known to have a softmax).
ATTN_ELEMS, MLP_ELEMS, AUX_N, ATTN_Z_ROWS, ROUTER_Z_ROWS = range(5)
N_HOST = 5
# Run-level slots after the packed region: LOSS .. OUT_Z_N are all-reduced, GRAD_NORM (last) is not.
LOSS, LOSS_N, OUT_Z, OUT_Z_N, GRAD_NORM = range(5)
N_RUN = 5


def _index(layer: int | Where) -> int:
    return layer.layer if isinstance(layer, Where) else layer


def _slices(row: torch.Tensor) -> list[torch.Tensor]:
    """One-element slice views of a 1-D tensor, one per element."""
    return [row[i : i + 1] for i in range(row.shape[0])]


class Where:
    """One layer's positions in :attr:`Accumulator.flat`, as device tensors (made once per layer).

    Probes hold one and hand it to the accumulator. In eager mode the accumulator uses ``layer``
    (its per-layer views); under ``torch.compile`` it adds through the index tensors, which are
    graph inputs, never guarded constants (see the module docstring)."""

    def __init__(self, acc: Accumulator, layer: int) -> None:
        self.layer = layer
        self.n_experts = acc.n_experts[layer]
        n_sums, n_exp, width = acc.sums.numel(), acc.experts.numel(), acc.experts.shape[1]

        def span(start: int, n: int) -> torch.Tensor:
            return torch.arange(start, start + n, dtype=torch.int64, device=acc.device)

        self.sums = span(layer * N_SLOTS, N_SLOTS)
        self.experts = span(n_sums + layer * width, width)
        self.counts = span(n_sums + n_exp + layer * N_HOST, N_HOST)
        self.heads = span(acc.heads_at + layer * heads.MAX_HEADS, heads.MAX_HEADS)


@dataclass
class LayerValues:
    """One layer's indicators of one logged step; None where the layer has no such measurement."""

    attention_z: float | None = None
    router_z: float | None = None
    attention_rms: float | None = None
    mlp_rms: float | None = None
    attention_outlier_ratio: float | None = None
    mlp_outlier_ratio: float | None = None
    max_vio: float | None = None
    aux_loss: float | None = None
    attention_lse_max: float | None = None
    expert_counts: list[float] = field(default_factory=list)
    head_lse_max: list[float | None] = field(default_factory=list)  # per head (None: that head had no row)

    def items(self) -> list[tuple[str, float]]:
        out = []
        for name in (
            "attention_z",
            "router_z",
            "attention_rms",
            "mlp_rms",
            "attention_outlier_ratio",
            "mlp_outlier_ratio",
            "max_vio",
            "aux_loss",
            "attention_lse_max",
        ):
            value = getattr(self, name)
            if value is not None:
                out.append((name, value))
        out += [(heads.head_name(h), v) for h, v in enumerate(self.head_lse_max) if v is not None]
        return out


class Accumulator:
    """Sums of one logged step for ``n_layers`` layers, ``n_experts[l]`` routed experts each."""

    def __init__(self, n_layers: int, n_experts: list[int], device: torch.device) -> None:
        if n_layers < 0:
            raise ValueError(f"Accumulator: n_layers must be >= 0, got {n_layers}")
        if len(n_experts) != n_layers:
            raise ValueError(f"Accumulator: n_experts has {len(n_experts)} entries; expected {n_layers}")
        self.n_layers = n_layers
        self.n_experts = list(n_experts)
        self.device = device
        n_sums, n_exp = n_layers * N_SLOTS, n_layers * max([1, *n_experts])
        self.packed_size = n_sums + n_exp + n_layers * N_HOST
        self.heads_at = self.packed_size + N_RUN
        self.flat = torch.zeros(self.heads_at + n_layers * heads.MAX_HEADS, dtype=torch.float64, device=device)
        self.heads = self.flat[self.heads_at :].view(n_layers, heads.MAX_HEADS)
        self.heads.fill_(-math.inf)  # "no row seen": a maximum starts below every LSE
        self.sums = self.flat[:n_sums].view(n_layers, N_SLOTS)
        self.experts = self.flat[n_sums : n_sums + n_exp].view(n_layers, max([1, *n_experts]))
        self._host = self.flat[n_sums + n_exp : self.packed_size]
        # Views are one-element slices, never 0-d views (unbind/select): under torch.compile, AOT
        # autograd drops in-place adds into 0-d views of a lifted tensor (torch 2.13), slices keep them.
        self.run = _slices(self.flat[self.packed_size :])  # run[LOSS], run[LOSS_N], run[GRAD_NORM]
        self.host_counts = np.zeros((n_layers, N_HOST), dtype=np.int64)
        self._slot = [_slices(row) for row in self.sums]  # _slot[layer][SLOT]: (1,) views
        # (attention, mlp) views of the adjacent (sum of squares, outliers) slots of each layer
        self._pair = [(row[ATTN_SQ : ATTN_OUT + 1], row[MLP_SQ : MLP_OUT + 1]) for row in self.sums]
        self._experts = [self.experts[i, :n] for i, n in enumerate(self.n_experts)]
        # What the residual receives is scale * (the hooked output), e.g. Granite's residual_multiplier:
        # RMS scales by |scale|, outlier ratios do not change. (layer, 0 attention / 1 mlp)
        self.branch_scale = np.ones((n_layers, 2))
        self.where = [Where(self, layer) for layer in range(n_layers)]

    def _where(self, layer: int | Where) -> Where:
        return layer if isinstance(layer, Where) else self.where[layer]

    def _add(self, layer: int | Where, slot: int, value: torch.Tensor, n: int = 1) -> None:
        """Add ``value`` ((n,) or broadcastable) into slots ``slot .. slot+n-1`` of the layer's row."""
        if torch.compiler.is_compiling():
            idx = self._where(layer).sums[slot : slot + n]
            self.flat.index_add_(0, idx, value.reshape(-1).to(self.flat.dtype).expand(n))
        elif n == 1:
            self._slot[_index(layer)][slot].add_(value.reshape(-1))
        else:
            self.sums[_index(layer), slot : slot + n].add_(value.reshape(-1))

    def _count(self, layer: int | Where, slot: int, n: int) -> None:
        """Add a shape-derived count: on the host in eager mode (no device op at all); inside a
        ``torch.compile`` graph into the device copy of the same slot (a constant add fused into
        the graph: host state cannot be mutated from compiled code). :meth:`pack` sums the two."""
        if torch.compiler.is_compiling():
            idx = self._where(layer).counts[slot : slot + 1]
            self.flat.index_add_(0, idx, torch.full((1,), n, dtype=self.flat.dtype, device=self.flat.device))
        else:
            self.host_counts[_index(layer), slot] += n

    # -- what probes call (on the training thread, inside forward, armed steps only) --
    def add_attention_lse(self, layer: int | Where, lse: torch.Tensor, every_row_attends: bool = False) -> None:
        """``every_row_attends``: the LSE comes from causal attention without a mask, so no row can
        be fully masked; its row count then follows from the shape (one reduction, no validity pass)."""
        if every_row_attends:
            self._add(layer, ATTN_Z, indicators.lse_square_sum(lse))
            self._count(layer, ATTN_Z_ROWS, lse.numel())
            self.add_head_lse_max(layer, lse)
            return
        total, n = indicators.z_sums(lse)
        self._add(layer, ATTN_Z, total)
        self._add(layer, ATTN_Z_N, n)
        self.add_head_lse_max(layer, lse)

    def add_head_lse_max(self, layer: int | Where, lse: torch.Tensor) -> None:
        """Raise the layer's per-head maxima to this LSE's (``lse``: (..., heads, queries))."""
        per_head = heads.head_lse_max(lse)
        if torch.compiler.is_compiling():  # gather, maximum, scatter back: the layer is a tensor index here
            idx = self._where(layer).heads[: per_head.shape[0]]
            self.flat.index_copy_(0, idx, torch.maximum(self.flat.index_select(0, idx), per_head.to(self.flat.dtype)))
        else:  # one op: elementwise, so writing into an input is safe; NaN propagates as in torch.maximum
            view = self.heads[_index(layer), : per_head.shape[0]]
            torch.maximum(view, per_head, out=view)

    def add_output_logits(self, logits: torch.Tensor) -> None:
        """Output Z: sum of LSE^2 over the vocabulary of every position, and the positions' count
        (shape-derived; added on the device, a constant add: no synchronization). On CUDA the
        Triton kernel reads the logits once, with no fp32 copy of them."""
        if torch.compiler.is_compiling():  # slices made in the graph: every write goes to the one lifted ``flat``
            total, n = heads.output_z_sums(logits)
            at = self.packed_size
            self.flat[at + OUT_Z : at + OUT_Z + 1].add_(total)
            self.flat[at + OUT_Z_N : at + OUT_Z_N + 1].add_(n)
            return
        if fused.applies(logits):
            fused.add_lse_square_sum_(self.run[OUT_Z], logits)
            n = logits.numel() // max(1, logits.shape[-1])
        else:
            total, n = heads.output_z_sums(logits)
            self.run[OUT_Z].add_(total)
        self.run[OUT_Z_N].add_(n)

    def add_router_logits(self, layer: int | Where, logits: torch.Tensor) -> None:
        """Router Z: every token has a softmax over all its logits, so the row count is the shape's
        (a token whose logits are all -inf has LSE^2 = +inf: a diverged router, reported as such)."""
        lse = indicators.router_lse(logits)
        self._add(layer, ROUTER_Z, lse.square().sum())
        self._count(layer, ROUTER_Z_ROWS, lse.numel())

    def add_branch(self, layer: int | Where, branch: str, output: torch.Tensor) -> None:
        """Sum of squares and outlier count of a branch output, added into two adjacent slots: by
        the fused kernel (one read of ``output``) where it applies, else by the torch formula."""
        attention = branch == "attention"
        slot = ATTN_SQ if attention else MLP_SQ
        if torch.compiler.is_compiling():
            self._add(layer, slot, indicators.branch_sums(output.detach()), n=2)
        else:
            pair = self._pair[_index(layer)][0 if attention else 1]
            if fused.applies(output):
                fused.add_branch_sums_(pair, output)
            else:
                indicators.add_branch_sums_(pair, output)
        self._count(layer, ATTN_ELEMS if attention else MLP_ELEMS, output.numel())

    def add_branch_totals(self, layer: int | Where, branch: str, sums: torch.Tensor, elements: int) -> None:
        """Sums already taken (sum of squares, outliers: :func:`hooks.indicators.branch_sums`) of
        ``elements`` branch-output elements, e.g. by the discovery trace."""
        attention = branch == "attention"
        self._add(layer, ATTN_SQ if attention else MLP_SQ, sums, n=2)
        self._count(layer, ATTN_ELEMS if attention else MLP_ELEMS, elements)

    def add_attention_z_totals(self, layer: int | Where, z: torch.Tensor) -> None:
        """(sum of LSE^2, rows with a softmax) already taken (:func:`hooks.indicators.z_sums`)."""
        self._add(layer, ATTN_Z, z[0:1])
        self._add(layer, ATTN_Z_N, z[1:2])

    def add_expert_counts(self, layer: int | Where, counts: torch.Tensor) -> None:
        where = self._where(layer)
        n = where.n_experts
        counts = counts if counts.numel() == n else counts[:n]
        if torch.compiler.is_compiling():
            self.flat.index_add_(0, where.experts[:n], counts.to(self.flat.dtype))
        else:
            self._experts[where.layer].add_(counts)

    def add_aux_loss(self, layer: int | Where, aux: torch.Tensor) -> None:
        self._add(layer, AUX, aux.detach())
        self._count(layer, AUX_N, 1)

    # -- once per logged step --
    def record_loss(self, loss: float | torch.Tensor) -> None:
        """This rank's loss of the step (averaged over ranks through the reduced count)."""
        if isinstance(loss, torch.Tensor):
            self.run[LOSS].copy_(loss.detach().reshape(1))
        else:
            self.run[LOSS].fill_(float(loss))
        self.run[LOSS_N].fill_(1.0)

    def record_grad_norm(self, grad_norm: float | torch.Tensor) -> None:
        if isinstance(grad_norm, torch.Tensor):
            self.run[GRAD_NORM].copy_(grad_norm.detach().reshape(1))
        else:
            self.run[GRAD_NORM].fill_(float(grad_norm))

    def pack(self) -> torch.Tensor:
        """The per-layer values and the loss, in one flat float64 device tensor (a view of ``flat``):
        the all-reduce unit. :meth:`unpack` reads its first :attr:`packed_size` values."""
        # The counts are host integers: one non-blocking copy to the device (from pageable memory
        # CUDA stages the source at once, so no stream synchronization and no later host read).
        counts = torch.from_numpy(self.host_counts.reshape(-1).astype(np.float64))
        self._host.add_(counts.to(self._host.device, non_blocking=True))
        return self.flat[: self.packed_size + GRAD_NORM]

    def take(self, extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Host copy of ``flat`` (after :meth:`pack`), followed by ``extra``; then reset.

        On CUDA the copy goes asynchronously into pinned memory: wait for the returned event
        before reading it (the emitter thread does). Elsewhere the event is None.
        """
        src = self.flat if extra is None else torch.cat([self.flat, extra.to(self.flat.dtype)])
        event = None
        if src.is_cuda:
            host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            host.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            host = src.clone() if extra is None else src  # torch.cat made a copy already
        self.reset()
        return host, event

    def reset(self) -> None:
        self.flat.zero_()
        self.heads.fill_(-math.inf)
        self.host_counts[:] = 0

    def output_z(self, flat: np.ndarray) -> float | None:
        """Output Z of the step from the host copy of ``flat`` (None: no LM head was measured)."""
        n = float(flat[self.packed_size + OUT_Z_N])
        return float(flat[self.packed_size + OUT_Z]) / n if n > 0 else None

    def unpack(self, flat: np.ndarray) -> list[LayerValues]:
        """Per-layer indicators from the (reduced) host copy of :meth:`pack` (the whole of ``flat``:
        the per-head maxima follow the run slots)."""
        L = self.n_layers
        n_sums, n_exp = self.sums.numel(), self.experts.numel()
        sums = flat[:n_sums].reshape(L, N_SLOTS)
        experts = flat[n_sums : n_sums + n_exp].reshape(L, self.experts.shape[1])
        host = flat[n_sums + n_exp : n_sums + n_exp + L * N_HOST].reshape(L, N_HOST)
        out = []
        for layer in range(L):
            s, h = sums[layer], host[layer]
            v = LayerValues()
            z_rows = s[ATTN_Z_N] + h[ATTN_Z_ROWS]
            if z_rows > 0:
                v.attention_z = float(s[ATTN_Z] / z_rows)
            router_rows = s[ROUTER_Z_N] + h[ROUTER_Z_ROWS]
            if router_rows > 0:
                v.router_z = float(s[ROUTER_Z] / router_rows)
            scale = self.branch_scale[layer]
            if h[ATTN_ELEMS] > 0:
                v.attention_rms = (
                    math.sqrt(s[ATTN_SQ] / h[ATTN_ELEMS]) * float(abs(scale[0])) if s[ATTN_SQ] >= 0 else math.nan
                )
                v.attention_outlier_ratio = float(s[ATTN_OUT] / h[ATTN_ELEMS])
            if h[MLP_ELEMS] > 0:
                v.mlp_rms = math.sqrt(s[MLP_SQ] / h[MLP_ELEMS]) * float(abs(scale[1])) if s[MLP_SQ] >= 0 else math.nan
                v.mlp_outlier_ratio = float(s[MLP_OUT] / h[MLP_ELEMS])
            if h[AUX_N] > 0:
                v.aux_loss = float(s[AUX] / h[AUX_N])
            n = self.n_experts[layer]
            if n > 0:
                counts = [float(c) for c in experts[layer, :n]]
                if sum(counts) > 0:
                    v.expert_counts = counts
                    v.max_vio = indicators.max_vio(counts)
            if flat.shape[0] > self.heads_at:
                v.head_lse_max, v.attention_lse_max = heads.unpack_heads(flat, self.heads_at, layer)
            out.append(v)
        return out
