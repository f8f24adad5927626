"""``mtp_patched`` on upstream's RL mode (0.19.2+) against today's patches: the same numbers, per call.

On a release whose upstream has the RL mode (``labels=None``) and ``mtp_detach_heads``, the block installs the
native route (``config.mtp_detach_heads`` as a value, wraps of ``forward`` and ``process_mtp_loss``). Today's
patches (the replacements of ``_postprocess`` / ``forward`` / ``_get_embeddings`` / the MTP block's forward) are
applied here by hand from their own functions, ungated, as the reference. Logits, per-depth losses, MTP grads
and trunk grads are compared; the diffs go to $PATCHREG_MEASUREMENTS (``route vs patches ...``). Labels upstream's
RL mode could not derive (not ``input_ids`` shifted under the mask, a trained last label, no mask) ride upstream's
label mode and must equal the old route too.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import attrs
import torch

import patchreg
from patches.megatron import mtp as mtp_module
from patches.megatron import mtp_patched
from patches.megatron._loss import last_losses, resolved
from patches.megatron._native import UPSTREAM, native
from tests.megatron.conftest import build_gpt, make_batch, record_measurement
from tests.megatron.hybrid_models import build_hybrid, hybrid_skip_reason

_OLD = {  # today's patches per (family, detach), ungated: the reference route
    ("GPTModel", False): ("POSTPROCESS",),
    ("GPTModel", True): ("POSTPROCESS_DETACHED", "DETACH_EMBEDDINGS"),
    ("HybridModel", False): ("HYBRID_FORWARD", "HYBRID_MTP_LOSS"),
    ("HybridModel", True): ("HYBRID_FORWARD_DETACHED", "HYBRID_MTP_LOSS", "MTP_INPUT_DETACHED", "DETACH_EMBEDDINGS"),
}


def _native_only() -> None:
    if not native():
        pytest.skip("upstream has no RL mode (labels=None) with mtp_detach_heads on this release (0.19.2+)")


def _build(family: str, tied: bool, depth: int) -> Any:
    if family == "GPTModel":
        return build_gpt(tied=tied, mtp_num_layers=depth)
    if hybrid_skip_reason() is not None:
        pytest.skip(str(hybrid_skip_reason()))
    return build_hybrid(tied=tied, depth=depth)


def _old_set(family: str, detach: bool) -> patchreg.PatchSet:
    patches = [attrs.evolve(getattr(mtp_module, name), when=patchreg.always) for name in _OLD[family, detach]]
    return patchreg.PatchSet(f"old-{family}-{detach}", patches)


def _inputs(kind: str) -> tuple[Any, ...]:
    """ids, positions, causal mask, labels and label-aligned mask: exact for the RL mode, or one way not."""
    batch = make_batch(masked="some")
    labels, mask = batch.labels.clone(), batch.loss_mask.clone()
    mask[:, -1] = 0  # the label beyond the window is not a real token (as an RL actor masks it)
    if kind == "labels":  # labels that are not input_ids shifted under the mask
        labels = torch.roll(batch.input_ids, -2, dims=1)
    elif kind == "last":  # the last label trained
        mask[:, -1] = 1
    elif kind == "no-mask":
        mask = None
    return batch.input_ids, batch.position_ids, batch.attention_mask, labels, mask


def _step(model: Any, run: Any) -> tuple[Any, tuple[float, ...], dict[str, Any], str | None]:
    model.zero_grad(set_to_none=True)
    before = last_losses.count
    logits, route = run()
    (logits * 0).sum().backward()
    newest = last_losses.newest((model,), before)
    losses = tuple(float(v) for v in resolved(newest[1])) if newest is not None else ()
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    return logits.detach(), losses, grads, route


def _compare(model: Any, family: str, detach: bool, kind: str, key: str) -> str | None:
    """Run the block and the old route on one batch; record and check the diffs; return the block's route."""
    ids, pos, causal, labels, mask = _inputs(kind)

    def block() -> tuple[Any, str | None]:
        with mtp_patched(model, detach_encoder=detach) as report:
            names = {entry.patch for entry in report.entries}
            assert "rl_mode_forward" in names and not names & {"postprocess", "postprocess_detached"}, names
            logits = model(ids, pos, causal, labels=labels, loss_mask=mask)
            route = report.last_route
        return logits, route

    def old() -> tuple[Any, None]:
        with patchreg.Registry("old").patched(_old_set(family, detach), model):
            return model(ids, pos, causal, labels=labels, loss_mask=mask), None

    new, ref = _step(model, block), _step(model, old)
    logits = float((new[0] - ref[0]).abs().max())
    losses = max(abs(a - b) for a, b in zip(new[1], ref[1], strict=True))
    mtp = max(float((new[2][n] - g).abs().max()) for n, g in ref[2].items() if n.startswith("mtp."))
    trunk = max(float((new[2][n] - g).abs().max()) for n, g in ref[2].items() if not n.startswith("mtp."))
    for name, value in (("logits", logits), ("losses", losses), ("mtp grads", mtp), ("trunk grads", trunk)):
        record_measurement(f"route vs patches {name} {key}", value)
    assert len(new[1]) == len(ref[1]) == model.config.mtp_num_layers
    assert (logits, losses, mtp, trunk) == (0.0, 0.0, 0.0, 0.0), (logits, losses, mtp, trunk)
    assert any(torch.count_nonzero(g) for n, g in new[2].items() if n.startswith("mtp."))
    return new[3]


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", ["GPTModel", "HybridModel"])
def test_the_native_route_equals_todays_patches(family: str, tied: bool, detach: bool, depth: int) -> None:
    """On 0.19.2 the block's native route gives today's logits, per-depth losses, MTP and trunk grads exactly."""
    _native_only()
    model = _build(family, tied, depth)
    route = _compare(model, family, detach, "exact", f"({family}, tied={tied}, detach={detach}, depth={depth})")
    assert route == UPSTREAM


