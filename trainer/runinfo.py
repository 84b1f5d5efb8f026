"""What every run records about itself: a name, the package version, git SHA and environment."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hyperwatch.trainer.config import Config
    from hyperwatch.trainer.sizes import ModelSize


def git_sha() -> str | None:
    """The checkout's commit when the package runs from one, else None."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(device: torch.device) -> dict[str, Any]:
    from hyperwatch import __version__

    env: dict[str, Any] = {
        "hyperwatch": __version__,
        "git_sha": git_sha(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def run_name(cfg: Config, size: ModelSize) -> str:
    """A readable, unique-per-configuration run name: arm, depth, LR, tokens."""
    m = cfg.model
    moe = f"-s{m.moe_sparsity}k{m.moe_granularity}" if m.moe else ""
    return f"{cfg.optim.arm}-d{m.depth}{moe}-lr{cfg.optim.lr:g}-t{size.tokens:.3g}".replace("+", "")
