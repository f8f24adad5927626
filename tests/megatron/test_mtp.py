"""mtp_patched on a tiny real GPTModel: losses, the tracker, RL mode, the block's forms, refusals, upstream calls.

The guarantees GPTModel shares with HybridModel (logits and MTP gradients against the independent reference,
wrappers, chunk lists, labels=None, recompute, restoring upstream, the report) are in test_families.py.
"""

from __future__ import annotations

import sys
import threading
import traceback
from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

import patchreg
from patches.megatron import (
    MTPBlock,
    MTPConflictError,
    UnsupportedModelError,
    mtp_patched,
)
from patches.megatron._compat import call_kwargs
from patches.megatron._loss import tracked_losses
from patches.megatron._native import native
from patches.megatron.errors import MissingUpstreamArgumentError
from patches.megatron.mtp import CHECKPOINTED_FORWARD, MTP_DETACH_SET, MTP_SET
from tests.megatron.conftest import (
    MCORE,
    build_gpt,
    grad_of,
    make_batch,
    mtp_params,
    record_measurement,
    reference,
    rel_err,
    roll_left,
    unwrap,
)


def patched_step(model: Any, batch: Any, detach: bool, **kwargs: Any) -> tuple[Any, Any]:
    """Logits and report of one patched forward, and the MTP loss alone backpropagated (main loss x 0)."""
    model.zero_grad(set_to_none=True)
    with mtp_patched(model, detach_encoder=detach) as report:
        logits = model(*batch.args(), **batch.kwargs(), **kwargs)
        (logits * 0).sum().backward()
    return logits, report


def reference_grads(
    model: Any, batch: Any, reference_of: Any = reference, inner: Any = unwrap
) -> tuple[Any, dict[str, Any]]:
    """The reference (GPTModel's unless another family's is given) and its MTP loss's gradient for every parameter."""
    ref = reference_of(model, batch)
    params = dict(inner(model).named_parameters())
    grads = torch.autograd.grad(ref.mtp_loss, list(params.values()), allow_unused=True)
    return ref, {
        n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(params.items(), grads, strict=True)
    }


def test_report_carries_per_depth_losses_and_tracker_gets_them() -> None:
    """report.mtp_losses equals the reference per depth, and Megatron-Core's tracker holds them in training."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model, batch = build_gpt(mtp_num_layers=2), make_batch()
    ref = reference(model, batch)
    MTPLossLoggingHelper.tracker.clear()
    _, report = patched_step(model, batch, detach=True)
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=1e-5)
    tracked = tracked_losses(MTPLossLoggingHelper.tracker)
    assert tracked.tolist() == pytest.approx(list(report.mtp_losses), rel=1e-6)
    assert "depth 2:" in str(report)


@pytest.mark.parametrize("masked", ["some", "none"])
def test_tracker_acceptance_counts_equal_upstreams_own(masked: str) -> None:
    """Where the tracker takes acceptance counts (0.19+), ours equal what upstream's own MTP loss path logs."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    if not hasattr(MTPLossLoggingHelper, "save_metrics_to_tracker"):
        pytest.skip(f"megatron-core {MCORE} logs the MTP loss only")
    model, batch = build_gpt(mtp_num_layers=2), make_batch(masked=masked)
    MTPLossLoggingHelper.tracker.clear()
    model(*batch.args(), **batch.kwargs())  # upstream: the language-model loss, MTP metrics to the tracker
    want = {key: MTPLossLoggingHelper.tracker[key].clone() for key in ("correct_values", "total_values")}
    want_losses = tracked_losses(MTPLossLoggingHelper.tracker).tolist()
    MTPLossLoggingHelper.tracker.clear()
    patched_step(model, batch, detach=True)
    got = MTPLossLoggingHelper.tracker
    assert torch.equal(got["correct_values"], want["correct_values"])
    assert torch.equal(got["total_values"], want["total_values"])
    assert got["total_values"].tolist() == [float(batch.loss_mask[:, d:].sum()) for d in (1, 2)]
    assert tracked_losses(got).tolist() == pytest.approx(want_losses, rel=1e-6)


