"""Checks (``_checks``): refusals before any change, and what their messages say."""

from __future__ import annotations

from typing import Any

import pytest

from patchreg import Patch, PatchOwnershipError, Registry
from tests.patchreg import sample
from tests.patchreg.helpers import plain

M = "tests.patchreg.sample"


def test_revert_after_the_attribute_was_deleted_says_so(patch_registry: Registry, pristine: Any) -> None:
    """A revert that finds the patched attribute deleted meanwhile says it was deleted, and the remedy works."""
    original = vars(sample.Child)["method"]
    patch = Patch("f", f"{M}:Child.method", plain("ours"))
    patch_registry.apply(patch)
    del sample.Child.method
    with pytest.raises(PatchOwnershipError, match="was deleted meanwhile") as info:
        patch_registry.revert(patch)
    assert "someone patched over it" not in str(info.value)
    assert "method" not in vars(sample.Child)  # nothing was changed
    sample.Child.method = patch.backup.get(sample.Child)  # the remedy the message names
    assert sample.Child.method is original
    assert patch_registry.revert(patch) == 1
    pristine()


def test_revert_after_a_foreign_overwrite_says_someone_patched_over_it(patch_registry: Registry, pristine: Any) -> None:
    """A revert that finds another object installed over ours names that, not a deletion."""
    patch = Patch("f", f"{M}:module_func", plain("ours"))
    patch_registry.apply(patch)
    installed = sample.module_func
    sample.module_func = plain("theirs")  # type: ignore[assignment]
    with pytest.raises(PatchOwnershipError, match="someone patched over it"):
        patch_registry.revert(patch)
    sample.module_func = installed
    assert patch_registry.revert(patch) == 1
    pristine()
