"""Faults from every place user code runs: the with body, replacements, predicates, selectors, exits, interrupts."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from patchreg import Patch, PatchSet, PredicateError, Registry, check
from tests.reliability import targets
from tests.reliability.helpers import plain, raising, tagging

T = "tests.reliability.targets"

Check = Callable[[], None]


def _global_set(tag: str = "g") -> PatchSet:
    """A set over a module function, a class method and an inherited method."""
    return PatchSet(
        f"set-{tag}",
        [
            Patch(f"{tag}-func", f"{T}:module_func", plain(f"{tag}-func")),
            Patch(f"{tag}-method", f"{T}:Child.method", tagging(tag), kind="wrap"),
            Patch(f"{tag}-inherited", f"{T}:Child.inherited", plain(f"{tag}-inh")),
        ],
    )


def _assert_clean(reg: Registry, pristine: Check, *leaves: targets.Leaf) -> None:
    assert reg.active() == ()
    pristine()
    for leaf in leaves:
        assert set(vars(leaf)) == {"tag"}


@pytest.mark.parametrize("exc", [ValueError("body"), KeyboardInterrupt(), SystemExit(3), GeneratorExit()])
def test_exception_inside_with_body(patch_registry: Registry, pristine: Check, exc: BaseException) -> None:
    """Any exception (including KeyboardInterrupt and SystemExit) raised in the body restores every namespace."""
    leaf = targets.Leaf()
    with (
        pytest.raises(type(exc)),
        patch_registry.patched(_global_set(), None),
        patch_registry.patched(Patch("fw", "forward", plain("x")), leaf),
    ):
        assert targets.module_func(1) == "g-func"
        assert leaf.forward(1) == "x"
        raise exc
    _assert_clean(patch_registry, pristine, leaf)


@pytest.mark.parametrize("kind", ["replace", "wrap"])
def test_exception_inside_replacement(patch_registry: Registry, pristine: Check, kind: str) -> None:
    """A replacement (or wrapper) that raises propagates its error and the block still restores everything."""
    body = raising(RuntimeError("inside replacement"))
    patches = PatchSet(
        "s",
        [Patch("m", f"{T}:Child.method", body, kind=kind), Patch("f", f"{T}:module_func", plain(0))],  # type: ignore[arg-type]
    )
    with pytest.raises(RuntimeError, match="inside replacement"), patch_registry.patched(patches):
        targets.Child().method()
    _assert_clean(patch_registry, pristine)


@pytest.mark.parametrize("exc", [ZeroDivisionError("pred"), KeyboardInterrupt()])
def test_exception_inside_predicate(patch_registry: Registry, pristine: Check, exc: BaseException) -> None:
    """A predicate that raises (even KeyboardInterrupt) installs nothing of its set, not even earlier patches."""
    when = check(raising(exc), f"explodes with {type(exc).__name__}")
    patches = _global_set() + Patch("late", f"{T}:other_func", plain(0), when=when)
    expected = PredicateError if isinstance(exc, Exception) else type(exc)
    with pytest.raises(expected):
        patch_registry.apply(patches)
    _assert_clean(patch_registry, pristine)


class _Exploding:
    """An object whose ``blocks`` property raises, so a selector through it raises."""

    def __init__(self) -> None:
        self.head = targets.Leaf("head")

    @property
    def blocks(self) -> Any:
        raise RuntimeError("selector walked into a broken property")


def test_exception_inside_selector_on_apply(patch_registry: Registry, pristine: Check) -> None:
    """A selector whose walk raises leaves earlier global and instance patches of the set uninstalled."""
    obj = _Exploding()
    patches = _global_set() + Patch("head", "head.forward", plain(1)) + Patch("blocks", "blocks[*].forward", plain(2))
    with pytest.raises(RuntimeError, match="broken property"):
        patch_registry.apply(patches, obj)
    _assert_clean(patch_registry, pristine, obj.head)


class _InterruptedWhileNamed:
    """An object whose ``head`` is read by the apply's walk and then, once the install is made, by the walk that
    names it (``explain``'s path): the read number ``interrupt_at`` raises KeyboardInterrupt (0: never)."""

    def __init__(self, interrupt_at: int) -> None:
        self._head = targets.Leaf("head")
        self.reads = 0
        self.interrupt_at = interrupt_at

    @property
    def head(self) -> targets.Leaf:
        self.reads += 1
        if self.reads == self.interrupt_at:
            raise KeyboardInterrupt("interrupted while naming the install")
        return self._head


@pytest.mark.parametrize("how", ["apply", "block"])
def test_interrupt_while_naming_the_installs_reverts_the_apply(
    patch_registry: Registry, pristine: Check, how: str
) -> None:
    """An interrupt in the walk that names an apply's new instance installs (after they are made, before the
    report reaches its caller) reverts the apply: no install is left without an owner, and the next apply works."""
    patches = _global_set() + Patch("head", "head.forward", plain(1))
    probe = _InterruptedWhileNamed(0)
    patch_registry.revert(patch_registry.apply(patches, probe))
    reads = probe.reads  # the apply's walk, then the naming walk: the last read is the naming
    assert reads >= 2
    obj = _InterruptedWhileNamed(reads)
    with pytest.raises(KeyboardInterrupt, match="naming"):
        if how == "apply":
            patch_registry.apply(patches, obj)
        else:
            with patch_registry.patched(patches, obj):
                pass
    assert obj.reads == reads
    _assert_clean(patch_registry, pristine, obj._head)
    with patch_registry.patched(patches, obj):
        assert obj._head.forward(0) == 1
    _assert_clean(patch_registry, pristine, obj._head)


def test_exception_inside_selector_on_revert(patch_registry: Registry, pristine: Check) -> None:
    """A selector that raises during revert(set, obj) changes nothing, and a later revert succeeds."""

    class Flaky:
        broken = False

        def __init__(self) -> None:
            self._head = targets.Leaf("head")

        @property
        def head(self) -> targets.Leaf:
            if self.broken:
                raise RuntimeError("flaky selector")
            return self._head

    obj = Flaky()
    patches = PatchSet("s", [Patch("f", f"{T}:module_func", plain(1)), Patch("h", "head.forward", plain(2))])
    patch_registry.apply(patches, obj)
    obj.broken = True
    with pytest.raises(RuntimeError, match="flaky selector"):
        patch_registry.revert(patches, obj)
    assert {e.patch for e in patch_registry.active()} == {"f", "h"}
    assert obj._head.forward(0) == 2
    obj.broken = False
    assert patch_registry.revert(patches, obj) == 2
    _assert_clean(patch_registry, pristine, obj._head)


@contextlib.contextmanager
def _raising_on_exit() -> Iterator[None]:
    yield
    raise OSError("outer __exit__ failed")


def test_exception_during_exit_of_outer_context(patch_registry: Registry, pristine: Check) -> None:
    """An outer context manager whose __exit__ raises does not stop our inner block from restoring."""
    with pytest.raises(OSError, match="outer"), _raising_on_exit(), patch_registry.patched(_global_set()):
        assert targets.module_func(0) == "g-func"
    _assert_clean(patch_registry, pristine)


def test_exception_during_exit_of_inner_context(patch_registry: Registry, pristine: Check) -> None:
    """Our block around a context manager whose __exit__ raises still restores on the way out."""
    with pytest.raises(OSError, match="outer"), patch_registry.patched(_global_set()), _raising_on_exit():
        assert targets.module_func(0) == "g-func"
    _assert_clean(patch_registry, pristine)


def test_exit_stack_with_raising_callback(patch_registry: Registry, pristine: Check) -> None:
    """An ExitStack whose other callbacks raise still runs our exit, and the error reaches the caller."""
    with pytest.raises(OSError, match="outer"), contextlib.ExitStack() as stack:
        stack.callback(raising(OSError("outer callback")))
        stack.enter_context(patch_registry.patched(_global_set("a")))
        stack.callback(raising(OSError("outer callback 2")))
        stack.enter_context(patch_registry.patched(Patch("o", f"{T}:other_func", plain(0))))
    _assert_clean(patch_registry, pristine)


class _Meta(type):
    """A metaclass whose attribute writes can be made to raise, to inject faults into installs and restores."""

    fail_on: str | None = None
    exc: type[BaseException] = KeyboardInterrupt
    after: bool = False  # raise after the write took effect (an interrupt just past the store)

    def __setattr__(cls, name: str, value: Any) -> None:
        if name == _Meta.fail_on:
            _Meta.fail_on = None
            if _Meta.after:
                super().__setattr__(name, value)
            raise _Meta.exc(f"interrupted while setting {name}")
        super().__setattr__(name, value)

    def __delattr__(cls, name: str) -> None:
        if name == _Meta.fail_on:
            _Meta.fail_on = None
            if _Meta.after:
                super().__delattr__(name)
            raise _Meta.exc(f"interrupted while deleting {name}")
        super().__delattr__(name)


@pytest.fixture(params=[False, True], ids=["before-the-store", "after-the-store"])
def after(request: Any) -> Iterator[bool]:
    """Whether a failing write raises before or after it took effect."""
    _Meta.after = request.param
    try:
        yield request.param
    finally:
        _Meta.after, _Meta.fail_on = False, None


class Guarded(targets.Base, metaclass=_Meta):
    """A class whose metaclass can fail a write."""

    def first(self) -> str:
        return "first"

    def second(self) -> str:
        return "second"


_GUARDED = "tests.reliability.test_faults:Guarded"


def _guarded_set() -> PatchSet:
    return PatchSet(
        "guarded",
        [
            Patch("first", f"{_GUARDED}.first", plain("p1")),
            Patch("second", f"{_GUARDED}.second", plain("p2")),
            Patch("inh", f"{_GUARDED}.inherited", plain("p3")),
        ],
    )


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_between_two_installs_of_a_set(
    patch_registry: Registry, exc: type[BaseException], after: bool
) -> None:
    """An interrupt at the second install of a set leaves the first install rolled back and nothing recorded."""
    before = dict(vars(Guarded))
    patches = _guarded_set()
    _Meta.fail_on, _Meta.exc = "second", exc
    with pytest.raises(exc, match="interrupted while setting second"):
        patch_registry.apply(patches)
    assert patch_registry.active() == ()
    assert dict(vars(Guarded)) == before
    assert all(len(p.backup) == 0 for p in patches)


@pytest.mark.parametrize(("attr", "exc"), [("first", KeyboardInterrupt), ("inherited", RuntimeError)])
def test_interrupt_while_restoring_loses_nothing(
    patch_registry: Registry, attr: str, exc: type[BaseException], after: bool
) -> None:
    """An interrupt while an original is being written back keeps the patch recorded so a retry restores it."""
    before = dict(vars(Guarded))
    patches = _guarded_set()
    report = patch_registry.apply(patches)
    _Meta.fail_on, _Meta.exc = attr, exc
    with pytest.raises(exc, match="interrupted"):
        patch_registry.revert(report)
    still = {e.patch for e in patch_registry.active()}
    assert still, "the failed restore dropped the registry's record of the install"
    for entry in patch_registry.active():
        patch = patches[entry.patch]
        assert Guarded in patch.backup, f"{entry.patch}: original lost from the backup"
    patch_registry.revert(report)
    assert patch_registry.active() == ()
    assert dict(vars(Guarded)) == before


def test_interrupt_while_rolling_back_a_shared_install(patch_registry: Registry, after: bool) -> None:
    """A failed restore does not release another apply's reference to a shared install twice."""
    before = dict(vars(Guarded))
    patches = _guarded_set()
    keep = patch_registry.apply(PatchSet("keep", [patches["inh"]]))
    report = patch_registry.apply(patches)
    _Meta.fail_on, _Meta.exc = "first", KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        patch_registry.revert(report)
    patch_registry.revert(report)
    counts = {e.patch: e.count for e in patch_registry.active()}
    assert counts == {"inh": 1}, "the shared install lost or kept a reference"
    patch_registry.revert(keep)
    assert dict(vars(Guarded)) == before
