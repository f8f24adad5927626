"""The state's records (patchreg._ledger): layers hold instances weakly, stacks name their holder, reports and lazy
patches read them, plans match only the objects they were made for."""

from __future__ import annotations

import gc
import weakref

from patchreg import Patch, PatchSet, Registry, Report
from patchreg._ledger import Layer, Plan
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


def test_a_backup_reads_the_live_installs_of_every_registry_newest_last() -> None:
    """A patch's backup lists the originals of its live installs in any registry, and nothing once they are reverted."""
    first, second = Registry("a"), Registry("b")
    flag = Patch("flag", f"{ks.M}:FLAG", True, kind="value")
    one = first.apply(flag)
    two = second.apply(flag)
    assert flag.backup.get(ks) is True and len(flag.backup) == 1 and ks in flag.backup  # b's: over a's install
    assert [la.owner.name for la in flag.backup.layers()] == ["a", "b"]
    second.revert(two)
    assert flag.backup.get(ks) is False  # a's: the module's own value
    first.revert(one)
    assert flag.backup.layers() == [] and flag.backup.get(ks, "none") == "none"


def test_a_plan_matches_only_the_objects_it_was_made_for() -> None:
    """A plan kept for a set on one model is not the plan of an equal set, of another model, or of chunks."""
    registry, model, other = Registry("t"), _Model(), _Model()
    patch_set = PatchSet("s", [FORWARD])
    registry.revert(registry.apply(patch_set, model))
    plan = registry._book.plan_for(patch_set, model)
    assert isinstance(plan, Plan) and plan.matches(patch_set, model)
    assert not plan.matches(PatchSet("s", [FORWARD]), model) and not plan.matches(patch_set, other)
    assert not plan.matches(patch_set, [model])
