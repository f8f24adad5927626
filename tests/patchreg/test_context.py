"""Blocks (``Patched``, ``decorate``): misuse of enter and exit is a PatchError or a documented no-op."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import patchreg
from patchreg import Patch, PatchDefinitionError, Patched, PatchError, Registry, Report, decorate
from tests.patchreg import sample
from tests.patchreg.helpers import plain

M = "tests.patchreg.sample"


def _patch() -> Patch:
    return Patch("f", f"{M}:module_func", plain("patched"))


def _on_thread(func: Any) -> BaseException | None:
    """Run ``func`` on a new thread; what it raised (None if nothing)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            func()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None


def test_second_exit_is_a_no_op(patch_registry: Registry, pristine: Any) -> None:
    """A second __exit__ of a block (as mock's own test_exit_idempotent) does nothing and raises nothing."""
    block = patch_registry.patched(_patch())
    with block:
        assert sample.module_func(1) == "patched"
    block.__exit__(None, None, None)
    block.__exit__(None, None, None)
    assert patch_registry.active() == ()
    pristine()


def test_exit_without_enter_is_a_patch_error(patch_registry: Registry, pristine: Any) -> None:
    """An __exit__ of a block never entered is a PatchError naming the block and how to use it."""
    block = patch_registry.patched(_patch())
    with pytest.raises(PatchError, match=r"exited without being entered; use it as 'with <patched 'f'"):
        block.__exit__(None, None, None)
    pristine()


def test_exit_on_another_thread_is_refused_and_the_enter_keeps_its_install(
    patch_registry: Registry, pristine: Any
) -> None:
    """An __exit__ on a thread that did not enter is a PatchError; the entering thread still owns and exits it."""
    block = patch_registry.patched(_patch())
    report = block.__enter__()
    raised = _on_thread(lambda: block.__exit__(None, None, None))
    assert isinstance(raised, PatchError), raised
    assert "did not enter it" in str(raised) and "registry.revert(report)" in str(raised)
    assert sample.module_func(1) == "patched" and block.open_count == 1 and not report.reverted
    block.__exit__(None, None, None)
    assert block.open_count == 0 and report.reverted
    pristine()


def test_report_of_an_enter_reverts_from_another_thread(patch_registry: Registry, pristine: Any) -> None:
    """The remedy the refusal names works: the report an enter returned is reverted from any thread."""
    block = patch_registry.patched(_patch())
    report = block.__enter__()
    assert _on_thread(lambda: patch_registry.revert(report)) is None
    assert patch_registry.active() == ()
    block.__exit__(None, None, None)  # its report is released already: releases nothing again
    pristine()


def test_decorated_generator_finished_on_another_thread_restores(patch_registry: Registry, pristine: Any) -> None:
    """A decorated generator begun on one thread and finished on another reverts its one enter there."""

    @patch_registry.patched(_patch())
    def steps() -> Iterator[Any]:
        yield sample.module_func(1)
        yield sample.module_func(2)

    it = steps()
    assert next(it) == "patched"
    rest: list[Any] = []
    assert _on_thread(lambda: rest.extend(it)) is None
    assert rest == ["patched"]
    assert patch_registry.active() == ()
    pristine()


def test_nested_enters_unwind_per_thread(patch_registry: Registry, pristine: Any) -> None:
    """One block entered twice (nested) counts two enters; each exit releases the innermost one."""
    block = patch_registry.patched(_patch())
    with block as outer:
        with block as inner:
            assert block.open_count == 2 and inner.installed == 0
        assert block.open_count == 1 and not outer.reverted
    assert block.open_count == 0
    pristine()


def test_enters_on_two_threads_exit_in_any_order(patch_registry: Registry, pristine: Any) -> None:
    """Two threads' enters of one block each exit their own, in any order; an enter made after the first one
    exited ranks after the other thread's (its exit ends it, not the other's)."""
    from concurrent.futures import ThreadPoolExecutor

    block = patch_registry.patched(_patch())
    with ThreadPoolExecutor(1) as other:  # one thread: every call below runs on it
        mine = block.__enter__()
        theirs = other.submit(block.__enter__).result()
        block.__exit__(None, None, None)  # the first enter exits while a later one is open
        assert mine.reverted and not theirs.reverted and block.open_count == 1
        again = block.__enter__()
        assert block.open_count == 2 and sample.module_func(1) == "patched"
        other.submit(block.__exit__, None, None, None).result()
        assert theirs.reverted and not again.reverted and block.open_count == 1
        block.__exit__(None, None, None)
        assert again.reverted and block.open_count == 0
        block.__exit__(None, None, None)  # nothing open: a no-op, on either thread
        other.submit(block.__exit__, None, None, None).result()
        first = other.submit(block.__enter__).result()  # the other thread's enter first, then this one's outer
        outer = block.__enter__()
        other.submit(block.__exit__, None, None, None).result()
        inner = block.__enter__()  # nested in this thread's outer one: its exit ends this one, not the outer
        block.__exit__(None, None, None)
        assert first.reverted and inner.reverted and not outer.reverted and block.open_count == 1
        block.__exit__(None, None, None)
        assert outer.reverted and block.open_count == 0
    pristine()


def test_one_block_entered_by_many_threads_at_once(patch_registry: Registry, pristine: Any) -> None:
    """Eight threads entering and exiting one block at once (a thread switch every microsecond) each exit their
    own enter: no exit is refused, none is lost, and the original is back at the end."""
    import sys

    block = patch_registry.patched(_patch())
    refused: list[BaseException] = []

    def steps() -> None:
        try:
            for _ in range(300):
                with block as report:
                    assert sample.module_func(1) == "patched" and not report.reverted
                assert report.reverted  # this thread's exit released this thread's enter
        except BaseException as exc:
            refused.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=steps) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck"
    assert refused == [] and block.open_count == 0
    pristine()


