"""Typed configuration of the bundled HyperP trainer.

Every section is a dataclass validated in ``__post_init__``: a wrong type, an unknown option or
an out-of-range value fails at once with a :class:`ConfigError` naming the field and the fix.
A run is configured by a TOML file (sections ``[model]``, ``[optim]``, ``[data]``, ``[train]``,
``[log]``) plus command-line overrides ``--section.key value`` (or ``--key value`` when the key
is unique across sections). The resolved config is logged with every run.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hyperwatch.trainer.data.config import DataConfig
from hyperwatch.trainer.optim.schedule import head_multiplier, residual_multiplier


class ConfigError(ValueError):
    """A configuration value that is unknown, ill-typed or out of range."""


Parameterization = Literal["hyperp", "mup++", "mup", "vanilla"]
Arm = Literal["muon", "muonh", "hyperp", "hyperp_moe"]
AttentionKernel = Literal["auto", "flash_lse", "sdpa"]
ExpertKernel = Literal["auto", "loop", "grouped"]

ARMS: dict[str, tuple[Parameterization, bool]] = {
    # arm -> (parameterization, moe); the optimizer choice per arm lives in trainer/optim/build.py
    "muon": ("mup++", False),  # Muon + muP++ with weight decay proportional to 1/w
    "muonh": ("vanilla", False),  # vanilla MuonH, no HyperP multipliers
    "hyperp": ("hyperp", False),  # MuonH + HyperP
    "hyperp_moe": ("hyperp", True),  # MuonH + HyperP, Transformer-Next-MoE
}


def _check_types(obj: Any) -> None:
    """Check every field against its annotation (int, float, bool, str, Literal, optional)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        expected = hints[f.name]
        if not _matches(value, expected):
            raise ConfigError(
                f"{type(obj).__name__}.{f.name}: expected {_describe(expected)}, got {value!r} ({type(value).__name__})"
            )


def _matches(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin is Literal:
        return value in typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(expected))
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def _describe(expected: Any) -> str:
    origin = typing.get_origin(expected)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(expected))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(expected))
    return getattr(expected, "__name__", str(expected))


