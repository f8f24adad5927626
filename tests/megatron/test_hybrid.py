"""mtp_patched on tiny real HybridModels (0.18.2+) and MambaModels (0.17): the GPTModel guarantees, refusals."""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.megatron.hybrid_models import hybrid_skip_reason

if hybrid_skip_reason() is not None:
    pytest.skip(str(hybrid_skip_reason()), allow_module_level=True)

import torch

import patchreg
from patches.megatron import UnsupportedModelError, mtp_patched
from patches.megatron.mtp import HYBRID_MTP_DETACH_SET, HYBRID_MTP_SET
from tests.megatron.conftest import (
    MCORE,
    check_gradients,
    grad_of,
    make_batch,
    make_config,
    record_measurement,
    rel_err,
)
from tests.megatron.hybrid_models import (
    build_hybrid,
    hybrid_class,
    hybrid_reference,
    inner,
    mtp_params,
    trunk_params,
)
from tests.megatron.test_mtp import ModuleWrapper, VisionLanguage, applicable, record_patches, rl_mode

CLASS = hybrid_class().__name__


def patched_step(model: Any, batch: Any, detach: bool, **kwargs: Any) -> tuple[Any, Any]:
    """Logits and report of one patched forward, and the MTP loss alone backpropagated (main loss x 0)."""
    inner(model).zero_grad(set_to_none=True)
    with mtp_patched(model, detach_encoder=detach) as report:
        logits = model(*batch.args(), **batch.kwargs(), **kwargs)
        (logits * 0).sum().backward()
    return logits, report


