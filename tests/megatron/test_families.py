"""mtp_patched's guarantees that hold for every model family, each test run once per family.

``gpt``: a tiny real GPTModel (conftest.py). ``hybrid``: a tiny real HybridModel (0.18.2+) or MambaModel
(0.17), skipped where the release has neither with MTP (hybrid_models.py). Each family supplies its
builder, the independent reference, its patch sets and the patch that makes the model return logits;
what only one family has is tested in test_mtp.py and test_hybrid.py.
"""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch
from packaging.version import Version

import patchreg
from patches.megatron import UnsupportedModelError, cpu_patched, mtp_patched
from patches.megatron._loss import tracked_losses
from patches.megatron._native import native
from patches.megatron.mtp import HYBRID_MTP_DETACH_SET, HYBRID_MTP_SET, MTP_DETACH_SET, MTP_SET
from patchreg import PatchSet
from tests.megatron import conftest, hybrid_models
from tests.megatron.conftest import (
    BATCH,
    HIDDEN,
    MCORE,
    SEQ,
    VOCAB,
    build_gpt,
    check_gradients,
    grad_of,
    make_batch,
    record_measurement,
    reference,
    rel_err,
    unwrap,
)
from tests.megatron.hybrid_models import build_hybrid, hybrid_class, hybrid_reference, hybrid_skip_reason, inner
from tests.megatron.test_mtp import (
    RECOMPUTE,
    ModuleWrapper,
    VisionLanguage,
    patched_step,
    reference_grads,
    rl_mode,
)

HYBRID_SKIP = hybrid_skip_reason()  # read once, as test_hybrid.py's module-level skip does


