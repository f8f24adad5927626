"""Hypothesis stateful test: random apply / revert / enter / exit / raise-inside-with over four overlapping sets.

The machine keeps a model of the registry (per attribute, a stack of ``[patch, count]``
layers) and of every apply's claim. After each step the registry's active installs
equal the model (same patches, same order per attribute, same counts); whenever the
model is empty, every namespace is identical (``is``) to the start.

``TwoRegistryMachine`` spreads the same operations (and revert by patch, checkpoint and
rollback) over two registries on the same targets. Its model is one stack of layers per
attribute shared by both registries, each layer owned by one registry: a registry shares its
own layer of a patch (counts per registry), a replace goes on an empty attribute or on the
other registry's install of the same patch (otherwise it conflicts), and only the top layer of
an attribute can be removed (a release under another registry's layer is refused, nothing
changed). After each step each registry's installs equal its layers in the model, and what
every patched attribute returns when called is the model's stack folded bottom up.
The three engine bugs it found (a cover taken over by the upper registry's own next layer,
rollback after a release by patch, a refused revert_all that had changed some attributes) are
fixed; the tests after it keep them fixed. Both two-registry machines share that model (``LayerModel``).

``InheritedMachine`` runs the same operations, and drops instances (``del`` and ``gc.collect()``), over
``Base.meth`` (replaced or wrapped by import path), ``Sub`` inheriting it (wrapped or replaced by import
path) and two ``Sub`` instances (wrapped or replaced through a selector). A wrap installed where its
holder has no ``meth`` of its own holds the live install it inherits (either registry's): that layer's
last release is refused, nothing changed, while the wrap lives. After each step ``inst.meth()``,
``Sub().meth()`` and ``Base().meth()`` return what the model's stacks say. ``PATCHREG_STATEFUL=1000x60``
runs every machine with that many examples and steps. It found a refused release batch forgetting the
holds it had checked (fixed; ``tests/patchreg/test_registry.py`` and the rollback test here keep it
fixed), and an instance dropped with two layers on one attribute kept alive (fixed; the last test here).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import os
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from patchreg import Checkpoint, Installed, Patch, PatchConflictError, PatchOwnershipError, PatchSet, Registry, Report
from tests.reliability import targets
from tests.reliability.helpers import FIGURES, Namespaces, plain, tagging

T = "tests.reliability.targets"
ENV_KEY = "PATCHREG_STATEFUL_ENV"


def _settings(examples: int, steps: int) -> settings:
    """A machine's Hypothesis settings; ``PATCHREG_STATEFUL=1000x60`` (examples x steps) runs every machine longer."""
    scale = os.environ.get("PATCHREG_STATEFUL")
    if scale:
        examples, steps = (int(n) for n in scale.lower().split("x"))
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None)


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
        # the value, create and mapping-item kinds: a module constant, an attribute absent before, items
        (Patch("e-const", f"{T}:CONSTANT", 42, kind="value"), "targets.CONSTANT"),
        (Patch("e-env", "os:environ", "1", kind="item", key=ENV_KEY, create=True), f"os:environ.{ENV_KEY}"),
        (Patch("e-table", f"{T}:TABLE", "e", kind="item", key="k"), "targets:TABLE.k"),
        (Patch("e-fresh", "fresh", "v", kind="value", create=True), "Leaf.fresh"),
        (Patch("f-table", f"{T}:TABLE", "f", kind="item", key="k"), "targets:TABLE.k"),
        (Patch("f-table-new", f"{T}:TABLE", "f", kind="item", key="new", create=True), "targets:TABLE.new"),
    ]
}


def _set(name: str, *patches: str) -> PatchSet:
    return PatchSet(name, [PATCHES[p][0] for p in patches])


SETS = [
    _set("A", "a-func-wrap", "a-method", "a-static", "a-tag"),
    _set("B", "b-func-wrap", "b-inherited", "b-klass", "b-forward-wrap"),
    _set("C", "c-prop", "a-static", "c-forward-wrap", "c-backward"),  # shares a-static with A
    _set("D", "d-method", "d-func"),  # conflicts with A (method) and with the wraps on module_func
    _set("E", "e-const", "e-env", "e-table", "e-fresh"),  # value, item, create
    _set("F", "f-table", "f-table-new", "e-env"),  # shares e-env with E, conflicts with it on TABLE['k']
]

Model = dict[str, list[list[Any]]]  # site -> [[patch name, count], ...] bottom first


class Boom(Exception):
    """Raised inside a with block by the machine."""


def _enter(block: Any, expected: object, blocks: list[Any], count: Callable[[str], None]) -> None:
    """Enter ``block``: a conflict where the model predicted none (``expected`` None), else kept to exit later."""
    try:
        block.__enter__()
    except PatchConflictError:
        assert expected is None
        count("conflicts")
        return
    assert expected is not None
    blocks.append((block, expected))
    count("enters")


