"""``verify_mtp`` on tiny real models: its checks hold on a correct block, catch a broken one, and leave the model
exactly as found (parameters, ``.grad``, RNG states, training mode, upstream's MTP tracker and loss scale)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

from patches.megatron import MTPPatchError, MTPVerification, _loss, _postprocess, mtp_patched, verify_mtp
from tests.megatron.conftest import build_gpt, make_batch
from tests.megatron.hybrid_models import build_hybrid, hybrid_skip_reason


def batch_kwargs(seed: int = 7) -> dict[str, Any]:
    """conftest's batch as the keyword arguments of the model's forward."""
    batch = make_batch(seed)
    return dict(zip(("input_ids", "position_ids", "attention_mask"), batch.args(), strict=True)) | batch.kwargs()


def build(family: str, tied: bool = False, depth: int = 2) -> Any:
    """A tiny real GPTModel or HybridModel with ``depth`` MTP depths (the hybrid skipped where absent)."""
    if family == "gpt":
        return build_gpt(tied=tied, mtp_num_layers=depth)
    if hybrid_skip_reason() is not None:
        pytest.skip(str(hybrid_skip_reason()))
    return build_hybrid(tied=tied, depth=depth)


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", ["gpt", "hybrid"])
def test_every_check_holds_on_a_correct_block(family: str, tied: bool, detach: bool) -> None:
    """On real tiny models the logits are bit-equal, the losses equal upstream's, the MTP layers all trained."""
    result = verify_mtp(build(family, tied), batch_kwargs(), detach_encoder=detach)
    assert isinstance(result, MTPVerification)
    assert result.ok, str(result)
    assert result.logits_max_diff == 0.0 and len(result.mtp_losses) == 2
    assert result.mtp_grads_vs_upstream <= 1e-6
    if detach:
        assert result.trunk_grad_max == 0.0
    else:
        assert result.trunk_grad_max > 0  # the MTP loss trains the trunk
    text = str(result)
    assert "[FAIL]" not in text and "bit-equal" in text and "model restored" in text


@pytest.mark.usefixtures("todays_route")  # the leak is made in today's postprocess patch
def test_a_gradient_leak_into_the_trunk_is_reported() -> None:
    """A block that forgets to detach the decoder states under detach_encoder=True fails the trunk check."""
    train = _postprocess._train
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_postprocess, "_train", lambda self, a, detach: train(self, a, False))
        result = verify_mtp(build("gpt"), batch_kwargs(), detach_encoder=True)
    assert not result.ok and not result.trunk_detached and result.trunk_grad_max > 0
    assert "[FAIL] trunk gradient from the MTP loss" in str(result)


@pytest.mark.usefixtures("todays_route")  # the loss is dropped in today's postprocess patch
def test_mtp_layers_without_gradient_are_named() -> None:
    """A block whose MTP loss never reaches the graph fails: every MTP parameter is named, the losses missing."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_loss, "attach_mtp_loss", lambda model, hidden, *args: hidden)
        mp.setattr(_postprocess, "attach_mtp_loss", lambda model, hidden, *args: hidden)
        result = verify_mtp(build("gpt"), batch_kwargs())
    assert not result.ok and not result.mtp_trained and not result.losses_equal
    assert len(result.mtp_without_grad) == result.mtp_params > 0
    assert all(name.startswith("mtp.") for name in result.mtp_without_grad)


def _snapshot(model: Any) -> dict[str, Any]:
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, MTPLossLoggingHelper

    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "grad values": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "modes": [m.training for m in model.modules()],
        "rng": torch.get_rng_state(),
        "tracker": dict(MTPLossLoggingHelper.tracker),
        "tracker values": {k: v.clone() for k, v in MTPLossLoggingHelper.tracker.items() if torch.is_tensor(v)},
        "scale": MTPLossAutoScaler.main_loss_backward_scale,
    }


def test_the_model_is_left_exactly_as_found() -> None:
    """Parameters, .grad (the same tensors, same values), training flags, RNG, MTP tracker and loss scale come back."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, MTPLossLoggingHelper

    model = build("gpt")
    model.eval()
    model.mtp.train()  # a mixed state, as a user might leave it
    for i, param in enumerate(model.parameters()):
        if i % 2:
            param.grad = torch.full_like(param, 0.5)
    MTPLossAutoScaler.set_loss_scale(torch.tensor(0.25))
    MTPLossLoggingHelper.tracker["loss_values"] = torch.tensor([1.5, 2.5])
    torch.manual_seed(11)
    before = _snapshot(model)
    result = verify_mtp(model, batch_kwargs(), detach_encoder=True)
    after = _snapshot(model)
    assert result.ok, str(result)
    assert all(torch.equal(before["params"][n], p) for n, p in after["params"].items())
    assert all(after["grads"][n] is g for n, g in before["grads"].items())
    assert all(torch.equal(before["grad values"][n], g) for n, g in after["grad values"].items())
    assert after["modes"] == before["modes"]
    assert torch.equal(after["rng"], before["rng"])
    assert after["tracker"].keys() == before["tracker"].keys()
    assert all(after["tracker"][k] is v for k, v in before["tracker"].items())
    assert all(torch.equal(after["tracker values"][k], v) for k, v in before["tracker values"].items())
    assert after["scale"] is before["scale"]
    MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))


def test_the_model_is_restored_when_the_step_raises() -> None:
    """A batch the model cannot run raises the model's own error, and the training flags and RNG come back."""
    model = build("gpt")
    model.eval()
    rng = torch.get_rng_state()
    bad = batch_kwargs() | {"position_ids": torch.zeros(3, 3, dtype=torch.long)}
    with pytest.raises(Exception) as caught:
        verify_mtp(model, bad)
    assert not isinstance(caught.value, MTPPatchError)
    assert not any(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_chunk_list_or_a_patched_model_is_refused() -> None:
    """verify_mtp checks one model, outside mtp_patched: a list of chunks or an active block is refused by name."""
    model = build("gpt")
    with pytest.raises(MTPPatchError, match="one model"):
        verify_mtp([model, build("gpt")], batch_kwargs())
    with mtp_patched(model), pytest.raises(MTPPatchError, match="outside mtp_patched"):
        verify_mtp(model, batch_kwargs())
    with pytest.raises(MTPPatchError, match="no MTP block"):
        verify_mtp(build_gpt(mtp=False), batch_kwargs())


@pytest.mark.no_distributed
def test_the_example_verifies_the_demo_model() -> None:
    """examples/verify_mtp.py passes every check on the demo's model, both detach modes, and exits 0."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, str(root / "examples" / "verify_mtp.py")],
        capture_output=True, text=True, cwd=root, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("[ok]   logits equal upstream's main head: bit-equal") == 2
    assert "[FAIL]" not in result.stdout
