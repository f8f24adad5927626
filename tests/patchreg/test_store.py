"""The store (patchreg._store): the only writer; plans kept per registry, the one-pass path and the general one."""

from __future__ import annotations

from patchreg import Patch, PatchSet, Registry
from patchreg._store import Store


class _Layer:
    """A layer of a model (weakly referenceable, with a __dict__)."""

    def forward(self) -> str:
        return "upstream"


class _Model:
    """A model holding its layers in a plain attribute."""

    def __init__(self) -> None:
        self.head = _Layer()


def _forward(self: _Layer) -> str:
    return "patched"


SET = PatchSet("head", [Patch("forward", "head.forward", _forward)])


def _cycle(registry: Registry, model: _Model) -> None:
    with registry.patched(SET, model):
        assert model.head.forward() == "patched"
    assert "forward" not in vars(model.head)


def test_a_plan_is_kept_from_the_second_apply_and_found_first() -> None:
    """The store keeps a plan after the second apply of a set on one object, and finds it as the one used last."""
    registry, model = Registry("t"), _Model()
    store: Store = registry._installs
    _cycle(registry, model)
    assert store.plan_for(SET, model) is None
    _cycle(registry, model)
    plan = store.plan_for(SET, model)
    assert plan is not None and store.last is plan and plan.fast is not None
    assert store.plan_for(SET, _Model()) is None


def test_a_warm_block_takes_the_one_pass_way_and_releases_it() -> None:
    """From the third enter the store installs in one pass (a clean report) released in one pass; a shared one is not."""
    registry, model = Registry("t"), _Model()
    for _ in range(2):
        _cycle(registry, model)
    general: list[int] = []
    original = Store._release
    Store._release = lambda self, ledger: general.append(1) or original(self, ledger)  # type: ignore[method-assign]
    try:
        with registry.patched(SET, model) as report:
            assert report.clean and report.installed == 1
        assert report.released and general == []
        outer = registry.apply(SET, model)  # shared with an outer apply: not clean, released the general way
        with registry.patched(SET, model) as report:
            assert not report.clean and report.installed == 0
        assert general  # (its exit, and the put-back of the one-pass try that found the install shared)
        registry.revert(outer)
    finally:
        Store._release = original  # type: ignore[method-assign]
    assert registry.active() == () and "forward" not in vars(model.head)


def test_a_plan_is_forgotten_with_its_object() -> None:
    """A plan goes with the object it was made for, also as the one used last."""
    import gc

    registry, model = Registry("t"), _Model()
    store: Store = registry._installs
    for _ in range(2):
        _cycle(registry, model)
    assert store.plans
    del model
    gc.collect()
    assert store.plans == {} and store.last is None


def test_again_marks_a_key_and_is_bounded() -> None:
    """again() says False the first time a key is seen, True the second, and forgets all past its limit."""
    store = Registry("t")._installs
    assert store.again((1, 2), 2) is False and store.again((1, 2), 2) is True
    store.again((3, 4), 2)
    assert store.again((5, 6), 2) is False and store.seen == {(5, 6): None}