@pytest.mark.parametrize("kind", ["labels", "last", "no-mask"])
@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("family", ["GPTModel", "HybridModel"])
def test_labels_upstreams_rl_mode_could_not_derive_ride_upstream_exactly(family: str, detach: bool, kind: str) -> None:
    """Labels that are not input_ids shifted, a trained last label, no mask: upstream's body in its label mode gives
    today's numbers exactly for every call, with nothing checked per call (no fallback to a patched loss)."""
    _native_only()
    model = _build(family, False, 2)
    route = _compare(model, family, detach, kind, f"label mode {kind} ({family}, detach={detach})")
    assert route == UPSTREAM


@pytest.mark.parametrize("family", ["GPTModel", "HybridModel"])
def test_the_users_own_rl_mode_call_rides_upstream(family: str) -> None:
    """labels=None with an input-aligned mask inside the block is upstream's RL mode, recorded as such."""
    _native_only()
    model = _build(family, False, 2)
    ids, pos, causal, _labels, mask = _inputs("exact")
    mask_in = torch.zeros_like(mask)
    mask_in[:, 1:] = mask[:, :-1]
    with mtp_patched(model, detach_encoder=True) as report:
        model(ids, pos, causal, labels=None, loss_mask=mask_in)
        losses, route = report.mtp_losses, report.last_route
    with mtp_patched(model, detach_encoder=True) as report:
        model(ids, pos, causal, labels=_labels, loss_mask=mask)
        assert report.mtp_losses == losses  # the two conventions, one per-depth loss
    assert route == UPSTREAM and len(losses) == 2


@pytest.mark.parametrize("built_with", [False, True])
@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_the_block_restores_the_model_exactly(detach: bool, built_with: bool) -> None:
    """After the block the config flag, the model's forward and gpt_model's process_mtp_loss are upstream's again."""
    _native_only()
    import megatron.core.models.gpt.gpt_model as gpt_model

    model = build_gpt(mtp_num_layers=2, mtp_detach_heads=built_with)
    original = gpt_model.process_mtp_loss
    ids, pos, causal, labels, mask = _inputs("exact")
    with mtp_patched(model, detach_encoder=detach):
        assert model.config.mtp_detach_heads is detach
        assert "forward" in vars(model) and gpt_model.process_mtp_loss is not original
        model(ids, pos, causal, labels=labels, loss_mask=mask).sum().backward()
    assert model.config.mtp_detach_heads is built_with
    assert "forward" not in vars(model) and gpt_model.process_mtp_loss is original
    assert model(ids, pos, causal, labels=labels, loss_mask=mask).dim() == 2  # upstream's LM loss [b, s] again


