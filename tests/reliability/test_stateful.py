"""Hypothesis stateful test: random apply / revert / enter / exit / raise-inside-with over four overlapping sets.

The machine keeps a model of the registry (per attribute, a stack of ``[patch, count]``
layers) and of every apply's claim. After each step the registry's active installs
equal the model (same patches, same order per attribute, same counts); whenever the
model is empty, every namespace is identical (``is``) to the start.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from patchreg import Patch, PatchConflictError, PatchOwnershipError, PatchSet, Registry, Report
from tests.reliability import targets
from tests.reliability.helpers import FIGURES, Namespaces, plain, tagging

T = "tests.reliability.targets"


def _prop(self: Any) -> str:
    return "c-prop"


#: name -> (patch, model site). Every target kind: module function, class method, inherited method,
#: staticmethod, classmethod, property, instance attribute present ("tag") and absent ("forward", "backward").
PATCHES = {
    p.name: (p, site)
    for p, site in [
        (Patch("a-func-wrap", f"{T}:module_func", tagging("a"), kind="wrap"), "targets.module_func"),
        (Patch("a-method", f"{T}:Child.method", plain("a-method")), "Child.method"),
        (Patch("a-static", f"{T}:Child.static", plain("a-static")), "Child.static"),
        (Patch("a-tag", "tag", plain("a-tag")), "Leaf.tag"),
        (Patch("b-func-wrap", f"{T}:module_func", tagging("b"), kind="wrap"), "targets.module_func"),
        (Patch("b-inherited", f"{T}:Child.inherited", plain("b-inherited")), "Child.inherited"),
        (Patch("b-klass", f"{T}:Child.klass", plain("b-klass")), "Child.klass"),
        (Patch("b-forward-wrap", "forward", tagging("b"), kind="wrap"), "Leaf.forward"),
        (Patch("c-prop", f"{T}:Child.prop", property(_prop)), "Child.prop"),
        (Patch("c-forward-wrap", "forward", tagging("c"), kind="wrap"), "Leaf.forward"),
        (Patch("c-backward", "backward", plain("c-backward")), "Leaf.backward"),
        (Patch("d-method", f"{T}:Child.method", plain("d-method")), "Child.method"),
        (Patch("d-func", f"{T}:module_func", plain("d-func")), "targets.module_func"),
    ]
}


def _set(name: str, *patches: str) -> PatchSet:
    return PatchSet(name, [PATCHES[p][0] for p in patches])


SETS = [
    _set("A", "a-func-wrap", "a-method", "a-static", "a-tag"),
    _set("B", "b-func-wrap", "b-inherited", "b-klass", "b-forward-wrap"),
    _set("C", "c-prop", "a-static", "c-forward-wrap", "c-backward"),  # shares a-static with A
    _set("D", "d-method", "d-func"),  # conflicts with A (method) and with the wraps on module_func
]

Model = dict[str, list[list[Any]]]  # site -> [[patch name, count], ...] bottom first


class Boom(Exception):
    """Raised inside a with block by the machine."""


class RegistryMachine(RuleBasedStateMachine):
    """Random interleavings against a model of per-attribute layer stacks and per-apply claims."""

    def __init__(self) -> None:
        super().__init__()
        self.reg = Registry("stateful")
        self.leaf = targets.Leaf()
        self.spaces = Namespaces([targets, targets.Base, targets.Child, targets.Leaf, self.leaf])
        self.model: Model = {}
        self.reports: list[tuple[Report, list[str]]] = []  # live applies and the patches they hold
        self.blocks: list[tuple[Any, list[str]]] = []  # entered patched() blocks not yet exited

    # -- the model ----------------------------------------------------------------------------

    def _model_apply(self, patches: PatchSet) -> list[str] | None:
        """The claim an apply takes, updating the model; None (model unchanged) on a conflict."""
        saved = copy.deepcopy(self.model)
        claim = []
        for patch in patches:
            stack = self.model.setdefault(PATCHES[patch.name][1], [])
            layer = next((la for la in stack if la[0] == patch.name), None)
            if layer is not None:
                layer[1] += 1
            elif patch.kind == "replace" and stack:
                self.model = saved
                return None
            else:
                stack.append([patch.name, 1])
            claim.append(patch.name)
        return claim

    def _model_release(self, claim: list[str]) -> bool:
        """Release a claim in the model (last taken first); False (model unchanged) if out of order."""
        saved = copy.deepcopy(self.model)
        for name in reversed(claim):
            stack = self.model[PATCHES[name][1]]
            layer = next(la for la in stack if la[0] == name)
            if layer[1] > 1:
                layer[1] -= 1
            elif stack[-1] is layer:
                stack.pop()
            else:
                self.model = saved
                return False
        self.model = {site: stack for site, stack in self.model.items() if stack}
        return True

    def _count(self, key: str) -> None:
        FIGURES[f"stateful.{key}"] = FIGURES.get(f"stateful.{key}", 0) + 1

    # -- rules --------------------------------------------------------------------------------

    @rule(which=st.sampled_from(SETS))
    def apply(self, which: PatchSet) -> None:
        expected = self._model_apply(which)
        try:
            report = self.reg.apply(which, self.leaf)
        except PatchConflictError:
            assert expected is None, f"apply({which.name}) conflicted, the model did not"
            self._count("conflicts")
            return
        assert expected is not None, f"apply({which.name}) should have conflicted"
        self.reports.append((report, expected))
        self._count("applies")

    @precondition(lambda self: self.reports)
    @rule(data=st.data())
    def revert(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.reports) - 1), label="report")
        report, claim = self.reports[index]
        ok = self._model_release(claim)
        try:
            self.reg.revert(report)
        except PatchOwnershipError:
            assert not ok, "revert refused, the model allowed it"
            self._count("refused_reverts")
            return
        assert ok, "revert succeeded out of order"
        del self.reports[index]
        self._count("reverts")

    @rule(which=st.sampled_from(SETS))
    def enter(self, which: PatchSet) -> None:
        block = self.reg.patched(which, self.leaf)
        expected = self._model_apply(which)
        try:
            block.__enter__()
        except PatchConflictError:
            assert expected is None
            self._count("conflicts")
            return
        assert expected is not None
        self.blocks.append((block, expected))
        self._count("enters")

    @precondition(lambda self: self.blocks)
    @rule(data=st.data())
    def exit(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.blocks) - 1), label="block")  # any order: ExitStack misuse
        block, claim = self.blocks[index]
        ok = self._model_release(claim)
        try:
            block.__exit__(None, None, None)
        except PatchOwnershipError:
            assert not ok
            self._count("refused_exits")
            return
        assert ok
        del self.blocks[index]
        self._count("exits")

    @rule(which=st.sampled_from(SETS))
    def raise_inside_with(self, which: PatchSet) -> None:
        block = self.reg.patched(which, self.leaf)
        claim = self._model_apply(which)
        released = claim is not None and self._model_release(claim)
        try:
            with block:
                raise Boom
        except PatchConflictError:
            assert claim is None
            self._count("conflicts")
        except PatchOwnershipError as exc:
            assert claim is not None and not released
            assert isinstance(exc.__context__, Boom)
            self.blocks.append((block, claim))  # its report stays: exiting it later retries
            self._count("refused_exits")
        except Boom:
            assert released
            self._count("raised_inside_with")

    @precondition(lambda self: len(self.reports) + len(self.blocks) >= 4)
    @rule()
    def revert_all(self) -> None:
        self.reg.revert_all()
        self.model = {}
        self.reports.clear()
        self.blocks.clear()
        self._count("revert_alls")

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def registry_matches_model(self) -> None:
        seen: Model = {}
        for entry in self.reg.active():
            owner = entry.holder.split("@")[0].rsplit(".", 1)[-1]
            seen.setdefault(f"{owner}.{entry.attr}", []).append([entry.patch, entry.count])
        assert seen == self.model

    @invariant()
    def pristine_when_nothing_active(self) -> None:
        self._count("steps")
        if not self.model:
            self.spaces.check()
            assert targets.module_func(1) == 2 and self.leaf.forward(1) == ("leaf", 1)

    def teardown(self) -> None:
        self.reg.revert_all()
        self.spaces.check()
        self._count("examples")


TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
