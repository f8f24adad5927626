"""Upstream's own RL mode (0.19+) against ``mtp_patched``'s label mode: the measurements a native route rests on.

Upstream natively: ``config.mtp_detach_heads`` set to ``detach_encoder`` (a value patch for the step), ``labels=None``
and the loss mask aligned with ``input_ids`` (the label-aligned mask shifted right one place; the last label
masked). ``mtp_patched``: the user's labels (``input_ids`` shifted) and label-aligned mask. The logits, per-depth
MTP losses, MTP gradients and trunk gradients agree; the diffs go to $PATCHREG_MEASUREMENTS
(``native vs patch ...``). Skipped on releases without the RL mode or ``mtp_detach_heads``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

import patchreg
from patches.megatron import mtp_patched
from patches.megatron._loss import rl_mode, tracked_losses
from tests.megatron.conftest import build_gpt, make_batch, record_measurement
from tests.megatron.hybrid_models import build_hybrid, hybrid_skip_reason


def _native_available() -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not rl_mode() or "mtp_detach_heads" not in TransformerConfig.__dataclass_fields__:
        pytest.skip("upstream has no RL mode (labels=None) with mtp_detach_heads on this release (0.19+)")


def _build(family: str, tied: bool) -> Any:
    if family == "GPTModel":
        return build_gpt(tied=tied, mtp_num_layers=2)
    if hybrid_skip_reason() is not None:
        pytest.skip(str(hybrid_skip_reason()))
    return build_hybrid(tied=tied, depth=2)


def _batch() -> tuple[Any, Any, Any, Any, Any]:
    """ids, positions, causal mask, labels (ids shifted left) and a label-aligned mask whose last position is 0."""
    batch = make_batch(masked="some")
    mask = batch.loss_mask.clone()
    mask[:, -1] = 0  # the label beyond the window is not a real token
    return batch.input_ids, batch.position_ids, batch.attention_mask, batch.labels, mask


def _step(model: Any, out: Any) -> dict[str, Any]:
    (out * 0).sum().backward()
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


def _native(model: Any, detach: bool) -> tuple[Any, tuple[float, ...], dict[str, Any]]:
    """Upstream's RL mode with mtp_detach_heads=detach for the step: logits, tracker losses, gradients."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    ids, pos, causal, _labels, mask = _batch()
    mask_in = torch.zeros_like(mask)
    mask_in[:, 1:] = mask[:, :-1]  # aligned with input_ids: m_in[i + 1] = m[i]
    flag = patchreg.PatchSet("heads", (patchreg.Patch("heads", "config.mtp_detach_heads", detach, kind="value"),))
    model.zero_grad(set_to_none=True)
    MTPLossLoggingHelper.tracker.clear()
    with patchreg.Registry("native").patched(flag, model):
        logits = model(ids, pos, causal, labels=None, loss_mask=mask_in)
        grads = _step(model, logits)
    losses = tuple(float(v) for v in tracked_losses(MTPLossLoggingHelper.tracker))
    return logits, losses, grads


def _patched(model: Any, detach: bool) -> tuple[Any, tuple[float, ...], dict[str, Any]]:
    ids, pos, causal, labels, mask = _batch()
    model.zero_grad(set_to_none=True)
    with mtp_patched(model, detach_encoder=detach) as report:
        logits = model(ids, pos, causal, labels=labels, loss_mask=mask)
        grads = _step(model, logits)
    return logits, report.mtp_losses, grads


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", ["GPTModel", "HybridModel"])
def test_upstreams_rl_mode_with_the_translated_mask_equals_the_label_mode_patch(
    family: str, tied: bool, detach: bool
) -> None:
    """Upstream's RL mode (mtp_detach_heads=detach, input-aligned mask) equals mtp_patched with labels and mask."""
    _native_available()
    model = _build(family, tied)
    native, patched = _native(model, detach), _patched(model, detach)
    key = f"({family}, tied={tied}, detach={detach})"
    logits = float((native[0] - patched[0]).abs().max())
    losses = max(abs(a - b) for a, b in zip(native[1], patched[1], strict=True))
    mtp = max(float((native[2][n] - g).abs().max()) for n, g in patched[2].items() if n.startswith("mtp."))
    trunk = max(float((native[2][n] - g).abs().max()) for n, g in patched[2].items() if not n.startswith("mtp."))
    for name, value in (("logits", logits), ("losses", losses), ("mtp grads", mtp), ("trunk grads", trunk)):
        record_measurement(f"native vs patch {name} {key}", value)
    assert len(native[1]) == len(patched[1]) == 2
    assert logits == 0.0, logits
    assert losses <= 1e-6 and mtp <= 1e-6 and trunk <= 1e-6, (losses, mtp, trunk)
    if detach:
        assert all(torch.count_nonzero(g) == 0 for n, g in native[2].items() if not n.startswith("mtp."))