def _raise_inside(block: Any, claim: object, released: bool, blocks: list[Any], count: Callable[[str], None]) -> None:
    """Raise inside ``block``: a conflict on entry, a refused exit (the block stays, to be exited later), or released."""
    try:
        with block:
            raise Boom
    except PatchConflictError:
        assert claim is None
        count("conflicts")
    except PatchOwnershipError as exc:
        assert claim is not None and not released
        assert isinstance(exc.__context__, Boom)
        blocks.append((block, claim))  # its report stays: exiting it later retries
        count("refused_exits")
    except Boom:
        assert released
        count("raised_inside_with")


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
            elif patch.kind != "wrap" and stack:  # replace, value and item patches conflict with anything there
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
        _enter(block, self._model_apply(which), self.blocks, self._count)

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
        _raise_inside(block, claim, released, self.blocks, self._count)

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
            owner = entry.address.split("@")[0].rsplit(".", 1)[-1]
            seen.setdefault(f"{owner}.{entry.attr}", []).append([entry.patch, entry.count])
        assert seen == self.model

    @invariant()
    def pristine_when_nothing_active(self) -> None:
        self._count("steps")
        if not self.model:
            self.spaces.check()
            assert targets.module_func(1) == 2 and self.leaf.forward(1) == ("leaf", 1)
            assert targets.TABLE == {"k": targets.HANDLER} and targets.TABLE["k"] is targets.HANDLER
            assert ENV_KEY not in os.environ

    def teardown(self) -> None:
        self.reg.revert_all()
        self.spaces.check()
        self._count("examples")


TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = _settings(200, 50)


# -- two registries on the same targets ------------------------------------------------------------


_INSTALLS = itertools.count()


class Layer:
    """One install in the model: a registry's layer of a patch on one attribute, with its user count.

    ``seq`` orders installs across registries. The inherited machine also notes ``value``, what calling the
    attribute returns over this layer, and ``wraps``, the layer of a base class attribute this wrap calls.
    """

    __slots__ = ("count", "patch", "reg", "seq", "site", "value", "wraps")

    def __init__(self, reg: int, patch: str, site: str) -> None:
        self.reg, self.patch, self.site, self.count = reg, patch, site, 1
        self.seq = next(_INSTALLS)
        self.value: Any = None
        self.wraps: Layer | None = None

    def __repr__(self) -> str:
        return f"{'ab'[self.reg]}:{self.patch}x{self.count}"


class Claim:
    """The layers one apply took (one user each), in order; released once."""

    __slots__ = ("layers", "reg", "released")

    def __init__(self, reg: int, layers: list[Layer]) -> None:
        self.reg, self.layers, self.released = reg, layers, False


#: site -> (what calling the patched attribute returns now, what the original returns now)
PROBES: dict[str, tuple[Any, Any]] = {
    "targets.module_func": (lambda leaf: targets.module_func(1), lambda leaf: 2),
    "Child.method": (lambda leaf: targets.Child().method(), lambda leaf: "method"),
    "Child.static": (lambda leaf: targets.Child.static(3), lambda leaf: 6),
    "Child.klass": (lambda leaf: targets.Child.klass(), lambda leaf: "klass"),
    "Child.inherited": (lambda leaf: targets.Child().inherited(), lambda leaf: "base-inherited"),
    "Child.prop": (lambda leaf: targets.Child().prop, lambda leaf: "prop"),
    "Leaf.tag": (lambda leaf: leaf.tag() if callable(leaf.tag) else leaf.tag, lambda leaf: "leaf"),
    "Leaf.forward": (lambda leaf: leaf.forward(1), lambda leaf: (leaf.tag, 1)),
    "Leaf.backward": (lambda leaf: leaf.backward(1), lambda leaf: (leaf.tag, -1)),
}
REGS = st.integers(0, 1)