def test_eval_mode_leaves_the_tracker_alone() -> None:
    """In eval mode the MTP loss is still computed for the report, but nothing is logged to the tracker."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model, batch = build_gpt(), make_batch()
    model.eval()
    MTPLossLoggingHelper.tracker.clear()
    with torch.no_grad(), mtp_patched(model) as report:
        model(*batch.args(), **batch.kwargs())
    assert len(report.mtp_losses) == 1
    assert tracked_losses(MTPLossLoggingHelper.tracker) is None


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
def test_all_masked_batch_gives_finite_zero_mtp_loss(detach: bool) -> None:
    """An all-masked loss_mask gives an MTP loss of exactly zero and zero, finite gradients."""
    model, batch = build_gpt(), make_batch(masked="all")
    _, report = patched_step(model, batch, detach)
    assert report.mtp_losses == (0.0,)
    for name, param in unwrap(model).named_parameters():
        assert param.grad is None or torch.count_nonzero(param.grad) == 0, name


def test_per_token_loss_follows_the_releases_own_semantics() -> None:
    """With calculate_per_token_loss the MTP gradient is the reference's times the unrolled token count on 0.17+
    (renormalised against the main loss) and times the depth's own token count before (the masked sum)."""
    from patches.megatron._loss import per_token_renormalised

    model, batch = build_gpt(calculate_per_token_loss=True), make_batch()
    _, want = reference_grads(model, batch)
    patched_step(model, batch, detach=True)
    tokens = batch.loss_mask.sum() if per_token_renormalised() else roll_left(batch.loss_mask, 1).sum()
    for name, param in mtp_params(model).items():
        assert rel_err(grad_of(param), want[name] * tokens) <= 1e-5, name


def test_per_token_mtp_gradients_equal_upstreams_own() -> None:
    """With calculate_per_token_loss the MTP layers' gradients equal upstream's own step's on this release."""
    model, batch = build_gpt(calculate_per_token_loss=True), make_batch()
    model.zero_grad(set_to_none=True)
    (model(*batch.args(), **batch.kwargs()) * 0).sum().backward()
    want = {name: grad_of(param).clone() for name, param in mtp_params(model).items()}
    patched_step(model, batch, detach=False)
    worst = max(float((grad_of(p) - want[n]).abs().max()) for n, p in mtp_params(model).items())
    record_measurement("per-token mtp grad vs upstream", worst)
    for name, param in mtp_params(model).items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name


def rl_mode() -> bool:
    """Whether the installed release has upstream's RL mode (process_mtp_loss derives labels from input_ids)."""
    from patches.megatron._loss import RL_MODE

    return RL_MODE.evaluate().ok


def test_rl_mode_mask_rule_gives_the_label_aligned_losses() -> None:
    """An input_ids-aligned mask with labels=None gives the losses of the label-aligned mask (shifted left)."""
    if not rl_mode():
        pytest.skip(f"megatron-core {MCORE} has no RL mode (labels=None trains no MTP)")
    model, batch = build_gpt(mtp_num_layers=2), make_batch()
    label_mask = batch.loss_mask.clone()
    label_mask[:, -1] = 0  # the last label (input_ids[s], beyond the window) is not a real token
    with mtp_patched(model) as with_labels:
        model(*batch.args(), labels=batch.labels, loss_mask=label_mask)
    input_mask = torch.ones_like(label_mask)
    input_mask[:, 1:] = label_mask[:, :-1]  # mask_in[i + 1] = mask[i]: the mask shifted right
    with mtp_patched(model) as rl:
        model(*batch.args(), loss_mask=input_mask)
    assert rl.mtp_losses == pytest.approx(with_labels.mtp_losses, rel=1e-6)


def test_nesting_with_the_other_detach_mode_is_refused() -> None:
    """Entering detach_encoder=False inside detach_encoder=True on one model raises MTPConflictError."""
    model = build_gpt()
    with mtp_patched(model, detach_encoder=True):
        with pytest.raises(MTPConflictError, match="detach_encoder"), mtp_patched(model, detach_encoder=False):
            pass
        held = "mtp_detach_heads" if native() else "postprocess_detached"  # 0.19.2: the native route's value
        assert patchreg.registry.is_active(held, model)


