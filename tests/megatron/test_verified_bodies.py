"""The MTP patches' declared upstream bodies: the installed release's are the ones they were verified against."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import patchreg
from patches.megatron._native import native
from patches.megatron.mtp import HYBRID_MTP_DETACH_SET, HYBRID_MTP_SET, MTP_DETACH_SET, MTP_FIXUPS_SET, MTP_SET
from tests.megatron.conftest import MCORE, build_gpt, make_batch
from tests.megatron.hybrid_models import hybrid_skip_reason

SETS = (MTP_SET, MTP_DETACH_SET, HYBRID_MTP_SET, HYBRID_MTP_DETACH_SET, MTP_FIXUPS_SET)
ALL = {p.name: p for s in SETS for p in s}
PATCHES = {name: p for name, p in ALL.items() if p.verified is not None}
DECLARED = ("postprocess", "postprocess_detached", "detach_embeddings", "checkpointed_forward")
#: The HybridModel / MambaModel patches that replace or take over an upstream body they depend on.
HYBRID_DECLARED = (
    "hybrid_forward",
    "hybrid_forward_detached",
    "hybrid_mtp_loss",
    "mamba_mtp_loss",
    "mtp_input_detached",
)


@pytest.mark.no_distributed
@pytest.mark.parametrize(
    "names",
    [DECLARED, HYBRID_DECLARED, ("packed_padded_roll", "packed_padded_roll_gpt")],
    ids=["gpt", "hybrid", "fixups"],
)
def test_the_mtp_patches_declare_their_upstream_bodies(names: tuple[str, ...]) -> None:
    """The GPTModel and HybridModel / MambaModel MTP patches and the fix-ups each declare the megatron-core body they
    were verified against."""
    assert set(names) <= ALL.keys()
    assert set(names) <= PATCHES.keys(), sorted(set(names) - PATCHES.keys())
    assert all(PATCHES[name].verified.distribution == "megatron-core" for name in names)  # type: ignore[union-attr]


@pytest.mark.no_distributed
@pytest.mark.parametrize("name", sorted(PATCHES))
def test_each_mtp_patch_declares_a_body_verified_on_this_release(name: str) -> None:
    """Where an MTP patch that declares its upstream body applies here, that body is one it was verified against."""
    patch = PATCHES[name]
    assert patch.verified is not None
    if not patch.when.evaluate().ok:
        pytest.skip(f"{name} does not install on megatron-core {MCORE}: {patch.when.evaluate().reason}")
    found = patchreg.drift(patch.verified)
    assert found.ok, found.text
    assert found.text.startswith("verified against this body")


@pytest.mark.no_distributed
def test_the_hybrid_forward_declaration_names_the_body_hybrid_models_run() -> None:
    """hybrid_forward's declared path (MambaModel.forward) is HybridModel.forward wherever HybridModel exists."""
    if hybrid_skip_reason() is not None:
        pytest.skip(str(hybrid_skip_reason()))
    from patches.megatron._models import HYBRID
    from patchreg._drift import resolve

    declared = resolve(ALL["hybrid_forward"].verified.path)  # type: ignore[union-attr]
    try:
        hybrid = resolve(f"{HYBRID}:HybridModel.forward")
    except ImportError:  # 0.17: no HybridModel, MambaModel's own forward is the one declared
        return
    assert declared is hybrid


def test_the_mtp_report_says_verified() -> None:
    """mtp_patched's report carries the drift line of every installed patch that declares one."""
    from patches.megatron import mtp_patched

    model, batch = build_gpt(), make_batch()
    with mtp_patched(model, detach_encoder=True) as report:
        model(*batch.args(), **batch.kwargs())
        drift = dict(report.report.drift)
    declared = "rl_mode_mtp_loss" if native() else "postprocess_detached"  # 0.19.2: upstream's process_mtp_loss
    assert declared in drift and all(d.ok for d in drift.values())
    assert f"verified {declared}" in str(report.report)


@pytest.mark.parametrize("detach", [False, True])
def test_the_hybrid_mtp_report_says_verified(detach: bool) -> None:
    """On a HybridModel / MambaModel, the report's drift lines cover the hybrid patches it installed, all verified."""
    if hybrid_skip_reason() is not None:
        pytest.skip(str(hybrid_skip_reason()))
    from patches.megatron import mtp_patched
    from tests.megatron.hybrid_models import build_hybrid

    model, batch = build_hybrid(), make_batch()
    with mtp_patched(model, detach_encoder=detach) as report:
        model(*batch.args(), **batch.kwargs())
        drift = dict(report.report.drift)
        text = str(report.report)
    forward = "hybrid_forward_detached" if detach else "hybrid_forward"
    loss = {e.patch for e in report.entries} & {"hybrid_mtp_loss", "mamba_mtp_loss", "rl_mode_hybrid_mtp_loss"}
    expected = {forward, *loss} | ({"mtp_input_detached"} if detach else set())
    if native():  # 0.19.2: the native route replaces no body; its loss wrap declares upstream's process_mtp_loss
        expected = {"rl_mode_hybrid_mtp_loss"}
    assert len(loss) == 1 and expected <= drift.keys(), sorted(drift)
    assert all(d.ok for d in drift.values()), [d.text for d in drift.values() if not d.ok]
    assert all(f"verified {name}" in text for name in expected)
