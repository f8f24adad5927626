"""Foreign patchers on top of ours (mock, monkeypatch, raw wrapt, a second Registry), reverted before or after us."""

from __future__ import annotations

import unittest.mock
from collections.abc import Callable
from typing import Any

import pytest
import wrapt

from patchreg import Patch, PatchOwnershipError, Registry
from tests.reliability import targets
from tests.reliability.helpers import plain, tagging

T = "tests.reliability.targets"

Undo = Callable[[], None]


def _with_mock(holder: Any, attr: str) -> Undo:
    patcher = unittest.mock.patch.object(holder, attr, plain("mock"))
    patcher.start()
    return patcher.stop


def _with_monkeypatch(holder: Any, attr: str) -> Undo:
    mp = pytest.MonkeyPatch()
    mp.setattr(holder, attr, plain("monkeypatch"))
    return mp.undo


def _with_wrapt(holder: Any, attr: str) -> Undo:
    wrapper = wrapt.wrap_function_wrapper(holder, attr, lambda wrapped, instance, args, kwargs: "wrapt")

    def undo() -> None:
        setattr(holder, attr, wrapper.__wrapped__)

    return undo


def _with_registry(holder: Any, attr: str) -> Undo:
    other = Registry("foreign")
    if isinstance(holder, targets.Leaf):
        report = other.apply(Patch("foreign", attr, tagging("foreign"), kind="wrap"), holder)
    else:
        path = f"{T}:{attr}" if holder is targets else f"{T}:{holder.__qualname__}.{attr}"
        report = other.apply(Patch("foreign", path, tagging("foreign"), kind="wrap"))

    def undo() -> None:
        other.revert(report)

    return undo


FOREIGN = {"mock": _with_mock, "monkeypatch": _with_monkeypatch, "wrapt": _with_wrapt, "registry": _with_registry}


def _ours(which: str, leaf: targets.Leaf) -> tuple[Patch, Any, Any, str]:
    """Our patch, the object to apply it to, and the (holder, attribute) it lands on."""
    if which == "module function":
        return Patch("ours", f"{T}:module_func", tagging("ours"), kind="wrap"), None, targets, "module_func"
    if which == "class method":
        return Patch("ours", f"{T}:Child.method", plain("ours")), None, targets.Child, "method"
    if which == "inherited method":
        return Patch("ours", f"{T}:Child.inherited", plain("ours")), None, targets.Child, "inherited"
    return Patch("ours", "forward", plain("ours")), leaf, leaf, "forward"


KINDS = ["module function", "class method", "inherited method", "instance attribute"]


@pytest.mark.parametrize("which", KINDS)
@pytest.mark.parametrize("foreign", sorted(FOREIGN))
def test_foreign_reverted_before_us(
    patch_registry: Registry, pristine: Callable[[], None], foreign: str, which: str
) -> None:
    """A foreign patch applied after ours and undone before ours leaves our revert exact."""
    leaf = targets.Leaf()
    patch, obj, holder, attr = _ours(which, leaf)
    report = patch_registry.apply(patch, obj)
    undo = FOREIGN[foreign](holder, attr)
    undo()
    assert patch_registry.revert(report) == 1
    assert patch_registry.active() == ()
    assert set(vars(leaf)) == {"tag"}


@pytest.mark.parametrize("which", KINDS)
@pytest.mark.parametrize("foreign", sorted(FOREIGN))
def test_foreign_reverted_after_us(
    patch_registry: Registry, pristine: Callable[[], None], foreign: str, which: str
) -> None:
    """Our revert under a foreign patch raises PatchOwnershipError, changes nothing, and succeeds once it is gone."""
    leaf = targets.Leaf()
    patch, obj, holder, attr = _ours(which, leaf)
    report = patch_registry.apply(patch, obj)
    undo = FOREIGN[foreign](holder, attr)
    foreign_value = vars(holder)[attr]
    with pytest.raises(
        PatchOwnershipError, match=r"someone patched over it|installed over it through another registry"
    ) as info:
        patch_registry.revert(report)
    assert "ours" in str(info.value) and attr in str(info.value)
    assert vars(holder)[attr] is foreign_value, "our failed revert changed the attribute"
    assert [e.count for e in patch_registry.active()] == [1]
    assert holder in patch.backup
    undo()
    assert patch_registry.revert(report) == 1
    assert patch_registry.active() == ()
    assert set(vars(leaf)) == {"tag"}


def test_foreign_patch_under_ours_is_kept(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """A mock installed before our block comes back as the mock when the block ends, then mock restores its own."""
    with unittest.mock.patch.object(targets.Child, "method", plain("mock")):
        mocked = vars(targets.Child)["method"]
        with patch_registry.patched(Patch("ours", f"{T}:Child.method", tagging("ours"), kind="wrap")):
            assert targets.Child().method() == ("ours", "mock")
        assert vars(targets.Child)["method"] is mocked


def test_revert_all_under_foreign_patch(patch_registry: Registry, pristine: Callable[[], None]) -> None:
    """revert_all() under a foreign patch refuses that attribute and keeps its record for a later revert_all()."""
    patch_registry.apply(Patch("ours", f"{T}:Child.method", plain("ours")))
    with unittest.mock.patch.object(targets.Child, "method", plain("mock")):
        with pytest.raises(PatchOwnershipError):
            patch_registry.revert_all()
        assert len(patch_registry.active()) == 1
    assert patch_registry.revert_all() == 1