def _require(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{where}: {message}")


@dataclass
class ModelConfig:
    """Transformer-Next (spec section 3). Width = alpha * depth; 2*depth query heads."""

    depth: int = 8  # number of blocks d
    alpha: int = 128  # width per unit of depth: w = alpha * d
    head_dim: int = 128
    n_kv_heads: int = 4  # GQA key/value heads
    vocab_size: int = 32000  # 0 = take it from the data's tokenizer
    seq_len: int = 4096  # context length
    qk_norm: bool = True  # RMSNorm on q and k per head
    gated_attention: bool = True  # head-wise sigmoid gate before the output projection
    parameterization: Parameterization = "hyperp"
    base_depth: int = 8  # d_0: multipliers are relative to this base model
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    attention_kernel: AttentionKernel = "auto"  # auto = the LSE kernel where it exists, else SDPA
    moe: bool = False
    moe_sparsity: int = 8  # S
    moe_granularity: int = 8  # k: kS-1 routed experts, Top-(k-1), intermediate 4w/k
    shared_expert: bool = True
    sqrt_gate: bool = True
    aux_loss_gamma: float = 0.1
    expert_kernel: ExpertKernel = "auto"  # auto = grouped GEMM on CUDA where it runs, else the per-expert loop

    def __post_init__(self) -> None:
        _check_types(self)
        w = "ModelConfig"
        for name in ("depth", "alpha", "head_dim", "n_kv_heads", "seq_len", "base_depth"):
            _require(getattr(self, name) >= 1, f"{w}.{name}", "must be >= 1")
        _require(self.vocab_size >= 0, f"{w}.vocab_size", "must be >= 1 (or 0 to use the tokenizer's)")
        _require(
            self.n_heads % self.n_kv_heads == 0,
            f"{w}.n_kv_heads",
            f"the {self.n_heads} query heads (2*depth) must be a multiple of n_kv_heads={self.n_kv_heads}; "
            f"pick an even depth or set n_kv_heads to a divisor of {self.n_heads}",
        )
        _require(self.head_dim % 2 == 0, f"{w}.head_dim", "must be even (RoPE rotates pairs)")
        _require(self.rope_theta > 0 and self.norm_eps > 0, w, "rope_theta and norm_eps must be > 0")
        if self.moe:
            _require(self.moe_sparsity >= 1, f"{w}.moe_sparsity", "must be >= 1")
            _require(
                self.moe_granularity >= (2 if self.shared_expert else 1),
                f"{w}.moe_granularity",
                "must be >= 2 with a shared expert (Top-(k-1) routed experts must be >= 1)",
            )
            _require(
                (4 * self.width) % self.moe_granularity == 0,
                f"{w}.moe_granularity",
                f"must divide the MLP size 4w = {4 * self.width}",
            )
            _require(self.aux_loss_gamma >= 0, f"{w}.aux_loss_gamma", "must be >= 0")

    # Derived sizes (spec section 3).
    @property
    def width(self) -> int:
        return self.alpha * self.depth

    @property
    def n_heads(self) -> int:
        return 2 * self.depth

    @property
    def mlp_hidden(self) -> int:
        return 4 * self.width

    @property
    def n_routed_experts(self) -> int:
        n = self.moe_granularity * self.moe_sparsity
        return n - 1 if self.shared_expert else n

    @property
    def moe_top_k(self) -> int:
        return self.moe_granularity - 1 if self.shared_expert else self.moe_granularity

    @property
    def expert_hidden(self) -> int:
        return self.mlp_hidden // self.moe_granularity

    @property
    def residual_multiplier(self) -> float:
        """Depth-muP branch multiplier: 1/sqrt(2d) under muP++ and HyperP, else 1."""
        return residual_multiplier(self.parameterization, self.depth)

    @property
    def head_multiplier(self) -> float:
        """LM-head weight multiplier: w_0/w under muP and muP++ (spec: 1/w, relative to the base), else 1."""
        return head_multiplier(self.parameterization, self.width, self.alpha * self.base_depth)


@dataclass
class OptimConfig:
    """Optimizer arm and its base hyper-parameters (tuned once at depth base_depth, base_tokens)."""

    arm: Arm = "hyperp"
    lr: float = 0.02  # eta_0: the base LR at (base_depth, base_tokens); transfer carries it
    weight_decay: float = 1e-3  # lambda_0 for the Muon arm (scaled by w_0/w); MuonH arms use none
    base_tokens: float = 10.4e9  # T_0 of the LR transfer law
    lr_exponent: float = 0.32  # eta ~ T^-0.32
    final_lr_fraction: float = 0.1  # linear decay to 10% of the peak, no warm-up
    grad_clip: float = 1.0
    momentum: float = 0.95
    beta1: float = 0.9
    beta2: float = 0.95

    def __post_init__(self) -> None:
        _check_types(self)
        _require(self.lr > 0, "OptimConfig.lr", "must be > 0")
        _require(self.weight_decay >= 0, "OptimConfig.weight_decay", "must be >= 0")
        _require(self.base_tokens > 0, "OptimConfig.base_tokens", "must be > 0")
        _require(0 <= self.final_lr_fraction <= 1, "OptimConfig.final_lr_fraction", "must be in [0, 1]")
        _require(self.grad_clip > 0, "OptimConfig.grad_clip", "must be > 0 (1.0 in the reference runs)")
        for name in ("momentum", "beta1", "beta2"):
            _require(0 <= getattr(self, name) < 1, f"OptimConfig.{name}", "must be in [0, 1)")


@dataclass
class TrainConfig:
    """Budget, batch and bookkeeping of one run."""

    tokens: int = 0  # training tokens; 0 = tpp * active params
    tpp: float = 50.0  # tokens per (active) parameter when tokens = 0
    batch_tokens: int = 2_097_152  # global batch in tokens (paper: 2M)
    micro_batch: int = 8  # sequences per micro-batch per rank (gradient accumulation fills the rest)
    eval_every: int = 100  # steps between validation losses (0 = only at the end)
    eval_batches: int = 8  # held-out micro-batches per validation
    checkpoint_every: int = 0  # steps between checkpoints (0 = only at the end)
    out_dir: str = "runs/default"
    resume: bool = False  # continue from out_dir/checkpoint.pt when it exists
    max_steps: int = 0  # stop early after this many steps (0 = the whole budget); the schedule keeps the budget
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto = bf16 autocast on CUDA, fp32 on CPU
    compile: bool = True  # torch.compile on CUDA (ignored on CPU); the warm-up time is logged
    parallel: Literal["ddp", "fsdp"] = "ddp"  # multi-rank: replicated (DDP) or sharded (FSDP2 fully_shard)
    progress: bool = True
    threads: int = 0  # PyTorch CPU threads of this process (0 = PyTorch's default, one per core)

    def __post_init__(self) -> None:
        _check_types(self)
        w = "TrainConfig"
        _require(self.tokens >= 0, f"{w}.tokens", "must be >= 0 (0 = use tpp)")
        _require(self.tpp > 0, f"{w}.tpp", "must be > 0")
        _require(self.batch_tokens >= 1, f"{w}.batch_tokens", "must be >= 1")
        _require(self.micro_batch >= 1, f"{w}.micro_batch", "must be >= 1")
        for name in ("eval_every", "checkpoint_every", "max_steps", "threads"):
            _require(getattr(self, name) >= 0, f"{w}.{name}", "must be >= 0")
        _require(self.eval_batches >= 1, f"{w}.eval_batches", "must be >= 1")
        _require(
            self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
            f"{w}.device",
            f"must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}",
        )


@dataclass
class LogConfig:
    """Where the run's indicators go (hooks): a service URL, a JSONL folder, or nowhere."""

    sink: str = ""  # "" = none; "http://host:port" = the service; otherwise a folder for JSONL
    every: int = 10  # log indicators every N steps
    run: str = ""  # run name; "" = derived from the config
    project: str = "default"
    group: str = ""  # the sweep this run belongs to
    tags: list[str] = field(default_factory=list)
    token: str = ""  # write token for the service

    def __post_init__(self) -> None:
        _check_types(self)
        _require(self.every >= 1, "LogConfig.every", "must be >= 1")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        parameterization, moe = ARMS[self.optim.arm]
        if self.model.parameterization != parameterization or self.model.moe != moe:
            # The arm is the one flag: it decides the parameterization and whether the MLP is an MoE.
            self.model = dataclasses.replace(self.model, parameterization=parameterization, moe=moe)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "log": LogConfig,
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # The paper's family: alpha 128, head_dim 128, vocab 32000, context 4096 (the defaults).
    "paper": {},
    # A member of the same family that trains on a CPU: byte vocabulary, short context.
    "tiny": {
        "model": {
            "alpha": 32,
            "head_dim": 16,
            "vocab_size": 0,
            "seq_len": 256,
            "base_depth": 2,
            "moe_sparsity": 4,
            "moe_granularity": 4,
        },
        "optim": {"base_tokens": 2_000_000.0},
        "train": {"batch_tokens": 8192, "micro_batch": 8, "tokens": 400_000, "eval_every": 20},
    },
}