def test_a_user_output_processor_gets_the_users_labels_and_mask() -> None:
    """GPTModel's output_processor inside the block sees the labels and mask the user passed, not labels=None."""
    _native_only()
    model = build_gpt(mtp_num_layers=1)
    ids, pos, causal, labels, mask = _inputs("exact")
    seen: dict[str, Any] = {}

    def processor(**kwargs: Any) -> Any:
        seen.update(labels=kwargs["labels"], loss_mask=kwargs["loss_mask"])
        return kwargs["hidden_states"]

    with mtp_patched(model):
        model(ids, pos, causal, labels=labels, loss_mask=mask, output_processor=processor)
    assert seen["labels"] is labels and seen["loss_mask"] is mask


def test_the_report_says_which_way_each_patch_went() -> None:
    """str(report) lists under "upstream does this natively here" only today's replacements it covers, and names
    the native route's installs apart (they hand the block to upstream's RL mode)."""
    _native_only()
    model = build_gpt(mtp_num_layers=1)
    ids, pos, causal, labels, mask = _inputs("labels")  # labels upstream's RL mode could not derive
    with mtp_patched(model, detach_encoder=True) as report:
        model(ids, pos, causal, labels=labels, loss_mask=mask)
        text = str(report)
    flat = " ".join(line.strip() for line in text.splitlines())  # str(report) wraps at 100 columns
    native = flat.split(f"{UPSTREAM}: ")[1].split(" fix-up ")[0]
    listed, _, via = native.partition(" (")
    assert listed.split(", ") == ["postprocess_detached", "detach_embeddings"], text  # what upstream does, only
    for name in ("mtp_detach_heads", "rl_mode_forward", "rl_mode_mtp_loss"):  # installed: they route to upstream
        assert name in via, text
    assert "checkpointed_forward" not in native, text  # not needed (fixed upstream): the engine's skip line says so
    assert ": patched: " not in native, text  # nothing on this release replaces an upstream body
    assert f"({UPSTREAM})" in flat.split("mtp losses (last step):")[1], text  # the step rode upstream too


@pytest.mark.usefixtures("todays_route")
def test_on_todays_route_the_report_says_why_each_patch_is_patched() -> None:
    """Without upstream's RL mode (forced here) each installed replacement says 'patched: <why>' in str(report)."""
    model = build_gpt(mtp_num_layers=1)
    with mtp_patched(model, detach_encoder=True) as report:
        text = " ".join(line.strip() for line in str(report).splitlines())
        installed = {entry.patch for entry in report.entries}
    assert "postprocess_detached: patched: the test takes today's patches" in text, text
    assert "rl_mode_forward" not in text.split("fix-up")[1], text
    if "detach_embeddings" in installed:  # (0.13 has no _get_embeddings: the postprocess patch detaches them)
        assert "detach_embeddings: patched: " in text, text