def test_subclass_hooks_value_close_fresh(patch_registry: Registry, pristine: Any) -> None:
    """A subclass's value() decides what the with statement binds, close() runs after the revert, fresh() per call."""
    closed: list[Any] = []

    class Block(Patched[dict[str, Any]]):
        def value(self, report: Report) -> dict[str, Any]:
            return {"report": report}

        def close(self, value: dict[str, Any]) -> None:
            closed.append((value, sample.module_func(1)))

        def fresh(self) -> Block:
            return Block(self.registry, self.target)

    block = Block(patch_registry, _patch())
    with block as value:
        assert value["report"].installed == 1
    assert closed == [(value, 2)]  # close() ran after the original came back

    @block
    def call() -> Any:
        return sample.module_func(1)

    assert call() == "patched" and len(closed) == 2 and block.open_count == 0
    pristine()


def test_decorate_refuses_a_block_instead_of_a_factory(patch_registry: Registry) -> None:
    """decorate() given a block (not a factory) or a non-callable is a PatchDefinitionError naming the remedy."""
    block = patch_registry.patched(_patch())
    with pytest.raises(PatchDefinitionError, match="factory that makes a fresh block"):
        decorate(sample.module_func, block)
    with pytest.raises(PatchDefinitionError, match="the function to run inside the block"):
        decorate(3, lambda: block)  # type: ignore[type-var]


class _Model:
    """An instance whose method a block replaces as an instance attribute: from the third enter, a clean install."""

    def forward(self, x: int) -> tuple[str, int]:
        return ("original", x)


_FORWARD = Patch("forward", "forward", plain("patched"))


@pytest.mark.parametrize("enters", [1, 4], ids=["resolved", "planned"])
def test_a_value_hook_that_raises_leaves_nothing_installed(patch_registry: Registry, enters: int) -> None:
    """An enter whose value() raises reverts what it applied, on the general path (the first enter) and on a
    plan's clean path (the later ones): the error escapes, and the model is as before, with no install left."""
    model = _Model()
    calls = [0]

    class Block(Patched[Report]):
        def value(self, report: Report) -> Report:
            calls[0] += 1
            if calls[0] == enters:
                raise RuntimeError("value() failed")
            return report

    for _ in range(enters - 1):
        with Block(patch_registry, _FORWARD, model):
            assert model.forward(1) == "patched"
    with pytest.raises(RuntimeError, match="value"):
        Block(patch_registry, _FORWARD, model).__enter__()
    assert "forward" not in vars(model) and model.forward(1) == ("original", 1)
    assert patch_registry.active() == ()


def test_an_exit_that_finds_its_install_replaced_refuses_and_keeps_every_install(patch_registry: Registry) -> None:
    """A planned block's exit that finds one of its clean installs written over refuses (naming the attribute),
    puts nothing back (all or nothing, its other install included), and a retry after the fix restores both."""
    model = _Model()
    model.other = _Model()  # type: ignore[attr-defined]
    both = patchreg.PatchSet("two", (_FORWARD, Patch("other", "other.forward", plain("other"))))
    for _ in range(3):  # the third enter is a plan's clean one
        with patch_registry.patched(both, model):
            pass
    block = patch_registry.patched(both, model)
    with block as report:
        assert report.installed == 2
        mine = vars(model.other)["forward"]
        model.other.forward = lambda x: "someone"  # type: ignore[attr-defined]
        with pytest.raises(PatchError, match="forward"):
            block.__exit__(None, None, None)
        assert vars(model)["forward"](1) == "patched"  # the first install is still there
        model.other.forward = mine  # type: ignore[attr-defined]
    assert "forward" not in vars(model) and "forward" not in vars(model.other)
    assert patch_registry.active() == ()


def test_an_open_written_for_the_old_hooks_is_refused_and_leaves_nothing(patch_registry: Registry) -> None:
    """A subclass whose open() still returns (report, value), as before value() existed, gets a PatchDefinitionError
    naming the new hooks, and its apply is reverted: no install without an owner."""
    model = _Model()

    class Old(Patched[Any]):
        def open(self) -> Any:
            report = self.registry.apply(self.target, self.obj)
            return report, "bound"

    with pytest.raises(PatchDefinitionError, match=r"value\(report\)"):
        Old(patch_registry, _FORWARD, model).__enter__()
    assert "forward" not in vars(model) and patch_registry.active() == ()


def test_a_decorated_class_stays_a_class_with_its_test_methods_patched(patch_registry: Registry) -> None:
    """``@registry.patched(...)`` on a class decorates its test methods (as mock's) and leaves the rest alone."""
    from tests.patchreg import kinds_sample as ks

    flag = Patch("flag", f"{ks.M}:FLAG", True, kind="value")

    @patch_registry.patched(flag)
    class Tests:
        def setUp(self) -> bool:
            return bool(ks.FLAG)

        def test_one(self) -> bool:
            return bool(ks.FLAG)

        async def test_two(self) -> bool:
            return bool(ks.FLAG)

    assert isinstance(Tests, type)
    case = Tests()
    assert case.test_one() is True and case.setUp() is False and ks.FLAG is False
    assert asyncio.run(case.test_two()) is True and ks.FLAG is False
