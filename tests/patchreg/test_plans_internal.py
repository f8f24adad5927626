"""Plan internals no public behaviour shows (the fast path a plan takes, the plan checked first): only speed depends on them."""

from __future__ import annotations

from typing import Any

import pytest

from patchreg import PatchSet, Registry
from tests.patchreg.test_plans import FORWARD, MISSING, Layers, Node, cycle, model


def test_a_fully_traced_set_is_planned_flat_and_checked_first() -> None:
    """A set whose every patch is traced gets one flat plan (all three installs), re-used as the plan checked first."""
    registry, m = Registry("t"), model()
    cycle(registry, m)
    assert registry._installs.plans == {}
    cycle(registry, m)
    (plan,) = registry._installs.plans.values()
    cycle(registry, m)
    assert list(registry._installs.plans.values()) == [plan] and registry._installs.last is plan
    assert plan.planned and plan.fast is not None and len(plan.fast) == 3


@pytest.mark.parametrize("target", [FORWARD, PatchSet("with-miss", (FORWARD, MISSING))], ids=["flat", "work"])
def test_a_patch_resolved_at_every_apply_keeps_its_set_off_the_flat_path(target: Any) -> None:
    """A set with a patch whose target is missing is planned per patch, not flat (both paths of test_plans' tests)."""
    registry, m = Registry("t"), Node("model", mtp=Node("mtp", layers=Layers(Node("a"), Node("b"))))
    for _ in range(2):
        registry.revert(registry.apply(target, m))
    (plan,) = registry._installs.plans.values()
    assert plan.planned == (target is FORWARD)
