"""The hooks describe the run: parameters from the model, budget, FLOPs, tokens learned from mon.step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks.describe import count_parameters
from tests.hooks.support import hf_model


def test_parameters_counted_once_and_flops_are_6n_times_the_budget() -> None:
    model = hf_model("llama")
    n = sum(p.numel() for p in model.parameters())  # model.parameters() already yields a tied tensor once
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="desc-1", sink=sink, every=1, tokens=1_000_000, total_steps=100)
    mon.close()
    fields = sink.runs[0].fields
    assert fields["total_params"] == n > 0
    assert fields["tokens"] == 1_000_000 and fields["total_steps"] == 100
    assert fields["flops"] == pytest.approx(6.0 * n * 1_000_000)


def test_tied_weights_are_one_tensor() -> None:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    assert count_parameters(model) == 40


def test_given_values_win_and_flops_per_token_scales_the_budget() -> None:
    sink = hooks.MemorySink()
    model = hf_model("llama")
    mon = hooks.attach(model, run="desc-2", sink=sink, every=1, tokens=2_000, flops_per_token=10.0, total_params=123)
    mon.close()
    fields = sink.runs[0].fields
    assert fields["total_params"] == 123 and fields["flops"] == 20_000.0


def test_the_budget_is_learned_from_mon_step_tokens_and_sent_once() -> None:
    sink = hooks.MemorySink()
    model = hf_model("llama")
    mon = hooks.attach(model, run="desc-3", sink=sink, every=5, total_steps=50, active_params=1_000)
    for step in range(20):
        mon.step(step, loss=1.0, tokens=(step + 1) * 64)
    mon.close()
    budgets = [u for u in sink.updates if "tokens" in u]
    assert len(budgets) == 1  # run metadata, not per batch
    assert budgets[0]["tokens"] == 50 * 64  # steps 0..49 of 64 tokens each
    assert budgets[0]["flops"] == pytest.approx(6.0 * 1_000 * 50 * 64)  # 6N with N = active_params


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"total_steps": 0}, "total_steps"),
        ({"tokens": -5}, "tokens"),
        ({"tokens": 1.5}, "tokens"),
        ({"flops_per_token": float("nan")}, "flops_per_token"),
        ({"flops_per_token": 0}, "flops_per_token"),
        ({"tokens": 10, "flops": 1.0, "flops_per_token": 2.0}, "flops and flops_per_token"),
        ({"resume": "yes"}, "resume"),
    ],
)
def test_bad_run_description_is_refused_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        hooks.attach(torch.nn.Linear(2, 2), run="bad", sink=hooks.MemorySink(), **kwargs)


def test_a_finished_run_without_budget_or_length_is_described_by_what_it_did() -> None:
    sink = hooks.MemorySink()
    model = hf_model("llama")
    mon = hooks.attach(model, run="desc-4", sink=sink, every=10, active_params=500)
    for step in range(25):
        mon.step(step, loss=1.0, tokens=(step + 1) * 32)
    mon.close()
    (done,) = [u for u in sink.updates if "total_steps" in u]
    assert done == {"total_steps": 21, "tokens": 21 * 32, "flops": 6.0 * 500 * 21 * 32}  # last logged step 20
    assert sink.statuses == ["finished"]


def test_a_failed_run_is_not_given_a_length() -> None:
    sink = hooks.MemorySink()
    mon = hooks.attach(hf_model("llama"), run="desc-5", sink=sink, every=1)
    mon.step(0, loss=1.0, tokens=32)
    mon.close("failed")
    assert not [u for u in sink.updates if "total_steps" in u or "tokens" in u]
