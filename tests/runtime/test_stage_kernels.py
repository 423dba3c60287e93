"""Kernel paths per process: the first stage started in a process times them, a later stage
in the same process (rank 0 of another Engine) reuses that choice, a pin in the environment
always wins."""

import pytest
import torch

from wavepp.models import load_model_config, load_stage_model
from wavepp.models.kernels import AttentionChoice, KernelChoice
from wavepp.models.kernels import choice as choice_mod
from wavepp.random_checkpoint import make_model


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """Unpinned kernels, an empty process choice, and counting stand-ins for the timings."""
    monkeypatch.delenv("WAVEPP_LINEAR_KERNEL", raising=False)
    monkeypatch.delenv("WAVEPP_ATTENTION_KERNEL", raising=False)
    monkeypatch.setattr(choice_mod, "_process_choices", {})
    calls = {"linear": 0, "attention": 0}
    picks = {"linear": "matmul", "attention": "cascade"}

    def fake_linear(shapes, dtype, *, device="cpu", **kw):
        calls["linear"] += 1
        return KernelChoice(picks["linear"], {picks["linear"]: 1.0}, 0.1)

    def fake_attention(kv_heads, group, head_dim, dtype, *, device="cpu", **kw):
        calls["attention"] += 1
        return AttentionChoice(
            picks["attention"], {picks["attention"]: 1e-3}, {picks["attention"]: 1.0}
        )

    monkeypatch.setattr(choice_mod, "choose_linear", fake_linear)
    monkeypatch.setattr(choice_mod, "choose_attention", fake_attention)
    path = make_model(tmp_path / "m", num_layers=2, hidden_size=64, vocab_size=256)
    return calls, picks, load_model_config(path), load_stage_model(path, dtype=torch.float32)


def test_a_later_stage_in_the_process_reuses_the_first_ones_choice(timed):
    calls, picks, config, model = timed
    cpu = torch.device("cpu")
    first = choice_mod.choose_kernels(model, config, torch.float32, cpu)
    assert (first.linear.name, first.attention.name) == ("matmul", "cascade") and calls == {
        "linear": 1,
        "attention": 1,
    }
    picks.update(linear="packed", attention="sdpa")  # a second timing would choose these
    later = choice_mod.choose_kernels(model, config, torch.float32, cpu)
    assert (later.linear.name, later.attention.name) == ("matmul", "cascade") and calls == {
        "linear": 1,
        "attention": 1,
    }
    assert later.linear.gflops == {} and later.attention.seconds == {}  # reused, not timed
    # the paths the stage's forwards run
    assert (
        (later.kernels.linear, later.kernels.attention)
        == ("matmul", "cascade")
        == (first.kernels.linear, first.kernels.attention)
    )
    # another dtype is another choice
    other = choice_mod.choose_kernels(model, config, torch.bfloat16, cpu)
    assert (other.linear.name, other.attention.name) == ("packed", "sdpa") and calls == {
        "linear": 2,
        "attention": 2,
    }


def test_a_pinned_path_always_goes_through_the_chooser(timed, monkeypatch):
    calls, picks, config, model = timed
    cpu = torch.device("cpu")
    choice_mod.choose_kernels(model, config, torch.float32, cpu)
    monkeypatch.setenv("WAVEPP_LINEAR_KERNEL", "linear")
    choice_mod.choose_kernels(model, config, torch.float32, cpu)
    assert calls == {"linear": 2, "attention": 1}