def build_config(sections: dict[str, dict[str, Any]]) -> Config:
    """Build a Config from nested dicts, rejecting unknown sections and keys by name."""
    unknown = set(sections) - set(SECTIONS) - {"preset"}
    if unknown:
        raise ConfigError(f"unknown config sections {sorted(unknown)}; valid: {sorted(SECTIONS)}")
    merged: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    preset = sections.get("preset", "paper")
    if preset not in PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; valid: {sorted(PRESETS)}")
    for name, values in PRESETS[str(preset)].items():
        merged[name].update(values)
    for name, values in sections.items():
        if name == "preset":
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}]: must be a table of options")
        merged[name].update(values)
    kwargs: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        valid = {f.name for f in dataclasses.fields(cls)}
        bad = set(merged[name]) - valid
        if bad:
            raise ConfigError(f"[{name}]: unknown options {sorted(bad)}; valid: {sorted(valid)}")
        try:
            kwargs[name] = cls(**merged[name])
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    return Config(**kwargs)


def preset(name: str = "tiny", **model: Any) -> Config:
    """A named preset with model overrides, e.g. ``preset("tiny", depth=2)``."""
    return build_config({"preset": name, "model": model})  # type: ignore[dict-item]


def parse_scalar(text: str) -> Any:
    """A CLI value as TOML would read it (numbers, booleans, quoted strings, lists), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(sections: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--section.key value`` / ``--key value`` pairs (also ``--key=value``) to nested dicts."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in sections.items()}
    i = 0
    while i < len(overrides):
        token = overrides[i]
        if not token.startswith("--"):
            raise ConfigError(f"override {token!r}: expected --key value (e.g. --model.depth 4)")
        key, sep, value = token[2:].partition("=")
        if not sep:
            if i + 1 >= len(overrides):
                raise ConfigError(f"override --{key}: missing its value")
            value = overrides[i + 1]
            i += 1
        i += 1
        key = key.replace("-", "_")
        if key == "preset":
            out["preset"] = value
            continue
        section, _, option = key.rpartition(".")
        if not section:
            owners = [n for n, cls in SECTIONS.items() if option in {f.name for f in dataclasses.fields(cls)}]
            if len(owners) != 1:
                where = f"it is in {owners}; write --SECTION.{option}" if owners else "no section has it"
                raise ConfigError(f"override --{key}: {where}")
            section = owners[0]
        if section not in SECTIONS:
            raise ConfigError(f"override --{key}: unknown section {section!r}; valid: {sorted(SECTIONS)}")
        out.setdefault(section, {})[option] = parse_scalar(value)
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML config (optional) and apply command-line overrides."""
    sections: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config {p}: no such file")
        try:
            sections = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config {p}: not valid TOML ({exc})") from exc
    return build_config(apply_overrides(sections, overrides or []))