def test_mtp_parameters_keep_their_grad_norm_group_under_the_block() -> None:
    """Built with mtp_detach_heads the MTP parameters are tagged 'mtp'; the block's per-step flag tags none."""
    _native_only()
    norms = {}
    for built_with in (False, True):
        model = build_gpt(mtp_num_layers=2, mtp_detach_heads=built_with)
        ids, pos, causal, labels, mask = _inputs("exact")
        with mtp_patched(model, detach_encoder=True):
            logits = model(ids, pos, causal, labels=labels, loss_mask=mask)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
        mtp = [p for n, p in model.named_parameters() if n.startswith("mtp.")]
        tagged = sum(getattr(p, "grad_norm_group", None) == "mtp" for p in mtp)
        assert tagged == (len(mtp) if built_with else 0), (built_with, tagged, len(mtp))
        groups: dict[str, list[Any]] = {}
        for p in model.parameters():
            groups.setdefault(getattr(p, "grad_norm_group", None) or "main", []).append(p.grad)
        norms[built_with] = {g: float(torch.stack([x.norm() for x in grads]).norm()) for g, grads in groups.items()}
        for group, value in norms[built_with].items():
            record_measurement(f"grad norm built_with_flag={built_with} group={group}", value)
        record_measurement(f"mtp params tagged built_with_flag={built_with} of {len(mtp)}", float(tagged))
    whole = norms[False]["main"]
    split = (norms[True]["main"] ** 2 + norms[True]["mtp"] ** 2) ** 0.5
    assert abs(whole - split) <= 1e-5 * whole, (norms, whole, split)  # the same gradients, grouped differently


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("family", ["GPTModel", "HybridModel"])
def test_a_padded_pack_rides_upstream_with_the_fixup_and_equals_todays_patches(family: str, detach: bool) -> None:
    """A thd pack padded per sequence (mask 0 at each pack's last slot) takes the native route, as today's numbers."""
    _native_only()
    from tests.megatron.test_fixups import bshd_batch, packed_batch

    model, batch = _build(family, False, 2), packed_batch(bshd_batch())

    def block() -> tuple[Any, str | None]:
        with mtp_patched(model, detach_encoder=detach) as report:
            return model(**batch), report.last_route

    def old() -> tuple[Any, None]:
        with patchreg.Registry("old").patched(_old_set(family, detach), model):
            return model(**batch), None  # today's patches apply the padded-pack fix-up themselves

    new, ref = _step(model, block), _step(model, old)
    diffs = (
        float((new[0] - ref[0]).abs().max()),
        max(abs(a - b) for a, b in zip(new[1], ref[1], strict=True)),
        max(float((new[2][n] - g).abs().max()) for n, g in ref[2].items()),
    )
    record_measurement(f"route vs patches packed-padded logits/losses/grads ({family}, detach={detach})", max(diffs))
    assert new[3] == UPSTREAM and len(new[1]) == 2
    assert diffs == (0.0, 0.0, 0.0), diffs


def test_per_depth_losses_come_out_of_the_native_route_in_eval_too() -> None:
    """In eval mode (upstream logs nothing to its tracker) report.mtp_losses still has today's per-depth losses."""
    _native_only()
    model = build_gpt(mtp_num_layers=2).eval()
    ids, pos, causal, labels, mask = _inputs("exact")
    with torch.no_grad(), mtp_patched(model, detach_encoder=True) as report:
        model(ids, pos, causal, labels=labels, loss_mask=mask)
        assert report.last_route == UPSTREAM
    with torch.no_grad(), patchreg.Registry("old").patched(_old_set("GPTModel", True), model):
        before = last_losses.count
        model(ids, pos, causal, labels=labels, loss_mask=mask)
        old = tuple(float(v) for v in resolved(last_losses.newest((model,), before)[1]))  # type: ignore[index]
    assert report.mtp_losses == old and len(old) == 2


@pytest.mark.parametrize("family", ["GPTModel", "HybridModel"])
def test_losses_read_after_the_batch_buffers_are_reused_are_the_steps_own(family: str) -> None:
    """The native route computes ``report.mtp_losses`` when first read, from what the step held: a mask buffer the
    loader overwrites in place before that read (after the block, even) does not change them."""
    _native_only()
    model = _build(family, False, 2)
    ids, pos, causal, labels, mask = _inputs("exact")

    def losses(overwrite: bool) -> tuple[float, ...]:
        buffer = mask.clone()
        with mtp_patched(model, detach_encoder=True) as report:
            model(ids, pos, causal, labels=labels, loss_mask=buffer)
        assert report.last_route == UPSTREAM
        if overwrite:
            buffer.zero_()  # the next batch lands in the same buffer
        return report.mtp_losses

    kept, read = losses(False), losses(True)
    assert len(kept) == 2 and all(v > 0 for v in kept), kept
    assert read == kept