class LayerModel(RuleBasedStateMachine):
    """The two-registry model and the rules that only release (a report, a block, a rollback); no test of its own.

    One stack of layers per model site, shared by both registries. A subclass says where a patch goes
    (``_site``), what a new layer notes (``_placed``), what else keeps a layer from going (``_pinned``),
    which namespaces a refused release must leave alone (``_namespaces``) and how an install is named.
    """

    figures = "stateful2"  # the prefix of the figures this machine counts

    def __init__(self) -> None:
        super().__init__()
        self.regs = [Registry("stateful-a"), Registry("stateful-b")]
        self.stacks: dict[str, list[Layer]] = {}  # site -> layers of both registries, bottom first
        self.reports: list[tuple[Report, Claim]] = []  # applies not reverted yet (maybe rolled back)
        self.blocks: list[tuple[Any, Claim]] = []  # entered patched() blocks not exited yet
        self.checkpoints: dict[int, tuple[Checkpoint, list[Claim]]] = {}  # per registry: the applies since
        self.why = ""  # what the model's last prediction turned on (counted once the registry agreed)

    # -- what a subclass says -----------------------------------------------------------------

    def _site(self, patch: Patch, where: str) -> str:
        """The model site ``patch`` goes to when applied on the object named ``where``."""
        raise NotImplementedError

    def _placed(self, layer: Layer, stacks: dict[str, list[Layer]]) -> None:
        """Note what ``layer`` holds, just before it goes on top of ``stacks[layer.site]``."""

    def _pinned(self, layer: Layer, counts: dict[Layer, int], stacks: dict[str, list[Layer]]) -> bool:
        """Whether a layer elsewhere (still counted in ``counts``) keeps ``layer`` from being restored."""
        return False

    def _namespaces(self) -> list[Any]:
        """The namespaces a refused release must leave as they were."""
        raise NotImplementedError

    def _site_of(self, entry: Installed) -> str:
        """The model site of one of a registry's active installs."""
        raise NotImplementedError

    # -- the model ----------------------------------------------------------------------------

    def _model_apply(self, reg: int, patches: PatchSet, where: str = "") -> Claim | None:
        """The claim an apply takes, updating the model; None (model unchanged) on a conflict."""
        self.why = ""
        stacks = {site: stack[:] for site, stack in self.stacks.items()}
        shared: list[Layer] = []
        taken = []
        for patch in patches:
            site = self._site(patch, where)
            stack = stacks.setdefault(site, [])
            own = next((la for la in stack if la.reg == reg and la.patch == patch.name), None)
            if own is not None:  # counted, wherever it is
                shared.append(own)
                taken.append(own)
                continue
            if patch.kind != "wrap" and stack:  # replace, value and item patches
                # two replaces on one attribute conflict, as does a replace over a wrap; the same
                # patch over the other registry's install of it stacks
                if any(la.reg == reg for la in stack):
                    self.why = "own_conflicts"
                    return None
                if stack[-1].patch != patch.name:
                    self.why = "cross_conflicts"
                    return None
            if stack and stack[-1].reg != reg:  # on the other registry's layer: a wrap, or the same patch
                self.why = "same_patch_stacks" if stack[-1].patch == patch.name else "cross_stacks"
            layer = Layer(reg, patch.name, site)
            self._placed(layer, stacks)
            stack.append(layer)
            taken.append(layer)
        for layer in shared:
            layer.count += 1
        self.stacks = stacks
        claim = Claim(reg, taken)
        if reg in self.checkpoints:
            self.checkpoints[reg][1].append(claim)
        return claim

    def _model_release(self, claims: list[Claim]) -> int | None:
        """Release the claims (each last taken first) all or nothing; the restores, or None if refused."""
        self.why = ""
        stacks = {site: stack[:] for site, stack in self.stacks.items()}
        counts: dict[Layer, int] = {}
        restores = 0
        for claim in claims:
            if claim.released:
                continue
            for layer in reversed(claim.layers):
                left = counts.get(layer, layer.count)
                if left > 1:
                    counts[layer] = left - 1
                elif left == 1:
                    above = stacks[layer.site][-1]
                    if above is not layer:  # another layer (either registry's) sits on it
                        self.why = "refused_under_own" if above.reg == layer.reg else "refused_under_other"
                        return None
                    if self._pinned(layer, counts, stacks):
                        self.why = "refused_covered"
                        return None
                    stacks[layer.site].pop()
                    counts[layer] = 0
                    restores += 1
        for layer, left in counts.items():
            layer.count = left
        for claim in claims:
            claim.released = True
        self.stacks = {site: stack for site, stack in stacks.items() if stack}
        return restores

    def _own(self, reg: int, name: str, site: str) -> Layer | None:
        return next((la for la in self.stacks.get(site, []) if la.reg == reg and la.patch == name), None)

    def _count(self, key: str) -> None:
        for name in (key, self.why) if self.why else (key,):
            FIGURES[f"{self.figures}.{name}"] = FIGURES.get(f"{self.figures}.{name}", 0) + 1
        self.why = ""

    def _release_as_modelled(
        self, what: str, claims: list[Claim], release: Callable[[], Any]
    ) -> tuple[Any, int] | None:
        """Run ``release`` (a revert, an exit, a rollback) where the model predicts for ``claims``.

        None when it was refused, as predicted and changing nothing; else ``(its result, restores predicted)``.
        """
        expected = self._model_release(claims)
        before = Namespaces(self._namespaces())
        try:
            restored = release()
        except PatchOwnershipError as exc:
            assert expected is None, f"{what} refused, the model allowed it"
            self._refused(exc, before)
            self._count(f"refused_{what}s")
            return None
        assert expected is not None, f"{what} succeeded, the model refused it ({self.why})"
        return restored, expected

    def _refused(self, exc: PatchOwnershipError, before: Namespaces) -> None:
        """A refusal the model predicted changed nothing; one for a wrap below says which holder wraps it."""
        before.check()
        if self.why == "refused_covered":
            assert "which wraps it" in str(exc), str(exc)

    # -- rules that only release --------------------------------------------------------------

    @precondition(lambda self: self.reports)
    @rule(data=st.data())
    def revert(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.reports) - 1), label="report")
        report, claim = self.reports[index]
        done = self._release_as_modelled("revert", [claim], lambda: self.regs[claim.reg].revert(report))
        if done is None:
            return
        restored, expected = done
        assert restored == expected
        del self.reports[index]
        self._count("reverts")

    @precondition(lambda self: self.blocks)
    @rule(data=st.data())
    def exit(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.blocks) - 1), label="block")  # any order, either registry
        block, claim = self.blocks[index]
        if self._release_as_modelled("exit", [claim], lambda: block.__exit__(None, None, None)) is None:
            return
        del self.blocks[index]
        self._count("exits")

    @precondition(lambda self: len(self.checkpoints) < 2)
    @rule(reg=REGS)
    def checkpoint(self, reg: int) -> None:
        self.checkpoints[reg] = (self.regs[reg].checkpoint(), [])  # one it replaces is dropped (stops recording)
        self._count("checkpoints")

    @precondition(lambda self: self.checkpoints)
    @rule(data=st.data(), forget=st.booleans())
    def rollback(self, data: st.DataObject, forget: bool) -> None:
        reg = data.draw(st.sampled_from(sorted(self.checkpoints)), label="registry")
        checkpoint, since = self.checkpoints[reg]
        done = self._release_as_modelled("rollback", since[::-1], lambda: self.regs[reg].rollback(checkpoint))
        if done is None:
            return
        restored, expected = done
        assert restored == expected
        since.clear()
        if forget:  # dropped: applies from now on are not recorded
            del self.checkpoints[reg]
        self._count("rollbacks")

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def registries_match_model(self) -> None:
        for reg, registry in enumerate(self.regs):
            seen: dict[str, list[list[Any]]] = {}
            for entry in registry.active():
                seen.setdefault(self._site_of(entry), []).append([entry.patch, entry.count])
            mine = {s: [[la.patch, la.count] for la in stack if la.reg == reg] for s, stack in self.stacks.items()}
            assert seen == {s: layers for s, layers in mine.items() if layers}, f"registry {reg}"


