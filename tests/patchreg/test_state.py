"""The state (patchreg._state): the only writer. One install loop and one release loop over a plan's steps, first
apply or hundredth; one stack per attribute for every registry; plans kept per registry while their objects live."""

from __future__ import annotations

import gc
import weakref

import patchreg
from patchreg import Patch, PatchOwnershipError, PatchSet, Registry
from patchreg._state import STACKS, check_release, take


class _Layer:
    """A layer of a model (weakly referenceable, with a __dict__)."""

    def forward(self) -> str:
        return "upstream"


class _Model:
    """A model holding its layer in a plain attribute."""

    def __init__(self) -> None:
        self.head = _Layer()


def _forward(self: _Layer) -> str:
    return "patched"


SET = PatchSet("head", [Patch("forward", "head.forward", _forward)])


def test_the_first_apply_keeps_the_plan_the_second_takes_the_same_loop() -> None:
    """The first apply keeps its plan; the next finds it first and installs the same way (the same layer shape)."""
    registry, model = Registry("t"), _Model()
    first = registry.apply(SET, model)
    plan = registry._book.plan_for(SET, model)
    registry.revert(first)
    assert plan is not None and registry._book.last is plan
    second = registry.apply(SET, model)
    assert registry._book.plan_for(SET, model) is plan
    assert [(la.patch, la.stack) for la in first.layers] == [(la.patch, la.stack) for la in second.layers]
    registry.revert(second)
    assert "forward" not in vars(model.head)


def test_one_stack_per_attribute_holds_every_registrys_layers() -> None:
    """Two registries' installs on one attribute are two layers of one stack, the later on top."""
    one, two, model = Registry("one"), Registry("two"), _Model()
    a = one.apply(Patch("w1", "head.forward", lambda w, i, a, k: ("w1", w()), kind="wrap"), model)
    b = two.apply(Patch("w2", "head.forward", lambda w, i, a, k: ("w2", w()), kind="wrap"), model)
    (stack,) = {la.stack for la in (*a.layers, *b.layers)}
    assert STACKS[stack.key] is stack and [la.owner.name for la in stack.layers] == ["one", "two"]
    assert model.head.forward() == ("w2", ("w1", "upstream"))
    two.revert(b)
    one.revert(a)
    assert stack.layers == [] and "forward" not in vars(model.head)


def test_a_stale_step_changes_nothing_and_the_apply_resolves_again() -> None:
    """A step whose holder changed class since the plan makes the loop refuse before any change (False), and the
    apply resolves again and patches what a new resolution finds."""
    registry, model = Registry("t"), _Model()
    registry.revert(registry.apply(SET, model))
    plan = registry._book.plan_for(SET, model)
    assert plan is not None
    model.head.__class__ = type("Other", (_Layer,), {})
    report = patchreg.Report(registry, "head", ())
    with patchreg._state.LOCK:  # type: ignore[attr-defined]
        assert take(registry._book, plan.steps, report) is False
    assert report.layers == [] and "forward" not in vars(model.head)
    with registry.patched(SET, model):
        assert model.head.forward() == "patched"


def test_the_ownership_rule_checks_a_batch_before_any_restore() -> None:
    """Releasing an inner layer before the one over it is refused for the whole batch, and nothing changes."""
    registry, model = Registry("t"), _Model()
    lower = registry.apply(Patch("lower", "head.forward", lambda w, i, a, k: "lower", kind="wrap"), model)
    upper = registry.apply(Patch("upper", "head.forward", lambda w, i, a, k: "upper", kind="wrap"), model)
    try:
        check_release(upper.layers + lower.layers)  # top first: allowed
        try:
            check_release(lower.layers)
        except PatchOwnershipError as exc:
            assert "before patch 'upper'" in str(exc)
        else:
            raise AssertionError("the lower layer was releasable under the upper one")
        assert model.head.forward() == "upper"
    finally:
        registry.revert(upper)
        registry.revert(lower)


def test_a_plan_goes_with_its_object() -> None:
    """A kept plan holds its object weakly: the object dropped, the plan is forgotten with it."""
    registry, model = Registry("t"), _Model()
    registry.revert(registry.apply(SET, model))
    seen = weakref.ref(model)
    del model
    gc.collect()
    assert seen() is None and registry._book.plans == {} and registry._book.last is None


def test_a_registry_gone_leaves_its_installs_in_place_and_forgotten() -> None:
    """A registry dropped with an install left: the attribute keeps it, and another registry installs over it."""
    model = _Model()
    gone = Registry("gone")
    gone.apply(Patch("p", "head.forward", _forward), model)
    del gone
    gc.collect()
    other = Registry("other")
    with other.patched(Patch("w", "head.forward", lambda w, i, a, k: ("w", w()), kind="wrap"), model):
        assert model.head.forward() == ("w", "patched")
    assert model.head.forward() == "patched"
