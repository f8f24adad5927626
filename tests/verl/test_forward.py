"""verl's own per-micro-batch forward under verl's MTP patches and under ``patches.verl``, side by side."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from tests.megatron.conftest import VOCAB, record_measurement
from tests.verl.conftest import LENGTHS, flat, make_engine, needs_verl, verl_forward

pytestmark = needs_verl

CASES = [
    pytest.param(fmt, tied, id=f"{fmt}-{'tied' if tied else 'untied'}")
    for fmt in ("thd", "bshd")
    for tied in (False, True)
]


def _step(engine: Any, data_format: str, mtp_only: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """verl's forward, then backward of the log-probs (times 0 for the MTP loss alone); returns outputs, grads."""
    out = verl_forward(engine, data_format)
    loss = flat(out["log_probs"]).sum()
    (loss * 0 if mtp_only else loss).backward()
    gpt = engine.module[0]
    grads = {n: p.grad.clone() for n, p in gpt.named_parameters() if p.grad is not None}
    return {k: flat(v).detach().clone() for k, v in out.items()}, grads


def _head_grad(engine: Any, grads: dict[str, Any]) -> float:
    """Σ|g| on the output head (the shared embedding when tied) from the MTP loss."""
    name = (
        "embedding.word_embeddings.weight"
        if engine.module[0].share_embeddings_and_output_weights
        else "output_layer.weight"
    )
    return float(grads[name].abs().sum()) if name in grads else 0.0


def _both(data_format: str, tied: bool, mtp_only: bool) -> tuple[Any, Any, tuple[Any, Any], tuple[Any, Any]]:
    """Two engines on the same weights: verl's own patch_engine_mtp, then with VERL_MTP applied; one step each."""
    import patchreg
    from patches.verl import VERL_MTP

    theirs = make_engine(detach_encoder=True, tied=tied)
    report = patchreg.apply(VERL_MTP, lazy=True)
    try:
        ours = make_engine(detach_encoder=True, tied=tied)
    finally:
        patchreg.revert(report)  # the engine's own MTP installs stay until the engine goes
    return theirs, ours, _step(theirs, data_format, mtp_only), _step(ours, data_format, mtp_only)


@pytest.mark.parametrize(("data_format", "tied"), CASES)
def test_logits_log_probs_entropy_and_mtp_grads_bit_equal(cpu: Any, data_format: str, tied: bool) -> None:
    """Logits, log-probs and entropy from verl's forward are bit-equal under verl's patches and ours, and so are MTP grads."""
    theirs, ours, (verl_out, verl_grads), (our_out, our_grads) = _both(data_format, tied, mtp_only=False)
    assert set(verl_out) == set(our_out) == {"logits", "log_probs", "entropy"}
    assert verl_out["logits"].shape == (sum(LENGTHS), VOCAB)  # every token's logits, unpacked by verl
    for key in verl_out:
        assert torch_equal(verl_out[key], our_out[key]), key
    mtp = sorted(n for n in verl_grads if n.startswith("mtp."))
    assert mtp and mtp == sorted(n for n in our_grads if n.startswith("mtp."))
    for name in mtp:
        assert torch_equal(verl_grads[name], our_grads[name]), name
    del theirs, ours
    gc.collect()


@pytest.mark.parametrize(("data_format", "tied"), CASES)
def test_mtp_loss_leaves_the_head_alone_with_detach_encoder(cpu: Any, data_format: str, tied: bool) -> None:
    """With detach_encoder=True the MTP loss sends exactly 0 to the trunk under ours; verl's leaks into the head."""
    theirs, ours, (_, verl_grads), (_, our_grads) = _both(data_format, tied, mtp_only=True)
    trunk = {n: g for n, g in our_grads.items() if not n.startswith("mtp.")}
    assert all(float(g.abs().sum()) == 0.0 for g in trunk.values()), sorted(trunk)
    assert any(float(g.abs().sum()) > 0 for n, g in our_grads.items() if n.startswith("mtp."))
    leak = _head_grad(theirs, verl_grads)
    record_measurement(f"verl-head-grad-from-mtp-{data_format}-{'tied' if tied else 'untied'}", leak)
    assert leak > 0  # verl 0.9.1 on megatron-core 0.19.2: process_mtp_loss detaches the head only with mtp_detach_heads
    assert _head_grad(ours, our_grads) == 0.0
    del theirs, ours
    gc.collect()


def torch_equal(a: Any, b: Any) -> bool:
    """Same shape, dtype and every element (bit-equal)."""
    import torch

    return a.dtype == b.dtype and torch.equal(a, b)
