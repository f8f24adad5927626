"""mtp_patched on real architectures (MoE, MLA + MoE, GQA + RoPE, bf16, recompute) against the reference.

Each model is built from Megatron-Core's own local specs (tests/megatron/arch_models.py) and runs on
the CPU under ``cpu_patched()``. The guarantees are test_families.py's: logits bit-equal to upstream's main
head, the MTP loss and its gradients equal to conftest's independent reference, exactly no MTP
gradient to embedding / decoder / output layer with ``detach_encoder=True`` (for MoE: the trunk's
gradient is the routers' aux-loss gradient alone, bit-equal to a step whose MTP loss is scaled by 0),
the trunk trained with ``False``, and every module's attributes restored after the block.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

from patches.megatron import mtp_patched
from tests.megatron.arch_models import ARCHS, Arch, arch_batch, build_arch, unbuildable
from tests.megatron.conftest import (
    MCORE,
    grad_of,
    mtp_params,
    record_measurement,
    reference,
    rel_err,
    trunk_params,
    unwrap,
)

MOE_ARCHS = [name for name, arch in ARCHS.items() if arch.moe]


@pytest.fixture(autouse=True)
def fresh_moe_tracker() -> None:
    """Each test starts with an empty MoE aux-loss tracker (it is sized by the first model that logs to it)."""
    from megatron.core.transformer.moe import moe_utils

    try:
        from megatron.core.transformer.moe import moe_logging
    except ImportError:  # before 0.18: a dict of per-layer values
        moe_utils.get_moe_layer_wise_logging_tracker().clear()
    else:
        moe_logging.destroy_moe_metrics_tracker()


def _arch(name: str) -> Arch:
    arch = ARCHS[name]
    reason = unbuildable(arch)
    if reason:
        pytest.skip(reason)
    return arch


def _tolerance(arch: Arch) -> float:
    """Relative tolerance against the reference: fp32 1e-5; bf16 2e-2 (measured 9.2e-3: the reference's CE is in bf16)."""
    return 2e-2 if arch.bf16 else 1e-5


def _without_recompute(arch: Arch) -> dict[str, Any]:
    """Overrides for the reference's twin: upstream's own MTP recompute is broken on 0.14-0.18 (our patch fixes it)."""
    return (
        {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}
        if (arch.config.get("recompute_granularity"))
        else {}
    )


def _batch(padded: bool = False, no_mask: bool = False) -> Any:
    if padded:
        from megatron.core.models.gpt.gpt_model import GPTModel

        from patches.megatron._compat import parameters

        if "padding_mask" not in parameters(GPTModel.forward)[0]:
            pytest.skip(f"GPTModel.forward of megatron-core {MCORE} takes no padding_mask (0.16+)")
    return arch_batch(padded=padded, no_mask=no_mask)


def patched_step(model: Any, batch: Any, detach: bool, mtp_scale: float = 1.0) -> tuple[Any, Any, dict[str, Any]]:
    """Logits, report and every parameter's gradient of one patched step whose main loss is x0."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    unwrap(model).zero_grad(set_to_none=True)
    MTPLossAutoScaler.set_loss_scale(torch.tensor(mtp_scale))
    try:
        with mtp_patched(model, detach_encoder=detach) as report:
            logits = model(*batch.args(), **batch.kwargs())
            (logits * 0).sum().backward()
    finally:
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    return logits, report, {n: grad_of(p).clone() for n, p in unwrap(model).named_parameters()}


def reference_grads(arch: Arch, batch: Any) -> tuple[Any, dict[str, Any]]:
    """The reference on a twin model (same weights, no recompute) and its MTP loss's gradient per parameter."""
    model = build_arch(arch, **_without_recompute(arch))
    ref = reference(model, batch)
    params = {**mtp_params(model), **trunk_params(model)}
    grads = torch.autograd.grad(ref.mtp_loss, list(params.values()), allow_unused=True)
    return ref, {
        n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(params.items(), grads, strict=True)
    }


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_logits_equal_upstream_main_head(name: str, detach: bool) -> None:
    """The patched model's logits are bit-equal to the main head of upstream's own forward."""
    arch = _arch(name)
    model, batch = build_arch(arch), _batch()
    ref = reference(build_arch(arch, **_without_recompute(arch)), batch)
    logits, _, _ = patched_step(model, batch, detach)
    assert logits.shape == (2, 8, 64)
    assert torch.equal(logits, ref.logits.to(logits.dtype))
    record_measurement(f"{name}: logits max abs diff", float((logits - ref.logits).abs().max().detach()))


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_mtp_loss_and_gradients_match_reference(name: str, detach: bool) -> None:
    """Per-depth MTP losses and MTP-layer gradients equal the reference; the trunk gets MTP gradient iff trained."""
    arch = _arch(name)
    batch = _batch()
    ref, want = reference_grads(arch, batch)
    model = build_arch(arch)
    _, report, got = patched_step(model, batch, detach)
    tol = _tolerance(arch)
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=tol)
    assert len(report.mtp_losses) == arch.depth
    worst = 0.0
    for name_, _ in mtp_params(model).items():
        assert rel_err(got[name_], want[name_]) <= tol, name_
        worst = max(worst, float((got[name_] - want[name_]).abs().max()))
    record_measurement(f"{name}: mtp grad max abs diff (detach={detach})", worst)
    _check_trunk(arch, model, batch, detach, got, want)