class TwoRegistryMachine(LayerModel):
    """Random interleavings over two registries against one model of per-attribute layer stacks."""

    def __init__(self) -> None:
        super().__init__()
        self.leaf = targets.Leaf()
        self.spaces = Namespaces([targets, targets.Base, targets.Child, targets.Leaf, self.leaf])

    def _site(self, patch: Patch, where: str) -> str:
        return str(PATCHES[patch.name][1])

    def _namespaces(self) -> list[Any]:
        return [targets, targets.Base, targets.Child, targets.Leaf, self.leaf]

    def _site_of(self, entry: Installed) -> str:
        return f"{entry.address.split('@')[0].rsplit('.', 1)[-1]}.{entry.attr}"

    # -- rules --------------------------------------------------------------------------------

    @rule(reg=REGS, which=st.sampled_from(SETS))
    def apply(self, reg: int, which: PatchSet) -> None:
        expected = self._model_apply(reg, which)
        try:
            report = self.regs[reg].apply(which, self.leaf)
        except PatchConflictError:
            assert expected is None, f"apply({which.name}) in {reg} conflicted, the model did not"
            self._count("conflicts")
            return
        assert expected is not None, f"apply({which.name}) in {reg} should have conflicted"
        self.reports.append((report, expected))
        self._count("applies")

    @rule(reg=REGS, name=st.sampled_from(sorted(PATCHES)))
    def revert_patch(self, reg: int, name: str) -> None:
        """revert(patch, leaf): one user of this registry's layer of the patch, if it has one."""
        layer = self._own(reg, name, PATCHES[name][1])
        expected = 0 if layer is None else self._model_release([Claim(reg, [layer])])
        try:
            restored = self.regs[reg].revert(PATCHES[name][0], self.leaf)
        except PatchOwnershipError:
            assert expected is None, "revert(patch) refused, the model allowed it"
            self._count("refused_reverts")
            return
        assert restored == expected, f"revert({name}) in {reg} restored {restored}, the model said {expected}"
        self._count("patch_reverts")

    @rule(reg=REGS, which=st.sampled_from(SETS))
    def enter(self, reg: int, which: PatchSet) -> None:
        block = self.regs[reg].patched(which, self.leaf)
        _enter(block, self._model_apply(reg, which), self.blocks, self._count)

    @rule(reg=REGS, which=st.sampled_from(SETS))
    def raise_inside_with(self, reg: int, which: PatchSet) -> None:
        block = self.regs[reg].patched(which, self.leaf)
        claim = self._model_apply(reg, which)
        released = claim is not None and self._model_release([claim]) is not None
        _raise_inside(block, claim, released, self.blocks, self._count)

    @precondition(lambda self: len(self.reports) + len(self.blocks) >= 4)
    @rule(reg=REGS)
    def revert_all(self, reg: int) -> None:
        """Every layer of one registry: allowed when none has the other registry's layer above it."""
        blocked = any(
            la.reg == reg and any(up.reg != reg for up in stack[i + 1 :])
            for stack in self.stacks.values()
            for i, la in enumerate(stack)
        )
        before = {site: stack[:] for site, stack in self.stacks.items()}
        try:
            restored = self.regs[reg].revert_all()
        except PatchOwnershipError:
            assert blocked, "revert_all refused, the model allowed it"  # and nothing changed: the invariants
            self._count("refused_revert_alls")
            return
        assert not blocked, "revert_all succeeded under the other registry's layer"
        assert restored == sum(la.reg == reg for stack in before.values() for la in stack)
        for stack in before.values():
            for la in stack:
                if la.reg == reg:
                    la.count = 0
        self.stacks = {s: kept for s, stack in before.items() if (kept := [la for la in stack if la.reg != reg])}
        self._count("revert_alls")

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def attributes_behave_as_stacked(self) -> None:
        """Each attribute's stack, bottom up: a replace returns its name, a wrap tags what is below it."""
        for site, (observe, original) in PROBES.items():
            expected = original(self.leaf)
            for layer in self.stacks.get(site, []):
                kind = PATCHES[layer.patch][0].kind
                expected = layer.patch if kind == "replace" else (layer.patch[0], expected)
            assert observe(self.leaf) == expected, f"{site}: {self.stacks.get(site)}"

    @invariant()
    def pristine_when_nothing_active(self) -> None:
        self._count("steps")
        if not self.stacks:
            self.spaces.check()

    def teardown(self) -> None:
        try:  # release every top layer one user at a time, by patch, through the registry that holds it
            while self.stacks:
                site, stack = next(iter(self.stacks.items()))
                top = stack[-1]
                for _ in range(top.count):
                    self.regs[top.reg].revert(PATCHES[top.patch][0], self.leaf)
                stack.pop()
                if not stack:
                    del self.stacks[site]
        finally:  # after a failure: leave the targets clean for the rest of the suite (whatever is on top first)
            for _ in range(64):
                if all(registry.active() == () for registry in self.regs):
                    break
                for registry in self.regs:
                    for entry in registry.active():
                        with contextlib.suppress(PatchOwnershipError):
                            registry.revert(PATCHES[entry.patch][0], self.leaf)
        assert all(registry.active() == () for registry in self.regs)
        self.spaces.check()
        self._count("examples")


