"""Garbage: patched-and-reverted objects die by reference counting; the registry never keeps an object alive."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from patchreg import Patch, PatchSet, Registry
from tests.reliability import targets
from tests.reliability.helpers import Figures, plain, tagging

T = "tests.reliability.targets"
N = 1000

TREE_SET = PatchSet(
    "tree",
    [
        Patch("blocks-forward", "blocks[*].forward", plain("fw")),
        Patch("head-backward", "head.backward", tagging("bw"), kind="wrap"),
        Patch("head-tag", "head.tag", plain("tag")),
        Patch("global-method", f"{T}:Child.method", tagging("g"), kind="wrap"),
    ],
)


@pytest.fixture
def gc_disabled() -> Iterator[None]:
    """Turn the cyclic collector off, so only reference counting can free objects."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _ways(reg: Registry) -> dict[str, Callable[[targets.Tree], None]]:
    def block(tree: targets.Tree) -> None:
        with reg.patched(TREE_SET, tree):
            assert tree.blocks[0].forward(1) == "fw"

    def by_report(tree: targets.Tree) -> None:
        reg.revert(reg.apply(TREE_SET, tree))

    def by_set(tree: targets.Tree) -> None:
        reg.apply(TREE_SET, tree)
        reg.apply(TREE_SET, tree)
        reg.revert(TREE_SET, tree)
        reg.revert(TREE_SET, tree)

    def by_revert_all(tree: targets.Tree) -> None:
        reg.apply(TREE_SET, tree)
        reg.revert_all()

    return {"block": block, "report": by_report, "set": by_set, "revert_all": by_revert_all}


@pytest.mark.parametrize("way", ["block", "report", "set", "revert_all"])
def test_patch_revert_drop_frees_all_with_gc_disabled(
    patch_registry: Registry, pristine: Callable[[], None], gc_disabled: None, figures: Figures, way: str
) -> None:
    """1,000 trees patched and reverted (block, report, set, revert_all) are all freed by refcounting alone."""
    revert = _ways(patch_registry)[way]
    refs = []
    for _ in range(N):
        tree = targets.Tree(3)
        revert(tree)
        refs.append(weakref.ref(tree))
        refs.extend(weakref.ref(leaf) for leaf in (*tree.blocks, tree.head))
        del tree
    alive = sum(ref() is not None for ref in refs)
    assert alive == 0, f"{alive} of {len(refs)} objects kept alive after revert"
    assert patch_registry.active() == ()
    assert all(len(p.backup) == 0 for p in TREE_SET)
    figures.add("garbage.objects_freed_gc_disabled", len(refs))


def test_drop_while_patched_not_kept_alive(patch_registry: Registry, figures: Figures) -> None:
    """1,000 leaves dropped while patched are collected and vanish from active() and from the backups."""
    patches = PatchSet("leaf", [Patch("fw", "forward", plain(1)), Patch("bw", "backward", tagging("b"), kind="wrap")])
    refs = []
    for _ in range(N):
        leaf = targets.Leaf()
        patch_registry.apply(patches, leaf)
        refs.append(weakref.ref(leaf))
        del leaf
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0
    assert patch_registry.active() == ()
    assert all(len(p.backup) == 0 for p in patches)
    assert "nothing active" in patch_registry.summary()
    figures.add("garbage.objects_freed_while_patched", len(refs))


@pytest.mark.parametrize("stack", ["wrap over replace", "wrap over wrap", "same replace, two registries"])
def test_drop_with_stacked_layers_not_kept_alive(stack: str) -> None:
    """Two layers on one instance attribute (one registry or two) do not keep a dropped instance alive."""
    lower, upper = Registry("lower"), Registry("upper")
    replace, wrap = Patch("fw", "forward", plain(1)), Patch("w", "forward", tagging("w"), kind="wrap")
    first, second = {
        "wrap over replace": (replace, wrap),
        "wrap over wrap": (Patch("w0", "forward", tagging("w0"), kind="wrap"), wrap),
        "same replace, two registries": (replace, replace),
    }[stack]
    leaf = targets.Leaf()
    lower.apply(first, leaf)
    report = upper.apply(second, leaf)
    if stack == "same replace, two registries":
        assert len(upper.active()) == 1 and report.installed == 1  # the very object the lower one installed
    ref = weakref.ref(leaf)
    del leaf
    gc.collect()
    assert ref() is None
    assert lower.active() == () and upper.active() == ()


def test_drop_while_patched_non_binding_freed_by_refcount(patch_registry: Registry, gc_disabled: None) -> None:
    """An instance attribute replaced by a plain value (no bound method, so no cycle) dies by refcount while patched."""
    leaf = targets.Leaf()
    report = patch_registry.apply(Patch("tag", "tag", plain("t")), leaf)
    ref = weakref.ref(leaf)
    del leaf
    assert ref() is None
    assert patch_registry.active() == ()
    assert patch_registry.revert(report) == 0


def test_report_outlives_dropped_object(patch_registry: Registry) -> None:
    """Reverting a report whose object died is a no-op that returns 0, and the object is not resurrected."""
    leaf = targets.Leaf()
    report = patch_registry.apply(Patch("fw", "forward", plain(1)), leaf)
    ref = weakref.ref(leaf)
    del leaf
    gc.collect()
    assert ref() is None
    assert patch_registry.revert(report) == 0
    assert patch_registry.active() == ()


def test_reused_id_is_a_new_object(patch_registry: Registry) -> None:
    """A new object that reuses a dead patched object's id is unpatched, patchable and restored exactly."""
    patch = Patch("fw", "forward", plain("patched"))
    leaf = targets.Leaf("old")
    patch_registry.apply(patch, leaf)
    old_id = id(leaf)
    del leaf
    gc.collect()
    fresh: list[Any] = []
    reused = None
    for _ in range(20000):
        candidate = targets.Leaf("new")
        if id(candidate) == old_id:
            reused = candidate
            break
        fresh.append(candidate)
    if reused is None:
        pytest.skip("the allocator did not hand out the dead object's address again in 20,000 tries")
    assert reused.forward(1) == ("new", 1)
    assert not patch_registry.is_active("fw", reused)
    with patch_registry.patched(patch, reused):
        assert reused.forward(1) == "patched"
        assert [e.count for e in patch_registry.active()] == [1]
    assert vars(reused) == {"tag": "new"}
    assert patch_registry.active() == ()
