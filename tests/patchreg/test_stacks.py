"""The store's records (patchreg._stacks): layers hold instances weakly, stacks name their holder, reports read them."""

from __future__ import annotations

import gc
import weakref

from patchreg import Patch, Registry, Report
from patchreg._stacks import STORES, Layer, originals
from tests.patchreg import kinds_sample as ks


class _Model:
    """An object with a method, patched per instance."""

    def forward(self) -> str:
        return "upstream"


def _forward(self: _Model) -> str:
    return "patched"


FORWARD = Patch("forward", "forward", _forward)


def test_an_instance_layer_holds_neither_the_instance_nor_its_install_strongly() -> None:
    """A layer on an instance owns what it installed by weak reference: dropping the model frees it, patch or no."""
    registry, model = Registry("t"), _Model()
    report = registry.apply(FORWARD, model)
    (layer,) = report.layers
    assert isinstance(layer, Layer) and layer.owns(vars(model)["forward"]) and not layer.owns(_forward)
    seen = weakref.ref(model)
    del model
    gc.collect()
    assert seen() is None and layer.stack.ref() is None and not layer.owns(None)


def test_a_stack_names_its_holder_by_path_then_label() -> None:
    """A stack reads ``model`` (its path from the object applied on) once named, and an item's mapping its import path."""
    registry, model = Registry("t"), _Model()
    with registry.patched(FORWARD, model) as report:
        assert report.layers[0].stack.where == "model.forward"
    item = Patch("item", f"{ks.M}:TABLE", "mine", kind="item", key="mtp", create=True)
    with registry.patched(item) as report:
        assert report.layers[0].stack.where == f"{ks.M}:TABLE['mtp']"


def test_a_report_is_readable_after_its_release() -> None:
    """A report's entries show count 0 and state 'reverted' after its block, and it holds nothing then."""
    registry, model = Registry("t"), _Model()
    with registry.patched(FORWARD, model) as report:
        assert isinstance(report, Report) and report.held == 1 and not report.reverted
    assert report.reverted and report.held == 0 and [e.state for e in report.entries] == ["reverted"]
    assert "(reverted)" in str(report)


def test_every_registry_is_listed_weakly_and_originals_come_from_all_of_them() -> None:
    """A patch's originals are found through every live registry's store, and a registry dropped leaves the list."""
    first, second = Registry("a"), Registry("b")
    flag = Patch("flag", f"{ks.M}:FLAG", True, kind="value")
    report = first.apply(flag)
    try:
        assert originals(flag) == [(ks, False)] and len([s for s in STORES if s.owner() is second]) == 1
    finally:
        first.revert(report)
    assert originals(flag) == []
    del second
    gc.collect()
    assert all(s.owner() is not None for s in STORES)
