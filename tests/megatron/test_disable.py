"""PATCHREG_DISABLE on the MTP block: a disabled postprocess refuses, a disabled side patch is skipped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import patchreg
from patches.megatron import mtp_patched
from tests.megatron.conftest import build_gpt, make_batch


@pytest.fixture
def disable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Set PATCHREG_DISABLE and re-read it; unset and re-read after the test."""

    def set_to(value: str) -> None:
        monkeypatch.setenv("PATCHREG_DISABLE", value)
        patchreg.refresh()

    yield set_to
    monkeypatch.delenv("PATCHREG_DISABLE", raising=False)
    patchreg.refresh()


@pytest.mark.parametrize(("value", "detach"), [("megatron-mtp.postprocess", False), ("postprocess_detached", True)])
def test_mtp_patched_refuses_without_its_postprocess(disable: Callable[[str], None], value: str, detach: bool) -> None:
    """mtp_patched refuses to enter when its postprocess is disabled, naming the variable; nothing is installed."""
    model = build_gpt()
    disable(value)
    for _ in range(3):
        refused = pytest.raises(patchreg.PatchError, match="disabled by PATCHREG_DISABLE")
        with refused, mtp_patched(model, detach_encoder=detach):
            pass  # pragma: no cover
    assert not patchreg.registry.is_active("postprocess")
    assert "_postprocess" not in vars(model)


@pytest.mark.usefixtures("todays_route")  # detach_embeddings is a side patch of today's route (0.19.2: not needed)
def test_mtp_patched_skips_a_disabled_side_patch(disable: Callable[[str], None]) -> None:
    """A disabled non-essential patch is skipped (the block runs, the report says why)."""
    model, batch = build_gpt(), make_batch()
    disable("megatron-mtp-detached.detach_embeddings")
    with mtp_patched(model, detach_encoder=True) as report:
        model(*batch.args(), **batch.kwargs())
        assert patchreg.registry.is_active("postprocess_detached", model)
        assert not patchreg.registry.is_active("detach_embeddings", model)
    assert ("detach_embeddings", "disabled by PATCHREG_DISABLE") in report.report.skipped
