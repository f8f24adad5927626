"""Checks (``_checks``): refusals before any change, and what their messages say."""

from __future__ import annotations

from typing import Any

import pytest

from patchreg import Patch, PatchConflictError, PatchOwnershipError, Registry
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


def test_two_values_on_one_attribute_are_not_told_to_wrap(patch_registry: Registry, pristine: Any) -> None:
    """Two kind='value' patches on one attribute conflict with a remedy for values (keep one), not kind='wrap'."""
    first = Patch("flag-a", f"{M}:module_func", 1, kind="value")
    patch_registry.apply(first)
    with pytest.raises(PatchConflictError) as info:
        patch_registry.apply(Patch("flag-b", f"{M}:module_func", 2, kind="value"))
    text = str(info.value)
    assert "kind='wrap' patch (wraps stack)" not in text
    assert "'flag-b'" in text and "'flag-a'" in text and "a value patch does not stack" in text
    assert "keep one of the two" in text
    patch_registry.revert(first)
    pristine()


def test_two_function_replaces_are_still_told_a_wrap_stacks(patch_registry: Registry, pristine: Any) -> None:
    """Two kind='replace' patches of one function conflict, and the remedy names kind='wrap'."""
    first = Patch("f-a", f"{M}:module_func", plain("a"))
    patch_registry.apply(first)
    with pytest.raises(PatchConflictError, match=r"make one a kind='wrap' patch \(wraps stack\)"):
        patch_registry.apply(Patch("f-b", f"{M}:module_func", plain("b")))
    patch_registry.revert(first)
    pristine()
