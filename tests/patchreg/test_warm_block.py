"""A warm block (a kept plan re-used) for every kind of install it makes: a value on an instance (over its own value
too), a wrap on an instance, and an import path's module or class attribute installed again. Each restores exactly as
the first apply does, and binds again (or resolves again) where what the plan read has changed."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from patchreg import Patch, PatchError, PatchSet, Registry


def _loss(x: int) -> int:
    return x + 1


class _Klass:
    def run(self) -> str:
        return "upstream"


class _Head:
    def forward(self) -> str:
        return "upstream"


class _Config:
    flag: Any = "class default"


class _Model:
    def __init__(self) -> None:
        self.head = _Head()
        self.config = _Config()
        self.config.flag = ["own value"]  # an object of its own: restored by identity


def _times_ten(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return wrapped(*args, **kwargs) * 10


def _wrapped_forward(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return "wrapped " + wrapped(*args, **kwargs)


def _run(self: _Klass) -> str:
    return "patched"


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    """A real module in sys.modules, with a function and a class, gone after the test."""
    name = "patchreg_warm_block_target"
    mod = types.ModuleType(name)
    mod.loss = _loss  # type: ignore[attr-defined]
    mod.Klass = type("Klass", (_Klass,), {"run": _Klass.run})  # type: ignore[attr-defined]
    sys.modules[name] = mod
    yield mod
    sys.modules.pop(name, None)


def _set(module: types.ModuleType) -> PatchSet:
    name = module.__name__
    return PatchSet(
        "kinds",
        (
            Patch("loss", f"{name}:loss", _times_ten, kind="wrap"),
            Patch("run", f"{name}:Klass.run", _run),
            Patch("forward", "head.forward", _wrapped_forward, kind="wrap"),
            Patch("flag", "config.flag", "block value", kind="value"),
        ),
    )


def _warm(registry: Registry, patch_set: PatchSet, model: _Model) -> None:
    for _ in range(2):  # the first apply keeps the plan; the next ones re-use it
        with registry.patched(patch_set, model):
            pass


def test_every_kind_is_installed_from_the_plan_and_restored_exactly(module: types.ModuleType) -> None:
    """A warm block of a module wrap, a class replace, an instance wrap and an instance value installs and restores
    from its kept plan: inside, each patched; after, the very originals (by identity), nothing left in the instance."""
    registry, model, patch_set = Registry("t"), _Model(), _set(module)
    loss, run, flag = module.loss, vars(module.Klass)["run"], model.config.flag
    _warm(registry, patch_set, model)
    with registry.patched(patch_set, model) as report:
        assert report.installed == 4
        assert module.loss(1) == 20 and module.Klass().run() == "patched"
        assert model.head.forward() == "wrapped upstream" and model.config.flag == "block value"
    assert report.released and registry.active() == ()
    assert module.loss is loss and vars(module.Klass)["run"] is run and model.config.flag is flag
    assert "forward" not in vars(model.head)


def test_a_module_function_replaced_between_blocks_is_wrapped_and_put_back(module: types.ModuleType) -> None:
    """Someone replaced the module's function after the plan was made: the block binds the wrap again, over the new one,
    and puts the new one back."""
    registry, model, patch_set = Registry("t"), _Model(), _set(module)
    _warm(registry, patch_set, model)

    def other(x: int) -> int:
        return x - 1

    module.loss = other  # type: ignore[attr-defined]
    with registry.patched(patch_set, model):
        assert module.loss(1) == 0
    assert module.loss is other
    with registry.patched(patch_set, model):  # planned again, on the new function
        assert module.loss(1) == 0
    assert module.loss is other


def test_a_module_imported_again_is_patched_not_the_old_one(module: types.ModuleType) -> None:
    """A module replaced in sys.modules (imported again) makes the plan stale: the block patches the new module."""
    registry, model, patch_set = Registry("t"), _Model(), _set(module)
    _warm(registry, patch_set, model)
    again = types.ModuleType(module.__name__)
    again.loss = _loss  # type: ignore[attr-defined]
    again.Klass = module.Klass  # type: ignore[attr-defined]
    sys.modules[module.__name__] = again
    with registry.patched(patch_set, model):
        assert again.loss(1) == 20 and module.loss is _loss
    assert again.loss is _loss


def test_a_class_replaced_in_its_module_makes_the_plan_stale(module: types.ModuleType) -> None:
    """A class replaced in its module (the import path's walk leads elsewhere): the block patches the new class."""
    registry, model, patch_set = Registry("t"), _Model(), _set(module)
    _warm(registry, patch_set, model)
    old, new = module.Klass, type("Klass", (_Klass,), {"run": _Klass.run})
    module.Klass = new  # type: ignore[attr-defined]
    with registry.patched(patch_set, model):
        assert new().run() == "patched" and old().run() == "upstream"
    assert new().run() == "upstream"


def test_an_instance_value_changed_between_blocks_is_restored_to_the_new_one(module: types.ModuleType) -> None:
    """An instance's own value changed between blocks: the block's value goes over the new one and puts it back."""
    registry, model, patch_set = Registry("t"), _Model(), _set(module)
    _warm(registry, patch_set, model)
    new = ["new own value"]
    model.config.flag = new
    with registry.patched(patch_set, model):
        assert model.config.flag == "block value"
    assert model.config.flag is new
    del model.config.flag  # no own value: the class default shows through, and after the block again
    with registry.patched(patch_set, model):
        assert model.config.flag == "block value"
    assert "flag" not in vars(model.config) and model.config.flag == "class default"


def test_an_instance_wrap_over_its_own_method_binds_again(module: types.ModuleType) -> None:
    """An instance that got its own forward since the plan: the wrap wraps that one (the binding rule again) and puts
    it back."""
    registry, model, patch_set = Registry("t"), _Model(), _set(module)
    _warm(registry, patch_set, model)
    own = model.head.forward = lambda: "own"  # type: ignore[method-assign]
    with registry.patched(patch_set, model):
        assert model.head.forward() == "wrapped own"
    assert vars(model.head)["forward"] is own


def test_another_registrys_install_under_a_warm_block_waits_for_it(module: types.ModuleType) -> None:
    """Another registry's replace of the module's function, under a block warmed over it: the block wraps it (the
    binding rule again), the other's revert is refused while the block is on top, and each puts back exactly
    what it displaced."""
    registry, other, model, patch_set = Registry("t"), Registry("other"), _Model(), _set(module)
    loss = module.loss
    below = other.apply(Patch("loss-other", f"{module.__name__}:loss", lambda x: 100))
    _warm(registry, patch_set, model)
    for _ in range(2):
        with registry.patched(patch_set, model):
            assert module.loss(1) == 1000
            with pytest.raises(PatchError, match="other"):
                other.revert(below)
        assert module.loss(1) == 100
    other.revert(below)
    assert module.loss is loss


def test_another_registrys_value_refuses_a_warm_block_and_leaves_nothing(module: types.ModuleType) -> None:
    """Another registry's value on the instance's attribute since the block was warmed: the block's value conflicts
    with it (refused, as a first apply is), and nothing of the block stays installed."""
    registry, other, model, patch_set = Registry("t"), Registry("other"), _Model(), _set(module)
    _warm(registry, patch_set, model)
    below = other.apply(Patch("flag-other", "config.flag", ["other's"], kind="value"), model)
    with pytest.raises(PatchError, match="flag-other"), registry.patched(patch_set, model):
        pass
    assert registry.active() == () and module.loss is _loss and "forward" not in vars(model.head)
    other.revert(below)


def test_a_block_nested_in_another_models_block_shares_the_module_install(module: types.ModuleType) -> None:
    """A warm block inside another model's block of the same set shares the module-level install (one user more), leaves it installed for the outer block at its exit, and the outer block's exit puts the original
    back."""
    registry, patch_set = Registry("t"), _set(module)
    inner_model, outer_model = _Model(), _Model()
    _warm(registry, patch_set, inner_model)
    with registry.patched(patch_set, outer_model) as outer:
        for _ in range(3):
            with registry.patched(patch_set, inner_model) as inner:
                assert inner.installed == 2  # the module and class installs are shared
                assert module.loss(1) == 20 and inner_model.head.forward() == "wrapped upstream"
            assert inner.released and module.loss(1) == 20  # still the outer block's
            (shared,) = [e for e in outer.entries if e.patch == "loss"]
            assert shared.count == 1
    assert module.loss is _loss and vars(module.Klass)["run"] is _Klass.run and registry.active() == ()
