"""The drafter-sync sets against the installed vLLM's classes: they apply, the probe says they are needed, names route."""

from __future__ import annotations

from typing import Any

import pytest

import patchreg
from patches.vllm import DRAFTER_SYNC, WORKER_CHANNEL, drafter_status
from patches.vllm.drafter import drafter_owns


@pytest.mark.parametrize(
    ("name", "owned"),
    [
        ("model.layers.1.eh_proj.weight", True),  # DeepSeek-V3 with one decoder layer: layer 1 is the MTP layer
        ("model.layers.1.mtp_block.mlp.down_proj.weight", True),
        ("model.layers.0.self_attn.q_proj.weight", False),
        ("model.embed_tokens.weight", False),
        ("lm_head.weight", False),
        ("mtp.layers.0.enorm.weight", True),  # Qwen3-Next
        ("model.mtp_layers.0.input_layernorm.weight", True),  # MiMo
        ("model.layers.10.mlp.gate_proj.weight", False),
    ],
)
def test_drafter_owns_the_mtp_layers_names(name: str, owned: bool) -> None:
    """A checkpoint name belongs to the drafter when its layer index is past the target's layers, or it is mtp*."""
    assert drafter_owns(name, num_hidden_layers=1 if "layers.1." in name or "layers.0." in name else 61) is owned


def test_every_patch_of_both_sets_applies_on_the_installed_vllm(vllm: Any) -> None:
    """On the installed vLLM every patch's predicate holds, the behavioural probe included (vLLM does not sync)."""
    for patch_set in (DRAFTER_SYNC, WORKER_CHANNEL):
        explanation = patchreg.registry.explain(patch_set)
        assert all(p.when.evaluate().ok for p in patch_set), explanation
    probe = next(p for p in DRAFTER_SYNC if p.name == "vllm.worker.reload-weights-syncs-drafter")
    assert "does not write the draft model" in probe.when.evaluate().reason


def test_the_sets_install_worker_methods_and_revert_exactly(vllm: Any) -> None:
    """Applying DRAFTER_SYNC adds the worker's methods by name and flips the switch; reverting removes them."""
    from vllm.v1.worker.gpu_worker import Worker

    from patches.vllm import drafter

    before = dict(vars(Worker))
    with patchreg.patched(DRAFTER_SYNC):
        assert callable(Worker.patchreg_drafter_status) and callable(Worker.patchreg_fingerprint)
        assert drafter.SYNC_DRAFTER is True
        assert set(drafter.active_sets()) == {DRAFTER_SYNC.name, WORKER_CHANNEL.name}
    assert dict(vars(Worker)) == before and drafter.SYNC_DRAFTER is False
    assert drafter.active_sets() == {}


def test_drafter_status_needs_an_engine() -> None:
    """drafter_status() of something without collective_rpc is a TypeError naming what it takes."""
    with pytest.raises(TypeError, match=r"vllm\.LLM or AsyncLLM"):
        drafter_status(object())


def test_the_load_weights_wraps_install_on_the_mtp_classes_and_revert(vllm: Any) -> None:
    """DRAFTER_SYNC wraps the MTP targets' and drafters' load_weights and the layerwise finalize; revert restores them."""
    from vllm.model_executor.model_loader.reload import layerwise
    from vllm.model_executor.models.mimo import MiMoForCausalLM
    from vllm.model_executor.models.mimo_mtp import MiMoMTP

    before = (MiMoForCausalLM.__dict__["load_weights"], MiMoMTP.__dict__["load_weights"], layerwise.__dict__)
    finalize = layerwise.finalize_layerwise_processing
    with patchreg.patched(DRAFTER_SYNC):
        assert MiMoForCausalLM.__dict__["load_weights"] is not before[0]
        assert MiMoMTP.__dict__["load_weights"] is not before[1]
        assert layerwise.finalize_layerwise_processing is not finalize
        names = {e.patch for e in patchreg.registry.active()}
        assert {"vllm.MiMoForCausalLM.load-weights-syncs-drafter", "vllm.MiMoMTP.load-weights-noted"} <= names
    assert (MiMoForCausalLM.__dict__["load_weights"], MiMoMTP.__dict__["load_weights"]) == before[:2]
    assert layerwise.finalize_layerwise_processing is finalize


def test_a_load_weights_outside_a_known_worker_passes_through(vllm: Any) -> None:
    """The target wrap leaves a model no worker loaded alone: it calls load_weights once with the caller's stream."""
    from patches.vllm.drafter_load import sync_target_load

    seen: list[Any] = []
    stream = iter([("a", 1)])

    def load_weights(weights: Any) -> set[str]:
        seen.append(weights)
        return {"a"}

    assert sync_target_load(load_weights, object(), (stream,), {}) == {"a"} and seen == [stream]
