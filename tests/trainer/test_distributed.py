"""Two CPU processes under torchrun (gloo): the ranks agree on losses, weights and the global aux loss."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_agree(tmp_path: Path, corpus_cache: Path) -> None:
    worker = Path(__file__).with_name("dist_worker.py")
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(worker), str(tmp_path), str(corpus_cache),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r0["accum"] == 2
    assert r0["first_tokens"] != r1["first_tokens"]  # each rank reads its own data
    assert r0["losses"] == r1["losses"] and len(r0["losses"]) == 4  # all-reduced training loss
    assert r0["val_losses"] == r1["val_losses"]
    assert r0["param_sum"] == r1["param_sum"]  # DDP kept the replicas identical
    # The aux loss is a global-batch quantity: equal on both ranks although their batches differ...
    assert r0["local_counts"] != r1["local_counts"]
    assert abs(r0["aux_loss"] - r1["aux_loss"]) < 1e-6
    # ...and its f_i come from the all-reduced counts.
    assert r0["global_counts"] == [a + b for a, b in zip(r0["local_counts"], r1["local_counts"])]
