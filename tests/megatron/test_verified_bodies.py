"""The MTP patches' declared upstream bodies: the installed release's are the ones they were verified against."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import patchreg
from patches.megatron.mtp import MTP_DETACH_SET, MTP_SET
from tests.megatron.conftest import MCORE, build_gpt, make_batch

PATCHES = {p.name: p for p in (*MTP_SET, *MTP_DETACH_SET) if p.verified is not None}
DECLARED = ("postprocess", "postprocess_detached", "detach_embeddings", "checkpointed_forward")


@pytest.mark.no_distributed
def test_the_gpt_mtp_patches_declare_their_upstream_bodies() -> None:
    """The GPTModel MTP patches each declare the megatron-core body they were verified against."""
    assert set(DECLARED) <= PATCHES.keys()
    assert all(PATCHES[name].verified.distribution == "megatron-core" for name in DECLARED)  # type: ignore[union-attr]


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


def test_the_mtp_report_says_verified() -> None:
    """mtp_patched's report carries the drift line of every installed patch that declares one."""
    from patches.megatron import mtp_patched

    model, batch = build_gpt(), make_batch()
    with mtp_patched(model, detach_encoder=True) as report:
        model(*batch.args(), **batch.kwargs())
        drift = dict(report.report.drift)
    assert "postprocess_detached" in drift and all(d.ok for d in drift.values())
    assert "verified postprocess_detached" in str(report.report)