TestTwoRegistryMachine = TwoRegistryMachine.TestCase
TestTwoRegistryMachine.settings = _settings(200, 50)


def test_refused_revert_all_changes_nothing(pristine: Any) -> None:
    """revert_all() refused under another registry's layer says "Nothing was changed"; found by the machine above."""
    one, two = Registry("one"), Registry("two")
    d_method, d_func = PATCHES["d-method"][0], PATCHES["d-func"][0]
    try:
        one.apply(_set("D", "d-method", "d-func"))  # one's attributes: Child.method, then module_func
        two.apply(d_func)  # the same patch stacks over one's install on module_func
        with pytest.raises(PatchOwnershipError, match="Nothing was changed"):
            one.revert_all()
        assert [e.patch for e in one.active()] == ["d-method", "d-func"]
        assert vars(targets.Child)["method"] is d_method.replacement
    finally:
        two.revert_all()
        one.revert_all()
    pristine()


def test_install_over_own_layer_keeps_the_other_registrys_cover(pristine: Any) -> None:
    """The same replace stacked by two registries: the upper one wraps over its layer and unwraps; found by the machine.

    The lower registry's revert is then allowed and writes the original under the upper one's live install,
    whose own revert is refused from then on.
    """
    one, two = Registry("one"), Registry("two")
    d_func, wrap = PATCHES["d-func"][0], PATCHES["a-func-wrap"][0]
    original = vars(targets)["module_func"]
    refused = False
    try:
        one.apply(d_func)
        two.apply(d_func)  # the same patch stacks over one's install
        two.revert(two.apply(wrap))  # over two's own layer, and off again
        try:
            one.revert(d_func)  # two's d-func still sits on it
        except PatchOwnershipError:
            refused = True
    finally:
        if not refused:  # two's layer no longer sees its install: put it back so that it can be released
            targets.module_func = d_func.replacement
        two.revert_all()
        one.revert_all()
        targets.module_func = original
    assert refused
    pristine()


