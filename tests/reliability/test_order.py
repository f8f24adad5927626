"""Out-of-order exits of nested contexts on the same targets: a clear error, nothing lost, and a way back."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest

from patchreg import Patch, PatchOwnershipError, PatchSet, Registry
from tests.reliability import targets
from tests.reliability.helpers import plain, tagging

T = "tests.reliability.targets"


def _outer_inner() -> tuple[PatchSet, PatchSet]:
    outer = PatchSet(
        "outer",
        [
            Patch("o-method", f"{T}:Child.method", tagging("outer"), kind="wrap"),
            Patch("o-func", f"{T}:module_func", plain("outer")),
        ],
    )
    inner = PatchSet("inner", [Patch("i-method", f"{T}:Child.method", tagging("inner"), kind="wrap")])
    return outer, inner


def test_exit_outer_first_refused_then_retry(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """Exiting the outer block first raises naming both patches, changes nothing, and the same exit works later."""
    outer, inner = _outer_inner()
    cm_outer, cm_inner = patch_registry.patched(outer), patch_registry.patched(inner)
    cm_outer.__enter__()
    cm_inner.__enter__()
    method = vars(targets.Child)["method"]
    with pytest.raises(PatchOwnershipError, match="reverse order") as info:
        cm_outer.__exit__(None, None, None)
    assert "o-method" in str(info.value) and "i-method" in str(info.value)
    assert vars(targets.Child)["method"] is method
    assert targets.module_func(0) == "outer"
    assert targets.Child().method() == ("inner", ("outer", "method"))
    cm_inner.__exit__(None, None, None)
    cm_outer.__exit__(None, None, None)
    assert patch_registry.active() == ()


def test_exit_stack_misuse_recovers_by_report(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """Closing an ExitStack that holds the outer block first fails cleanly; reverting its report later restores."""
    outer, inner = _outer_inner()
    first, second = contextlib.ExitStack(), contextlib.ExitStack()
    report = first.enter_context(patch_registry.patched(outer))
    second.enter_context(patch_registry.patched(inner))
    with pytest.raises(PatchOwnershipError):
        first.close()
    assert {e.patch for e in patch_registry.active()} == {"o-method", "o-func", "i-method"}
    second.close()
    assert patch_registry.revert(report) == 2
    assert patch_registry.active() == ()


def test_shared_patch_out_of_order_is_fine(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """Two blocks of the same patch may exit in any order: only the count changes until the last exit."""
    patch = Patch("shared", f"{T}:Child.method", plain("shared"))
    cm_a, cm_b = patch_registry.patched(patch), patch_registry.patched(patch)
    cm_a.__enter__()
    cm_b.__enter__()
    cm_a.__exit__(None, None, None)
    assert targets.Child().method() == "shared"
    assert [e.count for e in patch_registry.active()] == [1]
    cm_b.__exit__(None, None, None)


def test_same_block_object_nested_unwinds_lifo(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """One patched() object entered twice (re-entrant) unwinds in order with exact counts."""
    _outer, inner = _outer_inner()
    block = patch_registry.patched(inner)
    with block:
        with block:
            assert [e.count for e in patch_registry.active()] == [2]
        assert [e.count for e in patch_registry.active()] == [1]
    assert patch_registry.active() == ()


def test_exit_outer_first_with_body_exception(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """An out-of-order exit during exception unwinding raises the ownership error chained to the body's error."""
    outer, inner = _outer_inner()
    cm_outer, cm_inner = patch_registry.patched(outer), patch_registry.patched(inner)
    cm_outer.__enter__()
    cm_inner.__enter__()
    try:
        raise ValueError("body")
    except ValueError as body:
        with pytest.raises(PatchOwnershipError) as info:
            cm_outer.__exit__(type(body), body, body.__traceback__)
        assert isinstance(info.value.__context__, ValueError)
    cm_inner.__exit__(None, None, None)
    cm_outer.__exit__(None, None, None)
    assert patch_registry.active() == ()