def _check_trunk(arch: Arch, model: Any, batch: Any, detach: bool, got: dict[str, Any], want: dict[str, Any]) -> None:
    tol = _tolerance(arch)
    if detach:  # the trunk's gradient is what a step without MTP gives: the routers' aux loss, else nothing
        _, _, baseline = patched_step(model, batch, detach, mtp_scale=0.0)
        for name_ in trunk_params(model):
            assert torch.equal(got[name_], baseline[name_]), name_
            if not arch.moe:
                assert torch.count_nonzero(got[name_]) == 0, name_
    else:
        for name_ in trunk_params(model):
            assert rel_err(got[name_], want[name_]) <= tol, name_
        assert any(torch.count_nonzero(got[n]) for n in trunk_params(model) if "router" not in n)


@pytest.mark.parametrize("name", MOE_ARCHS)
def test_routers_keep_their_aux_loss_gradient(name: str) -> None:
    """With detach_encoder=True every router (decoder and MTP layers) still gets its aux-loss gradient."""
    arch = _arch(name)
    model, batch = build_arch(arch), _batch()
    _, _, got = patched_step(model, batch, detach=True)
    routers = [n for n in got if n.endswith("router.weight")]
    assert any(n.startswith("decoder.") for n in routers) and any(n.startswith("mtp.") for n in routers)
    for router in routers:
        assert torch.count_nonzero(got[router]) > 0, router
    without_aux = build_arch(arch, moe_aux_loss_coeff=0.0)
    _, _, quiet = patched_step(without_aux, batch, detach=True)
    assert all(torch.count_nonzero(quiet[n]) == 0 for n in routers if n.startswith("decoder."))


@pytest.mark.parametrize("detach", [False, True], ids=["trunk", "detached"])
@pytest.mark.parametrize("name", MOE_ARCHS)
def test_padding_mask_reaches_the_mtp_layers(name: str, detach: bool) -> None:
    """With padding_mask passed, MoE routing in the MTP layers sees it as upstream's does: losses and grads equal."""
    arch = _arch(name)
    batch = _batch(padded=True)
    ref, want = reference_grads(arch, batch)
    model = build_arch(arch)
    logits, report, got = patched_step(model, batch, detach)
    assert torch.equal(logits, ref.logits.to(logits.dtype))
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=1e-5)
    for name_ in mtp_params(model):
        assert rel_err(got[name_], want[name_]) <= 1e-5, name_
    _check_trunk(arch, model, batch, detach, got, want)