def reference_grads(model: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    """The reference and the gradient of its MTP loss for every parameter."""
    ref = hybrid_reference(model, batch)
    params = {**mtp_params(model), **trunk_params(model)}
    grads = torch.autograd.grad(ref.mtp_loss, list(params.values()), allow_unused=True)
    return ref, {
        n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(params.items(), grads, strict=True)
    }


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_logits_equal_upstream_main_head(detach: bool) -> None:
    """With labels given, the patched HybridModel returns [b, s, vocab] logits bit-equal to upstream's main head."""
    model, batch = build_hybrid(), make_batch()
    ref = hybrid_reference(model, batch)
    logits, _ = patched_step(model, batch, detach)
    assert logits.shape == (2, 8, 64)
    assert torch.equal(logits, ref.logits)
    record_measurement(f"logits max abs diff ({CLASS})", float((logits - ref.logits).abs().max().detach()))


@pytest.mark.parametrize("depth", [1, 2], ids=["mtp1", "mtp2"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_mtp_gradients_match_reference(detach: bool, tied: bool, depth: int) -> None:
    """MTP gradients match the reference within 1e-5; embedding, decoder and head get exactly zero iff detached."""
    model, batch = build_hybrid(tied=tied, depth=depth), make_batch()
    ref, want = reference_grads(model, batch)
    _, report = patched_step(model, batch, detach)
    key = f"mtp grad max abs diff ({CLASS}, detach={detach}, tied={tied}, depth={depth})"
    check_gradients(mtp_params(model), trunk_params(model), want, detach, key)
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=1e-5)


def test_block_exit_restores_every_touched_namespace_and_frees_the_model() -> None:
    """After the block the model, its MTP block and layers and the model's module hold what they held; freed by refcount."""
    model, batch = build_hybrid(depth=2), make_batch()
    module = sys.modules[type(model).forward.__module__]
    spaces = [model, model.mtp, *model.mtp.layers]
    before = [dict(vars(m)) for m in spaces] + [dict(vars(module))]
    upstream_loss = model(*batch.args(), **batch.kwargs())
    with mtp_patched(model, detach_encoder=True) as report:
        assert report.installed > 0
        model(*batch.args(), **batch.kwargs())
    after = [dict(vars(m)) for m in spaces] + [dict(vars(module))]
    for now, snap in zip(after, before, strict=True):
        assert now.keys() == snap.keys() and all(now[k] is snap[k] for k in snap)
    assert torch.equal(model(*batch.args(), **batch.kwargs()), upstream_loss)
    ref = weakref.ref(model)
    del model, spaces, before, after, now, snap, report
    gc.disable()
    try:
        assert ref() is None
    finally:
        gc.enable()


def test_a_model_outside_the_block_keeps_upstream_behaviour() -> None:
    """While one HybridModel is patched, another one's loss and gradients (MTP included) are upstream's, bit for bit."""
    patched, other, batch = build_hybrid(seed=1), build_hybrid(seed=2, tied=True), make_batch()

    def upstream_step() -> tuple[Any, dict[str, Any]]:
        other.zero_grad(set_to_none=True)
        loss = other(*batch.args(), **batch.kwargs())
        loss.sum().backward()
        return loss, {n: grad_of(p).clone() for n, p in other.named_parameters()}

    want_loss, want = upstream_step()
    with mtp_patched(patched, detach_encoder=True):
        got_loss, got = upstream_step()
        assert patched(*batch.args(), **batch.kwargs()).shape == (2, 8, 64)
    assert got_loss.shape == (2, 8) and torch.equal(got_loss, want_loss)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name


@pytest.mark.parametrize(
    "wrap", [lambda m: ModuleWrapper(ModuleWrapper(m)), VisionLanguage], ids=["module-chain", "language-model"]
)
def test_wrapped_models_are_patched_inside(wrap: Any) -> None:
    """A .module chain or a .language_model holder gets the bare model's logits and MTP gradients."""
    model, batch = wrap(build_hybrid()), make_batch()
    ref, want = reference_grads(model, batch)
    logits, report = patched_step(model, batch, detach=True)
    assert torch.equal(logits, ref.logits)
    assert {e.patch for e in report.entries} == applicable(HYBRID_MTP_DETACH_SET)
    for name, param in mtp_params(model).items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name


def test_megatron_float16_module_wrapper() -> None:
    """Megatron-Core's bf16 Float16Module: patched inside, MTP trains only the MTP layers when detached."""
    from megatron.core.transformer.module import Float16Module

    hybrid = build_hybrid(bf16=True)
    model, batch = Float16Module(hybrid.config, hybrid), make_batch()
    logits, report = patched_step(model, batch, detach=True)
    assert logits.shape == (2, 8, 64) and len(report.mtp_losses) == 1
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in trunk_params(model).values())
    assert all(torch.count_nonzero(grad_of(p)) for n, p in mtp_params(model).items() if n.endswith("weight"))


def test_list_of_two_chunks() -> None:
    """A chunk list: every chunk's forward is patched (logits, never the loss), MTP where its layers are."""
    first = build_hybrid(mtp=False, seed=1)
    second, batch = build_hybrid(seed=2), make_batch()
    ref, want = reference_grads(second, batch)
    with mtp_patched([first, second], detach_encoder=True) as report:
        assert patchreg.registry.is_active("hybrid_forward_detached", first)
        assert first(*batch.args(), **batch.kwargs()).shape == (2, 8, 64)
        second.zero_grad(set_to_none=True)
        logits = second(*batch.args(), **batch.kwargs())
        (logits * 0).sum().backward()
    assert torch.equal(logits, ref.logits) and len(report.mtp_losses) == 1
    assert not patchreg.registry.is_active("hybrid_forward_detached", first)
    for name, param in mtp_params(second).items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name


def test_chunk_list_with_an_unsupported_chunk_is_refused_whole() -> None:
    """One chunk holding no supported model refuses the list, naming that chunk's innermost model; nothing installed."""
    model = build_hybrid()
    chunks = [model, ModuleWrapper(torch.nn.Linear(2, 2))]
    with pytest.raises(UnsupportedModelError, match=r"chunk 1 ModuleWrapper → Linear") as caught, mtp_patched(chunks):
        pass
    assert "nothing was patched" in str(caught.value)
    assert not patchreg.registry.is_active("hybrid_forward", model)
    assert "forward" not in vars(model)


def test_wrapper_of_an_unsupported_model_names_the_innermost() -> None:
    """Float16Module around a non-MTP model is refused naming 'Float16Module → Linear' and what to pass instead."""
    from megatron.core.transformer.module import Float16Module

    wrapped = Float16Module(make_config(bf16=True), torch.nn.Linear(2, 2))
    with pytest.raises(UnsupportedModelError, match=r"Float16Module → Linear.*HybridModel"):
        mtp_patched(wrapped)


def test_model_without_mtp_layers_says_so_once(caplog: Any) -> None:
    """A HybridModel without MTP layers returns logits; the report says so (normal on a pipeline stage), logged once."""
    import patches.megatron.mtp as mtp

    model, batch = build_hybrid(mtp=False), make_batch()
    mtp._LOGGED_NO_MTP.clear()
    with caplog.at_level(logging.INFO, logger="patchreg"):
        for detach in (False, True):  # the detached set selects the MTP block: not finding it is no warning here
            with mtp_patched(model, detach_encoder=detach) as report:
                assert model(*batch.args(), **batch.kwargs()).shape == (2, 8, 64)
    assert "no MTP layers" in report.note and "pipeline stage without MTP" in str(report)
    assert sum("no MTP layers" in r.getMessage() for r in caplog.records) == 1
    ours = [r for r in caplog.records if r.name == "patchreg" and r.levelno >= logging.WARNING]
    assert not ours, "a stage without MTP is no warning"
    assert report.mtp_losses == ()


def test_report_lines_read_reverted_after_the_block() -> None:
    """Inside the block the report's install lines read 'active'; after it, 'reverted', like its header."""
    model, batch = build_hybrid(), make_batch()
    with mtp_patched(model, detach_encoder=True) as report:
        model(*batch.args(), **batch.kwargs())
        inside = str(report)
    after = str(report)
    assert "(active)" in inside and "  active   hybrid_forward_detached" in inside
    assert "(reverted)" in after and "  active " not in after and "  reverted hybrid_forward_detached" in after
    assert max(map(len, inside.splitlines() + after.splitlines())) <= 100
    assert f"on {CLASS}" in after and "depth 1:" in after
    names = {e.patch for e in report.entries} | {name for name, _ in report.skipped}
    assert names == set(HYBRID_MTP_DETACH_SET.names)


def labels_none_step(model: Any, batch: Any, patched: bool, detach: bool = False) -> tuple[Any, dict[str, Any], Any]:
    """Logits, every parameter's gradient and per-depth losses of one labels=None forward (main loss x 0)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model.zero_grad(set_to_none=True)
    MTPLossLoggingHelper.tracker.clear()
    if patched:
        with mtp_patched(model, detach_encoder=detach) as report:
            logits = model(*batch.args(), loss_mask=batch.loss_mask)
            (logits * 0).sum().backward()
        losses = report.mtp_losses
    else:
        logits = model(*batch.args(), loss_mask=batch.loss_mask)
        (logits * 0).sum().backward()
        tracked = MTPLossLoggingHelper.tracker.get("loss_values")
        losses = tuple(tracked.tolist()) if tracked is not None else ()
    return logits, {n: grad_of(p).clone() for n, p in model.named_parameters()}, losses


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_labels_none_trains_mtp_as_upstream_rl_mode(tied: bool) -> None:
    """labels=None inside the block equals plain upstream: RL mode's losses and gradients (0.19+), else no MTP."""
    batch = make_batch()
    want_logits, want, want_losses = labels_none_step(build_hybrid(tied=tied, depth=2), batch, patched=False)
    logits, got, losses = labels_none_step(build_hybrid(tied=tied, depth=2), batch, patched=True)
    assert torch.equal(logits, want_logits)
    if not rl_mode():  # 0.17/0.18 upstream returns logits and trains no MTP with labels=None
        assert losses == ()
        assert all(torch.count_nonzero(g) == 0 for n, g in got.items() if n.startswith("mtp."))
        return
    assert len(losses) == 2 and losses == pytest.approx(want_losses, rel=1e-6)
    worst = max(float((got[n] - g).abs().max()) for n, g in want.items())
    record_measurement(f"rl-mode parity max abs grad diff ({CLASS}, tied={tied})", worst)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name
    assert any(torch.count_nonzero(g) for n, g in got.items() if n.startswith("mtp."))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_labels_none_detached_equals_upstream_mtp_detach_heads(tied: bool) -> None:
    """With labels=None, detach_encoder=True gives upstream's RL mode with mtp_detach_heads=True, bit-equal."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not rl_mode() or "mtp_detach_heads" not in TransformerConfig.__dataclass_fields__:
        pytest.skip(f"megatron-core {MCORE} has no RL mode with mtp_detach_heads")
    batch = make_batch()
    _, want, want_losses = labels_none_step(build_hybrid(tied=tied, depth=2, mtp_detach_heads=True), batch, False)
    _, got, losses = labels_none_step(build_hybrid(tied=tied, depth=2), batch, patched=True, detach=True)
    assert losses == pytest.approx(want_losses, rel=1e-6)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name
    assert all(torch.count_nonzero(g) == 0 for n, g in got.items() if not n.startswith("mtp."))


RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_recompute_gives_the_same_gradients(detach: bool) -> None:
    """recompute_granularity='full' gives the gradients of no recompute (patched where upstream MTP recompute is broken)."""
    batch = make_batch()

    def step(model: Any) -> dict[str, Any]:
        model.zero_grad(set_to_none=True)
        with mtp_patched(model, detach_encoder=detach):
            logits = model(*batch.args(), **batch.kwargs())
            (logits.float().log_softmax(-1).amax(-1) * batch.loss_mask).mean().backward()
        return {n: grad_of(p).clone() for n, p in model.named_parameters()}

    want, got = step(build_hybrid(depth=2)), step(build_hybrid(depth=2, **RECOMPUTE))
    for name, grad in want.items():
        assert rel_err(got[name], grad) <= 1e-6, name
    assert any(torch.count_nonzero(g) for n, g in got.items() if n.startswith("mtp."))


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_every_patch_of_the_set_is_held_or_skipped_with_a_reason(detach: bool) -> None:
    """On a hybrid model each patch of the chosen set is held or skipped with this release's reason."""
    with mtp_patched(build_hybrid(), detach_encoder=detach) as report:
        names = {e.patch for e in report.entries} | {name for name, _ in report.skipped}
        record_patches(CLASS, detach, report)
    assert names == set((HYBRID_MTP_DETACH_SET if detach else HYBRID_MTP_SET).names)
    assert all(reason for _, reason in report.skipped)


def test_sets_name_the_same_guarantees_for_both_detach_modes() -> None:
    """The hybrid sets hold a forward patch, the MTP-loss wraps and recompute; the detached one also detaches inputs."""
    assert {"hybrid_forward", "hybrid_mtp_loss", "mamba_mtp_loss", "checkpointed_forward"} == set(HYBRID_MTP_SET.names)
    assert {"mtp_input_detached", "detach_embeddings"} <= set(HYBRID_MTP_DETACH_SET.names)