def test_rollback_after_a_release_by_patch(pristine: Any) -> None:
    """Two applies of one patch since a checkpoint, one user released by patch: rollback releases the other."""
    registry = Registry("one")
    d_func = PATCHES["d-func"][0]
    try:
        checkpoint = registry.checkpoint()
        registry.apply(d_func)
        registry.apply(d_func)
        assert registry.revert(d_func) == 0  # one user left
        assert registry.rollback(checkpoint) == 1
    finally:
        registry.revert_all()
    pristine()


# -- a base class attribute, a subclass inheriting it and its instances --------------------------------


class Base:
    """The inherited machine's base class: ``meth`` is patched here and inherited by Sub and Sub's instances."""

    def meth(self) -> Any:
        return "base"


class Sub(Base):
    """Inherits ``meth``; patched by import path (a wrap or a replace on Sub) and on its instances (selectors)."""


H = __name__  # import paths into this module: Base and Sub above
#: name -> (patch, model site: "Base", "Sub", or "" for the instance it is applied on)
INHERITED = {
    p.name: (p, site)
    for p, site in [
        (Patch("base-r1", f"{H}:Base.meth", plain("base-r1")), "Base"),
        (Patch("base-r2", f"{H}:Base.meth", plain("base-r2")), "Base"),
        (Patch("base-w1", f"{H}:Base.meth", tagging("base-w1"), kind="wrap"), "Base"),
        (Patch("base-w2", f"{H}:Base.meth", tagging("base-w2"), kind="wrap"), "Base"),
        (Patch("sub-w1", f"{H}:Sub.meth", tagging("sub-w1"), kind="wrap"), "Sub"),
        (Patch("sub-w2", f"{H}:Sub.meth", tagging("sub-w2"), kind="wrap"), "Sub"),
        (Patch("sub-r", f"{H}:Sub.meth", plain("sub-r")), "Sub"),
        (Patch("inst-w1", "meth", tagging("inst-w1"), kind="wrap"), ""),
        (Patch("inst-w2", "meth", tagging("inst-w2"), kind="wrap"), ""),
        (Patch("inst-r", "meth", plain("inst-r")), ""),
    ]
}


def _inherited(name: str, *patches: str) -> PatchSet:
    return PatchSet(name, [INHERITED[p][0] for p in patches])


INHERITED_SETS = [_inherited(name, name) for name in INHERITED] + [
    _inherited("R1+SW1", "base-r1", "sub-w1"),  # the wrap holds the replace the same apply installed
    _inherited("SW1+R1", "sub-w1", "base-r1"),  # the wrap first: it calls the original and holds nothing
    _inherited("BW1+IW1", "base-w1", "inst-w1"),
    _inherited("SR+IW2", "sub-r", "inst-w2"),
    _inherited("IR+R2", "inst-r", "base-r2"),
]
PARENTS = {"Base": (), "Sub": ("Base",)}  # an instance's: ("Sub", "Base")