class ModuleWrapper(torch.nn.Module):
    """A DDP/Float16Module-style wrapper: the model lives in ``.module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class VisionLanguage(torch.nn.Module):
    """A VLM-style holder: the model lives in ``.language_model``."""

    def __init__(self, language_model: torch.nn.Module) -> None:
        super().__init__()
        self.language_model = language_model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.language_model(*args, **kwargs)


def test_decorator_form_patches_only_during_the_call() -> None:
    """@mtp_patched(model) patches for the decorated call only."""
    model, batch = build_gpt(), make_batch()

    held = "mtp_detach_heads" if native() else "postprocess_detached"  # 0.19.2: the native route's value

    @mtp_patched(model, detach_encoder=True)
    def step() -> Any:
        assert patchreg.registry.is_active(held, model)
        return model(*batch.args(), **batch.kwargs())

    assert step().shape == (2, 8, 64)
    assert not patchreg.registry.is_active(held, model)


def test_decorated_generator_runs_patched_until_it_ends() -> None:
    """@mtp_patched on a generator function (micro-batches yielded one by one) keeps the patch across its yields."""
    model, batch = build_gpt(), make_batch()

    @mtp_patched(model, detach_encoder=True)
    def steps(n: int) -> Any:
        for _ in range(n):
            yield model(*batch.args(), **batch.kwargs())

    assert [tuple(out.shape) for out in steps(2)] == [(2, 8, 64), (2, 8, 64)]
    assert not patchreg.registry.is_active("postprocess_detached", model)


@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "float16"])
def test_block_is_a_whole_patched_block(wrapped: bool) -> None:
    """mtp_patched is a whole patchreg.Patched block (every field set, to the model's patch set and the given
    registry), and a block made fresh for a decorated call is a like one."""
    model = build_gpt(bf16=wrapped)
    if wrapped:
        from megatron.core.transformer.module import Float16Module

    target = Float16Module(model.config, model) if wrapped else model
    registry = patchreg.Registry("mtp-fields")
    block = mtp_patched(target, detach_encoder=True, registry=registry, strict=True)
    for made in (block, block.fresh()):
        fields = {name: getattr(made, name) for name in patchreg.Patched.__slots__}  # AttributeError: one unset
        assert fields == {
            "_entered": False,
            "_one_call": False,
            "_open": [],
            "obj": target,
            "registry": registry,
            "strict": True,
            "target": MTP_DETACH_SET,
        }
        assert made.open_count == 0 and made.patch_set is MTP_DETACH_SET and made.detach_encoder is True
        assert made.models == [model] and made.has_mtp and isinstance(made, MTPBlock)


def test_the_block_class_makes_the_same_block_as_mtp_patched() -> None:
    """MTPBlock(model, ...) finds the model's patch set as mtp_patched does: the same block, usable the same way."""
    model = build_gpt()
    before = dict(vars(model))
    made, called = MTPBlock(model, True), mtp_patched(model, detach_encoder=True)
    assert (made.patch_set, made.models, made.registry) == (called.patch_set, called.models, called.registry)
    with made as report:
        assert report.installed > 0 and report.detach_encoder is True
    assert vars(model) == before


def test_one_instance_shared_by_threads() -> None:
    """Threads entering the same mtp_patched instance each exit their own enter; the model ends upstream."""
    model = build_gpt()
    before = dict(vars(model))
    shared = mtp_patched(model, detach_encoder=True)
    errors: list[str] = []

    def work() -> None:
        try:
            for _ in range(300):
                with shared as report:
                    assert report.active
        except BaseException:
            errors.append(traceback.format_exc())

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == [], "\n".join(errors)
    assert shared.open_count == 0
    assert not patchreg.registry.is_active("postprocess_detached", model)
    assert vars(model).keys() == before.keys() and all(vars(model)[k] is v for k, v in before.items())


def test_non_gpt_model_is_refused_with_the_remedy() -> None:
    """Passing something that holds no GPTModel raises UnsupportedModelError naming the type."""
    with pytest.raises(UnsupportedModelError, match="Linear"), mtp_patched(torch.nn.Linear(2, 2)):
        pass


