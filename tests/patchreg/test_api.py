"""The module-level API (in patchreg._registry): apply, revert and patched go through the default registry."""

from __future__ import annotations

import patchreg
from patchreg import Patch
from tests.patchreg import kinds_sample as ks

FLAG = Patch("api-flag", f"{ks.M}:FLAG", True, kind="value")


def test_apply_and_revert_use_the_default_registry() -> None:
    """patchreg.apply installs through patchreg.registry, and patchreg.revert of its report restores."""
    report = patchreg.apply(FLAG)
    try:
        assert ks.FLAG is True and report.owner is patchreg.registry and patchreg.registry.is_active("api-flag")
    finally:
        assert patchreg.revert(report) == 1
    assert ks.FLAG is False and not patchreg.registry.is_active("api-flag")


def test_patched_is_a_block_of_the_default_registry() -> None:
    """patchreg.patched is the default registry's block, as a context manager and as a decorator."""
    with patchreg.patched(FLAG) as report:
        assert ks.FLAG is True and report.installed == 1

    @patchreg.patched(FLAG)
    def inside() -> bool:
        return bool(ks.FLAG)

    assert inside() is True and ks.FLAG is False