class InheritedMachine(LayerModel):
    """Random interleavings over two registries on Base.meth, Sub (inheriting it) and Sub's instances.

    A wrap installed on Sub, or on an instance, where that holder has no ``meth`` of its own calls
    what it inherits; when that is a live install (the top layer of Sub's or Base's stack, either
    registry's), the wrap holds it: the model notes it as the wrap's ``wraps`` and refuses that layer's
    last release while the wrap lives. A layer notes what calling ``meth`` returns over it (a replace
    its name, a wrap ``(name, what it wrapped returned)``), so the model knows what ``inst.meth()``,
    ``Sub().meth()`` and ``Base().meth()`` return after each step. An instance is dropped (``del`` and
    ``gc.collect()``) and a new one takes its place: the dropped one's layers, and what its wraps held, go.
    The collector is frozen (``gc.freeze()``) while an example runs: ``gc.collect()`` then walks only what
    the example made (a full collection costs ~0.1 s once torch is imported).
    """

    figures = "stateful_inh"

    def __init__(self) -> None:
        gc.freeze()  # undone by teardown
        super().__init__()
        self.start = Namespaces([Base, Sub])
        self.insts: dict[str, Sub] = {}  # two live instances by model site ("i0", "i1", ...; never reused)
        self.made = 0
        self.fresh: list[Layer] = []  # the layers the last apply of the model placed
        for _ in range(2):
            self._make()

    def _make(self) -> None:
        self.insts[f"i{self.made}"] = Sub()
        self.made += 1

    # -- the model ----------------------------------------------------------------------------

    def _site(self, patch: Patch, where: str) -> str:
        return str(INHERITED[patch.name][1]) or where

    def _parents(self, site: str) -> tuple[str, ...]:
        return PARENTS.get(site, ("Sub", "Base"))

    def _call(self, site: str, stacks: dict[str, list[Layer]]) -> Any:
        """What calling ``meth`` on the holder ``site`` returns: its own top layer's value, else an inherited one."""
        for holder in (site, *self._parents(site)):
            if stacks.get(holder):
                return stacks[holder][-1].value
        return "base"

    def _placed(self, layer: Layer, stacks: dict[str, list[Layer]]) -> None:
        if INHERITED[layer.patch][0].kind == "replace":
            layer.value = layer.patch
        else:
            layer.value = (layer.patch, self._call(layer.site, stacks))
            if not stacks[layer.site]:  # nothing of its own there: it wraps what the holder inherits
                layer.wraps = next((stacks[p][-1] for p in self._parents(layer.site) if stacks.get(p)), None)
        self.fresh.append(layer)

    def _pinned(self, layer: Layer, counts: dict[Layer, int], stacks: dict[str, list[Layer]]) -> bool:
        return any(up.wraps is layer and counts.get(up, up.count) > 0 for stack in stacks.values() for up in stack)

    def _namespaces(self) -> list[Any]:
        return [Base, Sub, *self.insts.values()]

    def _site_of(self, entry: Installed) -> str:
        names = {f"Sub@{id(inst):#x}": site for site, inst in self.insts.items()}
        return names.get(entry.address, entry.address.rsplit(".", 1)[-1])

    def _held(self, site: str) -> bool:
        return any(block.obj is self.insts[site] for block, _claim in self.blocks)

    # -- rules --------------------------------------------------------------------------------

    @rule(reg=REGS, which=st.sampled_from(INHERITED_SETS), data=st.data())
    def apply(self, reg: int, which: PatchSet, data: st.DataObject) -> None:
        where = data.draw(st.sampled_from(sorted(self.insts)), label="instance")
        self.fresh = []
        expected = self._model_apply(reg, which, where)
        try:
            report = self.regs[reg].apply(which, self.insts[where])
        except PatchConflictError:
            assert expected is None, f"apply({which.name}) in {reg} conflicted, the model did not"
            self._count("conflicts")
            return
        assert expected is not None, f"apply({which.name}) in {reg} should have conflicted"
        assert report.installed == len(self.fresh)
        self.reports.append((report, expected))
        self._count("applies")
        for layer in self.fresh:
            if layer.wraps is not None:
                self._count("wraps_holding_" + ("another_registry" if layer.wraps.reg != reg else "own"))

    @rule(reg=REGS, name=st.sampled_from(sorted(INHERITED)), data=st.data())
    def revert_patch(self, reg: int, name: str, data: st.DataObject) -> None:
        """revert(patch, instance): one user of this registry's layer of the patch there, if it has one."""
        where = data.draw(st.sampled_from(sorted(self.insts)), label="instance")
        patch = INHERITED[name][0]
        layer = self._own(reg, name, self._site(patch, where))
        expected = 0 if layer is None else self._model_release([Claim(reg, [layer])])
        before = Namespaces(self._namespaces())
        try:
            restored = self.regs[reg].revert(patch, self.insts[where])
        except PatchOwnershipError as exc:
            assert expected is None, "revert(patch) refused, the model allowed it"
            self._refused(exc, before)
            self._count("refused_reverts")
            return
        assert expected is not None, f"revert({name}) in {reg} succeeded, the model refused it ({self.why})"
        assert restored == expected, f"revert({name}) in {reg} restored {restored}, the model said {expected}"
        self._count("patch_reverts")

    @rule(reg=REGS, which=st.sampled_from(INHERITED_SETS), data=st.data())
    def enter(self, reg: int, which: PatchSet, data: st.DataObject) -> None:
        where = data.draw(st.sampled_from(sorted(self.insts)), label="instance")
        block = self.regs[reg].patched(which, self.insts[where])
        _enter(block, self._model_apply(reg, which, where), self.blocks, self._count)

    @rule(reg=REGS, which=st.sampled_from(INHERITED_SETS), data=st.data())
    def raise_inside_with(self, reg: int, which: PatchSet, data: st.DataObject) -> None:
        where = data.draw(st.sampled_from(sorted(self.insts)), label="instance")
        block = self.regs[reg].patched(which, self.insts[where])
        claim = self._model_apply(reg, which, where)
        released = claim is not None and self._model_release([claim]) is not None
        _raise_inside(block, claim, released, self.blocks, self._count)

    @precondition(lambda self: len(self.reports) + len(self.blocks) >= 3)
    @rule(reg=REGS)
    def revert_all(self, reg: int) -> None:
        """Every layer of one registry, last installed first, each user: as one release of all of them."""
        mine = sorted((la for stack in self.stacks.values() for la in stack if la.reg == reg), key=lambda la: la.seq)
        expected = self._model_release([Claim(reg, [la for la in mine for _ in range(la.count)])])
        before = Namespaces(self._namespaces())
        try:
            restored = self.regs[reg].revert_all()
        except PatchOwnershipError as exc:
            assert expected is None, "revert_all refused, the model allowed it"
            self._refused(exc, before)
            self._count("refused_revert_alls")
            return
        assert expected is not None, f"revert_all succeeded, the model refused it ({self.why})"
        assert restored == expected == len(mine)
        self._count("revert_alls")

    def _droppable(self) -> list[str]:
        """The patched instances that no entered block holds (a block keeps its object alive)."""
        return [site for site in sorted(self.insts) if self.stacks.get(site) and not self._held(site)]

    @precondition(lambda self: self._droppable())
    @rule(data=st.data())
    def drop_instance(self, data: st.DataObject) -> None:
        """del + gc.collect() of a patched instance: it goes, with its layer and what its wrap held."""
        site = data.draw(st.sampled_from(self._droppable()), label="instance")
        layers = self.stacks.pop(site)
        ref = weakref.ref(self.insts[site])
        del self.insts[site]
        gc.collect()
        assert ref() is None, f"{site} was kept alive after its last reference went ({layers})"
        for layer in layers:
            layer.count = 0
        self._make()
        self._count("drops")

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def calls_return_the_stacked_values(self) -> None:
        """Each holder's ``meth()`` returns its own top layer's value, else what its class's returns."""
        for site, inst in self.insts.items():
            assert inst.meth() == self._call(site, self.stacks), f"{site}: {self.stacks}"
        assert Sub().meth() == self._call("Sub", self.stacks), f"Sub: {self.stacks}"
        assert Base().meth() == self._call("Base", self.stacks), f"Base: {self.stacks}"

    @invariant()
    def pristine_when_nothing_active(self) -> None:
        self._count("steps")
        if not self.stacks:
            self.start.check()
            assert all(vars(inst) == {} for inst in self.insts.values())

    def teardown(self) -> None:
        """Release every layer, last installed first (a wrap before what it holds), by patch, one user at a time."""
        try:
            for layer in sorted((la for s in self.stacks.values() for la in s), key=lambda la: la.seq, reverse=True):
                for _ in range(layer.count):
                    self.regs[layer.reg].revert(INHERITED[layer.patch][0], self.insts.get(layer.site))
            assert all(registry.active() == () for registry in self.regs)
            self.start.check()
            assert all(vars(inst) == {} for inst in self.insts.values())
        except BaseException:
            self._scrap()
            raise
        finally:
            gc.unfreeze()
        self._count("examples")

    def _scrap(self) -> None:
        """After a failure: Base and Sub as they were, and this example's registries gone (not seen by the next)."""
        for _ in range(8):
            for registry in self.regs:
                with contextlib.suppress(PatchOwnershipError):
                    registry.revert_all()
        for klass, snap in self.start.before:
            for attr in set(vars(klass)) - set(snap):
                delattr(klass, attr)
            for attr, value in snap.items():
                if vars(klass).get(attr) is not value:
                    setattr(klass, attr, value)
        self.regs.clear()
        self.reports.clear()
        self.blocks.clear()
        self.checkpoints.clear()
        gc.collect()