def test_mamba_model_without_mtp_is_refused_naming_it_and_the_release() -> None:
    """A MambaModel on a release where it has no MTP (before 0.17) is refused, naming MambaModel and the release."""
    mamba = pytest.importorskip("megatron.core.models.mamba.mamba_model", reason="no MambaModel on this release")
    if hasattr(mamba, "process_mtp_loss"):
        pytest.skip(f"MambaModel has MTP on megatron-core {MCORE} (tests/megatron/test_families.py covers it)")
    model = mamba.MambaModel.__new__(mamba.MambaModel)  # the real class; refused before anything is built or read
    torch.nn.Module.__init__(model)
    with pytest.raises(UnsupportedModelError, match=rf"MambaModel on megatron-core {MCORE} has no MTP"):
        mtp_patched(ModuleWrapper(model))


RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def test_recompute_without_the_patch_fails_where_upstream_is_broken() -> None:
    """On 0.18.x upstream MTP recompute raises TypeError (padding_mask); the checkpoint patch is what fixes it."""
    ok, reason = CHECKPOINTED_FORWARD.when.evaluate()
    if not ok or "TypeError" not in reason:
        pytest.skip(f"upstream MTP recompute does not raise on megatron-core {MCORE}")
    model, batch = build_gpt(**RECOMPUTE), make_batch()
    with patchreg.patched(MTP_SET.without("checkpointed_forward"), model), pytest.raises(TypeError, match="padding"):
        model(*batch.args(), **batch.kwargs())


def test_output_processor_is_handed_over_as_upstream_does() -> None:
    """A user output_processor gets upstream's keywords and decides the result, as in unpatched 0.18+."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    if "output_processor" not in GPTModel._postprocess.__code__.co_varnames:
        pytest.skip(f"megatron-core {MCORE} has no output_processor")
    model, batch = build_gpt(), make_batch()
    seen: list[dict[str, Any]] = []

    def processor(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return kwargs["hidden_states"] * 2

    upstream_out = model(*batch.args(), **batch.kwargs(), output_processor=processor, output_processor_context="c")
    with mtp_patched(model) as report:
        patched_out = model(*batch.args(), **batch.kwargs(), output_processor=processor, output_processor_context="c")
    assert torch.equal(patched_out, upstream_out)
    assert seen[0].keys() == seen[1].keys() and seen[1]["context"] == "c"
    assert len(report.mtp_losses) == 1


def test_a_required_upstream_argument_we_cannot_supply_is_named() -> None:
    """Building a call to a real upstream function without its required argument raises, naming it."""
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    with pytest.raises(MissingUpstreamArgumentError, match=r"'tensors?'"):  # dev: roll_tensor(tensors=[...])
        call_kwargs(roll_tensor, {"shifts": -1})


def test_repeated_mtp_layer_matches_reference() -> None:
    """With mtp_use_repeated_layer (0.17+) one MTP layer serves both depths and its gradients match the reference."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if "mtp_use_repeated_layer" not in TransformerConfig.__dataclass_fields__:
        pytest.skip(f"megatron-core {MCORE} has no mtp_use_repeated_layer")
    model, batch = build_gpt(mtp_num_layers=2, mtp_use_repeated_layer=True), make_batch()
    assert len(unwrap(model).mtp.layers) == 1
    ref, want = reference_grads(model, batch)
    logits, report = patched_step(model, batch, detach=True)
    assert torch.equal(logits, ref.logits) and len(report.mtp_losses) == 2
    for name, param in mtp_params(model).items():
        assert rel_err(grad_of(param), want[name]) <= 1e-5, name


def test_each_report_keeps_the_losses_of_its_own_block() -> None:
    """A report shows the last step inside its block: not an earlier block's, not a later one's; nested blocks share."""
    model, first_batch, second_batch = build_gpt(), make_batch(seed=1), make_batch(seed=2)
    with mtp_patched(model) as first:
        model(*first_batch.args(), **first_batch.kwargs())
    with mtp_patched(model) as second:
        assert second.mtp_losses == ()
        with mtp_patched(model) as inner:
            model(*second_batch.args(), **second_batch.kwargs())
        assert second.mtp_losses == inner.mtp_losses
    with mtp_patched(model):
        model(*first_batch.args(), **first_batch.kwargs())
    assert len(first.mtp_losses) == 1 and first.mtp_losses != second.mtp_losses
    assert inner.mtp_losses == second.mtp_losses and not first.active
    other = build_gpt()
    with mtp_patched(other) as elsewhere, mtp_patched(model) as here:
        other(*first_batch.args(), **first_batch.kwargs())
        assert here.mtp_losses == () and len(elsewhere.mtp_losses) == 1