@attrs.frozen
class Family:
    """What one model family's tests tell apart: its class, builder, reference, patch sets and logits patch."""

    cls: str  #: the model class, as reports and the matrix's measurement keys name it
    build: Callable[..., Any]  #: build(seed=, tied=, depth=, mtp=, **config overrides) -> a bare model
    unwrap: Callable[[Any], Any]  #: the model inside ``.module`` / ``.language_model`` wrappers
    reference: Callable[[Any, Any], Any]  #: main-head logits and MTP losses from hooks and plain torch
    mtp_params: Callable[[Any], dict[str, Any]]
    trunk_params: Callable[[Any], dict[str, Any]]
    sets: tuple[PatchSet, PatchSet]  #: the patch set for detach_encoder False, True
    forward: str  #: the patch that makes the model return logits ("_detached" added for the detached set)
    attribute: str  #: the model's attribute that patch replaces
    first_chunk: dict[str, Any]  #: builder arguments of a first pipeline chunk, besides mtp=False
    first_shape: tuple[int, ...]  #: what that chunk returns

    def patch(self, detach: bool) -> str:
        """The name of the logits patch in the set for ``detach`` (0.19.2+: the native route's forward, both modes)."""
        if native():
            return "rl_mode_forward"
        return f"{self.forward}_detached" if detach else self.forward

    def reference_grads(self, model: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
        """The reference and the gradient of its MTP loss for every parameter."""
        return reference_grads(model, batch, self.reference, self.unwrap)


def build_gpt_depth(seed: int = 1234, tied: bool = False, depth: int = 1, mtp: bool = True, **overrides: Any) -> Any:
    """conftest's GPTModel with ``depth`` MTP depths (none if ``mtp=False``), built as build_hybrid's model is."""
    if not mtp:
        return build_gpt(seed, tied, mtp=False, **overrides)
    return build_gpt(seed, tied, mtp_num_layers=depth, **overrides)


def gpt_family() -> Family:
    """GPTModel: MTP in _postprocess, a first chunk without the output layer (it returns the decoder's states)."""
    return Family(
        cls="GPTModel",
        build=build_gpt_depth,
        unwrap=unwrap,
        reference=reference,
        mtp_params=conftest.mtp_params,
        trunk_params=conftest.trunk_params,
        sets=(MTP_SET, MTP_DETACH_SET),
        forward="postprocess",
        attribute="_postprocess",
        first_chunk={"post_process": False},
        first_shape=(SEQ, BATCH, HIDDEN),
    )


def hybrid_family() -> Family:
    """HybridModel (MambaModel 0.17): MTP inline in forward, a first chunk without MTP layers returns logits."""
    return Family(
        cls=hybrid_class().__name__,
        build=build_hybrid,
        unwrap=inner,
        reference=hybrid_reference,
        mtp_params=hybrid_models.mtp_params,
        trunk_params=hybrid_models.trunk_params,
        sets=(HYBRID_MTP_SET, HYBRID_MTP_DETACH_SET),
        forward="hybrid_forward",
        attribute="forward",
        first_chunk={},
        first_shape=(BATCH, SEQ, VOCAB),
    )


def applicable(patch_set: PatchSet) -> set[str]:
    """Names of the patches whose predicate holds on the installed release."""
    return {p.name for p in patch_set if p.when.evaluate().ok}


def record_patches(model_class: str, detach: bool, report: Any) -> None:
    """Note which patches a block installed and which it skipped (with the reason) for the matrix's summary."""
    entry = {"installed": sorted({e.patch for e in report.entries}), "skipped": dict(report.skipped)}
    record_measurement(f"patches ({model_class}, detach={detach})", entry)  # type: ignore[arg-type]


@pytest.fixture(
    params=[
        pytest.param(gpt_family, id="gpt"),
        pytest.param(
            hybrid_family, id="hybrid", marks=pytest.mark.skipif(HYBRID_SKIP is not None, reason=str(HYBRID_SKIP))
        ),
    ]
)
def family(request: Any) -> Family:
    """Each model family in turn: GPTModel, then HybridModel (MambaModel 0.17) where the release has one with MTP."""
    return request.param()


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_logits_equal_upstream_main_head(family: Family, detach: bool) -> None:
    """With labels given, the patched model returns [b, s, vocab] logits bit-equal to upstream's main head."""
    model, batch = family.build(), make_batch()
    ref = family.reference(model, batch)
    logits, _ = patched_step(model, batch, detach)
    assert logits.shape == (2, 8, 64)
    assert torch.equal(logits, ref.logits)
    record_measurement(f"logits max abs diff ({family.cls})", float((logits - ref.logits).abs().max().detach()))


@pytest.mark.parametrize("depth", [1, 2], ids=["mtp1", "mtp2"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_mtp_gradients_match_reference(family: Family, detach: bool, tied: bool, depth: int) -> None:
    """MTP gradients and per-depth losses match the reference; embedding, decoder and head get zero iff detached."""
    model, batch = family.build(tied=tied, depth=depth), make_batch()
    ref, want = family.reference_grads(model, batch)
    _, report = patched_step(model, batch, detach)
    key = f"mtp grad max abs diff ({family.cls}, detach={detach}, tied={tied}, depth={depth})"
    check_gradients(family.mtp_params(model), family.trunk_params(model), want, detach, key)
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=1e-5)


def test_nested_twice_then_exit_restores_upstream_exactly(family: Family) -> None:
    """Nested blocks install once; afterwards every touched namespace, the outputs and refcount freeing are upstream."""
    model, batch = family.build(depth=2), make_batch()
    spaces = [model, model.mtp, *model.mtp.layers, sys.modules[type(model).forward.__module__]]
    before = [dict(vars(space)) for space in spaces]
    upstream_loss = model(*batch.args(), **batch.kwargs())
    with mtp_patched(model, detach_encoder=True) as outer:
        with mtp_patched(model, detach_encoder=True) as nested:
            assert nested.installed == 0 and outer.installed > 0
            model(*batch.args(), **batch.kwargs())
        assert patchreg.registry.is_active(family.patch(detach=True), model)
    assert not patchreg.registry.is_active(family.patch(detach=True), model)
    for space, snap in zip(spaces, before, strict=True):
        now = vars(space)
        assert now.keys() == snap.keys() and all(now[k] is snap[k] for k in snap)
    assert torch.equal(model(*batch.args(), **batch.kwargs()), upstream_loss)
    ref = weakref.ref(model)
    del model, spaces, before, outer, nested, now, snap, space
    gc.disable()
    try:
        assert ref() is None
    finally:
        gc.enable()


def test_a_model_outside_the_block_keeps_upstream_behaviour(family: Family) -> None:
    """While one model is patched, another one's loss and gradients (MTP included) are upstream's, bit for bit."""
    patched, other, batch = family.build(seed=1), family.build(seed=2, tied=True), make_batch()

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
def test_wrapped_models_are_patched_inside(family: Family, wrap: Any) -> None:
    """A .module chain or a .language_model holder gets the bare model's logits and MTP gradients."""
    model, batch = wrap(family.build()), make_batch()
    ref, want = family.reference_grads(model, batch)
    logits, report = patched_step(model, batch, detach=True)
    assert torch.equal(logits, ref.logits)
    assert {e.patch for e in report.entries} == applicable(family.sets[True])
    for name, param in family.mtp_params(model).items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name


def test_megatron_float16_module_wrapper(family: Family) -> None:
    """Megatron-Core's bf16 Float16Module: patched inside, MTP trains only the MTP layers when detached."""
    from megatron.core.transformer.module import Float16Module

    bare = family.build(bf16=True)
    model, batch = Float16Module(bare.config, bare), make_batch()
    logits, report = patched_step(model, batch, detach=True)
    assert logits.shape == (2, 8, 64) and len(report.mtp_losses) == 1
    assert {e.patch for e in report.entries} == applicable(family.sets[True])
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in family.trunk_params(model).values())
    assert all(torch.count_nonzero(grad_of(p)) for n, p in family.mtp_params(model).items() if n.endswith("weight"))


def test_list_of_two_chunks(family: Family) -> None:
    """A chunk list: every chunk's output path is patched (logits, never the loss), MTP where its layers are."""
    first = family.build(mtp=False, seed=1, **family.first_chunk)
    second, batch = family.build(seed=2), make_batch()
    ref, want = family.reference_grads(second, batch)
    with mtp_patched([first, second], detach_encoder=True) as report:
        assert patchreg.registry.is_active(family.patch(detach=True), first)
        assert {e.patch for e in report.entries} == applicable(family.sets[True])
        assert first(*batch.args(), **batch.kwargs()).shape == family.first_shape
        second.zero_grad(set_to_none=True)
        logits = second(*batch.args(), **batch.kwargs())
        (logits * 0).sum().backward()
    assert torch.equal(logits, ref.logits) and len(report.mtp_losses) == 1
    assert not patchreg.registry.is_active(family.patch(detach=True), first)
    for name, param in family.mtp_params(second).items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name


def test_chunk_list_with_an_unsupported_chunk_is_refused_whole(family: Family) -> None:
    """One chunk holding no supported model refuses the list, naming that chunk's innermost model; nothing installed."""
    model = family.build()
    chunks = [model, ModuleWrapper(torch.nn.Linear(2, 2))]
    with pytest.raises(UnsupportedModelError, match=r"chunk 1 ModuleWrapper → Linear") as caught, mtp_patched(chunks):
        pass
    assert "nothing was patched" in str(caught.value)
    assert not patchreg.registry.is_active(family.patch(detach=False), model)
    assert family.attribute not in vars(model)


def test_model_without_mtp_layers_says_so_once(family: Family, caplog: Any) -> None:
    """A model without MTP layers returns logits; the report says so (normal on a pipeline stage), logged once."""
    import patches.megatron.mtp as mtp

    model, batch = family.build(mtp=False), make_batch()
    mtp._LOGGED_NO_MTP.clear()
    with caplog.at_level(logging.INFO, logger="patchreg"):
        for detach in (False, True):  # the detached set selects the MTP layers: not finding them is no warning here
            with mtp_patched(model, detach_encoder=detach) as report:
                assert model(*batch.args(), **batch.kwargs()).shape == (2, 8, 64)
    assert "no MTP layers" in report.note and "pipeline stage without MTP" in str(report)
    assert sum("no MTP layers" in r.getMessage() for r in caplog.records) == 1
    ours = [r for r in caplog.records if r.name == "patchreg" and r.levelno >= logging.WARNING]
    assert not ours, "a stage without MTP is no warning"
    assert report.mtp_losses == ()


def test_report_lines_read_reverted_after_the_block(family: Family) -> None:
    """The report names each patch held or skipped (with the reason), 'active' inside the block, 'reverted' after."""
    model, batch = family.build(), make_batch()
    with cpu_patched(), mtp_patched(model, detach_encoder=True) as report:
        model(*batch.args(), **batch.kwargs())
        inside = str(report)
    after = str(report)
    patch = family.patch(detach=True)
    assert "(active)" in inside and f"  active   {patch}" in inside and "megatron-core" in inside
    assert "(reverted)" in after and "  active " not in after and f"  reverted {patch}" in after
    assert max(map(len, inside.splitlines() + after.splitlines())) <= 100
    assert f"on {family.cls}" in after and "depth 1:" in after
    names = {e.patch for e in report.entries} | {name for name, _ in report.skipped}
    assert names == set(family.sets[True].names)
    assert all(reason for _, reason in report.skipped)


def labels_none_step(model: Any, batch: Any, patched: bool, detach: bool = False) -> tuple[Any, dict[str, Any], Any]:
    """Logits, every parameter's gradient and the per-depth losses of one labels=None forward (main loss x 0)."""
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
        tracked = tracked_losses(MTPLossLoggingHelper.tracker)
        losses = tuple(tracked.tolist()) if tracked is not None else ()
    return logits, {n: grad_of(p).clone() for n, p in model.named_parameters()}, losses


def upstream_runs_without_labels() -> bool:
    """Whether upstream's forward takes labels=None with MTP layers (0.17+; 0.13-0.16 GPTModel fails on it)."""
    return Version(str(MCORE)) >= Version("0.17")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_labels_none_trains_mtp_as_upstream_rl_mode(family: Family, tied: bool) -> None:
    """labels=None inside the block equals plain upstream: RL mode's losses and gradients (0.19+), else no MTP."""
    batch, model = make_batch(), family.build(tied=tied, depth=2)
    main_head = family.reference(model, batch).logits
    upstream = None
    if upstream_runs_without_labels():
        upstream = labels_none_step(family.build(tied=tied, depth=2), batch, patched=False)
    logits, got, losses = labels_none_step(model, batch, patched=True)
    assert torch.equal(logits, main_head)
    if not rl_mode():  # 0.17/0.18 upstream returns logits and trains no MTP with labels=None; 0.13-0.16 fails on it
        assert upstream is None or torch.equal(logits, upstream[0])
        assert losses == ()
        assert all(torch.count_nonzero(g) == 0 for n, g in got.items() if n.startswith("mtp."))
        return
    assert upstream is not None
    want_logits, want, want_losses = upstream
    assert torch.equal(logits, want_logits)
    assert len(losses) == 2 and losses == pytest.approx(want_losses, rel=1e-6)
    worst = max(float((got[n] - g).abs().max()) for n, g in want.items())
    record_measurement(f"rl-mode parity max abs grad diff ({family.cls}, tied={tied})", worst)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name
    assert any(torch.count_nonzero(g) for n, g in got.items() if n.startswith("mtp."))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_labels_none_detached_equals_upstream_mtp_detach_heads(family: Family, tied: bool) -> None:
    """With labels=None, detach_encoder=True gives upstream's RL mode with mtp_detach_heads=True, bit-equal."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not rl_mode() or "mtp_detach_heads" not in TransformerConfig.__dataclass_fields__:
        pytest.skip(f"megatron-core {MCORE} has no RL mode with mtp_detach_heads")
    batch = make_batch()
    upstream_model = family.build(tied=tied, depth=2, mtp_detach_heads=True)
    _, want, want_losses = labels_none_step(upstream_model, batch, patched=False)
    _, got, losses = labels_none_step(family.build(tied=tied, depth=2), batch, patched=True, detach=True)
    assert losses == pytest.approx(want_losses, rel=1e-6)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name
    assert all(torch.count_nonzero(g) == 0 for n, g in got.items() if not n.startswith("mtp."))


def full_step(model: Any, batch: Any, detach: bool) -> dict[str, Any]:
    """Gradients of a PPO-like main loss plus the MTP loss, under mtp_patched."""
    model.zero_grad(set_to_none=True)
    with mtp_patched(model, detach_encoder=detach):
        logits = model(*batch.args(), **batch.kwargs())
        (logits.float().log_softmax(-1).amax(-1) * batch.loss_mask).mean().backward()
    return {n: grad_of(p).clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_recompute_gives_the_same_gradients(family: Family, detach: bool) -> None:
    """recompute_granularity='full' gives the gradients of no recompute (patched where upstream is broken)."""
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer

    if not hasattr(MultiTokenPredictionLayer, "_checkpointed_forward"):
        pytest.skip(f"megatron-core {MCORE} has no MTP recompute")
    batch = make_batch()
    want = full_step(family.build(depth=2), batch, detach)
    got = full_step(family.build(depth=2, **RECOMPUTE), batch, detach)
    for name, grad in want.items():
        assert rel_err(got[name], grad) <= 1e-6, name
    assert any(torch.count_nonzero(g) for n, g in got.items() if n.startswith("mtp."))
    worst = max(float((got[n] - g).abs().max()) for n, g in want.items())
    record_measurement(f"recompute max abs grad diff ({family.cls}, detach={detach})", worst)


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_every_patch_of_the_set_is_held_or_skipped_with_a_reason(family: Family, detach: bool) -> None:
    """Each patch of the chosen set is held or skipped with this release's reason (the matrix lists them)."""
    with mtp_patched(family.build(), detach_encoder=detach) as report:
        names = {e.patch for e in report.entries} | {name for name, _ in report.skipped}
        record_patches(family.cls, detach, report)
    assert names == set(family.sets[detach].names)
    assert all(reason for _, reason in report.skipped)