@pytest.mark.parametrize("name", ["gqa_rope", "mla_moe"])
def test_no_attention_mask_uses_the_default_causal_mask(name: str) -> None:
    """attention_mask=None (upstream's default causal mask, as verl's packed path passes) gives the masked results."""
    arch = _arch(name)
    batch, masked = _batch(no_mask=True), _batch()
    ref, want = reference_grads(arch, batch)
    model = build_arch(arch)
    logits, report, got = patched_step(model, batch, detach=True)
    assert torch.equal(logits, ref.logits)
    assert torch.equal(logits, patched_step(model, masked, detach=True)[0])
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=1e-5)
    for name_ in mtp_params(model):
        assert rel_err(got[name_], want[name_]) <= 1e-5, name_


@pytest.mark.parametrize("name", list(ARCHS))
def test_every_module_is_restored_exactly(name: str) -> None:
    """After the block every module's and module class's attributes are the very objects they were before."""
    arch = _arch(name)
    model, batch = build_arch(arch), _batch()
    modules = list(model.modules())
    classes = list({type(m): None for m in modules})
    before = [dict(vars(m)) for m in modules]
    before_classes = [dict(vars(c)) for c in classes]
    upstream_out = _eval_forward(model, batch)
    with mtp_patched(model, detach_encoder=True):
        model(*batch.args(), **batch.kwargs())
    for obj, snap in [*zip(modules, before, strict=True), *zip(classes, before_classes, strict=True)]:
        now = vars(obj)
        assert now.keys() == snap.keys() and all(now[k] is snap[k] for k in snap), obj
    assert torch.equal(_eval_forward(model, batch), upstream_out)


def _eval_forward(model: Any, batch: Any) -> Any:
    """Upstream's own output in eval mode (upstream's MTP recompute, training only, raises on 0.18)."""
    model.eval()
    try:
        with torch.no_grad():
            return model(*batch.args(), **batch.kwargs())
    finally:
        model.train()


def _packed(batch: Any) -> Any:
    """The batch's two rows packed into one ``thd`` sequence (no attention mask)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    from tests.megatron.arch_models import ArchBatch

    rows, seq = batch.input_ids.shape
    cu = torch.arange(0, rows * seq + 1, seq, dtype=torch.int32)
    packing = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=seq, max_seqlen_kv=seq)
    flat = [t.reshape(1, -1) for t in (batch.input_ids, batch.position_ids)]
    labels, mask = batch.labels.reshape(1, -1), batch.loss_mask.reshape(1, -1)
    return ArchBatch(*flat, None, labels, mask, {"packed_seq_params": packing})


@pytest.mark.parametrize("name", ["moe", "mla_moe", "gqa_rope"])
def test_packed_sequences_equal_the_unpacked_batch(name: str) -> None:
    """Two sequences packed as thd (no attention mask) give the unpacked logits, MTP losses and MTP gradients."""
    from megatron.core.transformer import multi_token_prediction

    from patches.megatron._compat import parameters

    arch = _arch(name)
    if "packed_seq_params" not in parameters(multi_token_prediction.roll_tensor)[0]:
        pytest.skip(
            f"roll_tensor of megatron-core {MCORE} takes no packed_seq_params: MTP on packed sequences is 0.16+"
        )
    batch = _batch()
    ref, want = reference_grads(arch, batch)
    model, packed = build_arch(arch), _packed(batch)
    upstream_logits = reference(model, packed).logits  # upstream's main head on the pack (its losses roll per row)
    torch.testing.assert_close(upstream_logits.reshape(ref.logits.shape), ref.logits, rtol=1e-5, atol=1e-5)
    logits, report, got = patched_step(model, packed, detach=True)
    assert torch.equal(logits, upstream_logits)
    assert report.mtp_losses == pytest.approx([float(x.detach()) for x in ref.depth_losses], rel=1e-5)
    for name_ in mtp_params(model):
        assert rel_err(got[name_], want[name_]) <= 1e-5, name_
