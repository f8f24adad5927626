"""Threads: 8 threads entering and leaving overlapping patch sets on shared class targets and their own instances."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from patchreg import Patch, PatchOwnershipError, PatchSet, Registry
from tests.reliability import targets
from tests.reliability.helpers import Figures, plain, tagging

T = "tests.reliability.targets"
THREADS = 8
JOIN_TIMEOUT_S = 540  # a deadlock fails the test instead of hanging CI

P_METHOD = Patch("t-method", f"{T}:Child.method", tagging("t"), kind="wrap")
P_FUNC = Patch("t-func", f"{T}:module_func", plain("t-func"))
P_STATIC = Patch("t-static", f"{T}:Child.static", plain("t-static"))
P_INHERITED = Patch("t-inherited", f"{T}:Child.inherited", tagging("t"), kind="wrap")
P_FORWARD = Patch("t-forward", "forward", plain("t-forward"))
P_BACKWARD = Patch("t-backward", "backward", tagging("t"), kind="wrap")

#: Overlapping sets over shared class-level targets: every patch is in two of them.
GLOBAL_SETS = (
    PatchSet("g1", [P_METHOD, P_FUNC]),
    PatchSet("g2", [P_FUNC, P_STATIC, P_INHERITED]),
    PatchSet("g3", [P_STATIC, P_METHOD, P_INHERITED]),
)
INSTANCE_SET = PatchSet("inst", [P_FORWARD, P_BACKWARD])


def _check_visible(patches: PatchSet, leaf: targets.Leaf) -> None:
    child = targets.Child()
    if P_METHOD in patches.patches:
        assert child.method() == ("t", "method")
    if P_FUNC in patches.patches:
        assert targets.module_func(1) == "t-func"
    if P_STATIC in patches.patches:
        assert targets.Child.static(1) == "t-static"
    if P_INHERITED in patches.patches:
        assert child.inherited() == ("t", "base-inherited")
    assert leaf.forward(1) == "t-forward"
    assert leaf.backward(2) == ("t", ("leaf", -2))


class _Tally:
    """Per-thread totals: installs made and originals restored."""

    def __init__(self) -> None:
        self.installed = 0
        self.restored = 0
        self.cycles = 0
        self.refused = 0


def _cycle(reg: Registry, index: int, leaf: targets.Leaf, tally: _Tally) -> None:
    patches = GLOBAL_SETS[index % len(GLOBAL_SETS)]
    outer = reg.apply(patches)
    inner = reg.apply(INSTANCE_SET, leaf)
    tally.installed += outer.installed + inner.installed
    _check_visible(patches, leaf)
    tally.restored += reg.revert(inner)
    tally.restored += reg.revert(outer)
    tally.cycles += 1


def _run_threads(worker: Callable[[int, _Tally], None]) -> list[_Tally]:
    tallies = [_Tally() for _ in range(THREADS)]
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(i: int) -> None:
        try:
            start.wait()
            worker(i, tallies[i])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a thread is stuck: deadlock or livelock"
    assert errors == [], errors[:3]
    return tallies


def _stress(reg: Registry, cycles: int) -> list[_Tally]:
    leaves = [targets.Leaf() for _ in range(THREADS)]

    def worker(i: int, tally: _Tally) -> None:
        for k in range(cycles):
            _cycle(reg, i + k, leaves[i], tally)

    tallies = _run_threads(worker)
    assert all(set(vars(leaf)) == {"tag"} for leaf in leaves)
    assert all(len(p.backup) == 0 for p in (*INSTANCE_SET, *GLOBAL_SETS[1], P_METHOD))
    return tallies


def _assert_exact(reg: Registry, tallies: list[_Tally], cycles: int) -> None:
    assert [t.cycles for t in tallies] == [cycles] * THREADS
    installed = sum(t.installed for t in tallies)
    restored = sum(t.restored for t in tallies)
    assert installed == restored, f"{installed} installs but {restored} restores"
    assert installed >= 2 * THREADS * cycles  # each thread's own instance patches are always new
    assert reg.active() == ()


@pytest.fixture
def fast_switching() -> Any:
    """Switch threads often so that interleavings are dense."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def test_threads_overlapping_sets_quick(
    patch_registry: Registry, pristine: Callable[[], None], fast_switching: Any, figures: Figures
) -> None:
    """8 threads x 300 cycles over overlapping sets: every patch visible inside, exact counts, pristine after."""
    tallies = _stress(patch_registry, 300)
    _assert_exact(patch_registry, tallies, 300)
    figures.add("threads.quick_cycles", sum(t.cycles for t in tallies))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_threads_overlapping_sets_stress(
    patch_registry: Registry, pristine: Callable[[], None], fast_switching: Any, figures: Figures
) -> None:
    """8 threads x 10,000 cycles over overlapping sets: no deadlock, no lost original, installs == restores."""
    tallies = _stress(patch_registry, 10_000)
    _assert_exact(patch_registry, tallies, 10_000)
    figures.add("threads.stress_cycles", sum(t.cycles for t in tallies))
    figures.add("threads.stress_installs", sum(t.installed for t in tallies))


def _distinct_wraps(reg: Registry, cycles: int) -> list[_Tally]:
    """Each thread wraps Child.other with its own patch; a release under another thread's wrap is retried."""
    wraps = [Patch(f"w{i}", f"{T}:Child.other", tagging(f"w{i}"), kind="wrap") for i in range(THREADS)]

    def worker(i: int, tally: _Tally) -> None:
        for _ in range(cycles):
            report = reg.apply(wraps[i])
            tally.installed += report.installed
            assert f"w{i}" in repr(targets.Child().other())
            while True:
                try:
                    tally.restored += reg.revert(report)
                    break
                except PatchOwnershipError:
                    tally.refused += 1
            tally.cycles += 1

    return _run_threads(worker)


def test_threads_distinct_wraps_one_attribute_quick(
    patch_registry: Registry, pristine: Callable[[], None], fast_switching: Any, figures: Figures
) -> None:
    """8 threads stacking their own wraps on one attribute: out-of-order releases are refused, retried, exact."""
    tallies = _distinct_wraps(patch_registry, 200)
    assert sum(t.installed for t in tallies) == sum(t.restored for t in tallies) == THREADS * 200
    assert patch_registry.active() == ()
    figures.add("threads.quick_cycles", sum(t.cycles for t in tallies))
    figures.add("threads.refused_out_of_order", sum(t.refused for t in tallies))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_threads_distinct_wraps_one_attribute_stress(
    patch_registry: Registry, pristine: Callable[[], None], fast_switching: Any, figures: Figures
) -> None:
    """8 threads x 10,000 own-wrap cycles on one attribute: refusals are retried to completion, nothing lost."""
    tallies = _distinct_wraps(patch_registry, 10_000)
    assert sum(t.installed for t in tallies) == sum(t.restored for t in tallies) == THREADS * 10_000
    assert patch_registry.active() == ()
    figures.add("threads.stress_cycles", sum(t.cycles for t in tallies))
    figures.add("threads.refused_out_of_order", sum(t.refused for t in tallies))