TestInheritedMachine = InheritedMachine.TestCase
TestInheritedMachine.settings = _settings(100, 40)


BASE_METH = vars(Base)["meth"]


def _clean(*registries: Registry) -> None:
    """Revert everything the registries hold, upper registries first, and check Base and Sub are as defined."""
    for registry in registries:
        registry.revert_all()
    assert "meth" not in vars(Sub) and vars(Base)["meth"] is BASE_METH


def test_refused_rollback_keeps_a_wraps_hold() -> None:
    """A rollback() refused after checking a layer an own wrap holds keeps that hold; found by the machine above."""
    registry = Registry("one")
    one, two = Sub(), Sub()
    base_w1, sub_r, inst_w1 = (INHERITED[n][0] for n in ("base-w1", "sub-r", "inst-w1"))
    try:
        first = registry.apply(base_w1)
        registry.apply(inst_w1, one)  # holds base-w1
        checkpoint = registry.checkpoint()
        registry.apply(base_w1)
        registry.revert(first)  # base-w1's last user is now an apply since the checkpoint
        held = registry.apply(sub_r)
        registry.apply(inst_w1, two)  # holds sub-r
        with pytest.raises(PatchOwnershipError, match="which wraps it"):
            registry.rollback(checkpoint)  # inst-w1 on two, sub-r, then base-w1: refused (one's wrap holds it)
        with pytest.raises(PatchOwnershipError, match="which wraps it"):
            registry.revert(held)
        assert two.meth() == ("inst-w1", "sub-r")
    finally:
        _clean(registry)


def test_instance_with_two_layers_is_freed_when_dropped() -> None:
    """An instance dropped with two layers on it (two applies, one registry) is freed by gc.collect()."""
    registry = Registry("one")
    inst = Sub()
    registry.apply(INHERITED["inst-r"][0], inst)
    registry.apply(INHERITED["inst-w1"][0], inst)
    ref = weakref.ref(inst)
    del inst
    try:
        gc.collect()
        assert ref() is None
        assert registry.active() == ()
    finally:
        _clean(registry)
