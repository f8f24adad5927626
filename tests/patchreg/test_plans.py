"""Plans: a Patch or PatchSet resolved once on an object, re-used only while resolving again would agree.

Every test changes the object between two applies and checks the second apply patches exactly what a
fresh resolution finds (and nothing the first one found but no longer belongs), then restores exactly.
Everything is observed from outside: reports, the objects patched and restored, call results, and, for
"a plan was made / re-used / found stale", whether an apply walked the model: a resolution reads each
child through the model's ``__getattr__`` (counted in :data:`SERVED`), a planned apply re-checks its
guards on the instance dicts and calls no ``__getattr__`` (docs/guides/patches.md, "Plans").
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import patchreg
from patchreg import Patch, PatchSet, Registry, check
from tests.patchreg.helpers import assert_same_namespace, plain, snapshot

SERVED = [0]  # children served by a test model's __getattr__: what a resolution walks through


class Node:
    """A module-like object: children live in ``_children`` and are served by ``__getattr__`` (as nn.Module)."""

    def __init__(self, tag: str = "node", **children: Any) -> None:
        self.tag = tag
        self._children: dict[str, Any] = dict(children)

    def __getattr__(self, name: str) -> Any:
        children = self.__dict__.get("_children", {})
        if name in children:
            SERVED[0] += 1
            return children[name]
        raise AttributeError(name)

    def forward(self, x: int) -> tuple[str, int]:
        return (self.tag, x)


class Layers:
    """An nn.ModuleList-like container: iterable, weakly referenceable, elements in a dict."""

    def __init__(self, *items: Any) -> None:
        self._children = {str(i): item for i, item in enumerate(items)}

    def __iter__(self) -> Any:
        return iter(self._children.values())

    def __len__(self) -> int:
        return len(self._children)

    def append(self, item: Any) -> None:
        self._children[str(len(self._children))] = item

    def replace(self, i: int, item: Any) -> None:
        self._children[str(i)] = item


def model(n: int = 2) -> Node:
    return Node("model", mtp=Node("mtp", layers=Layers(*(Node(f"layer{i}") for i in range(n)))))


FORWARD = Patch("forward", "mtp.layers[*].forward", plain("patched"))
OWN = Patch("own", "forward", plain("own"))
SET = PatchSet("plans", (OWN, FORWARD))


def patched_tags(m: Node) -> list[str]:
    return [layer.tag for layer in m.mtp.layers if "forward" in vars(layer)]


def cycle(registry: Registry, m: Node, target: Any = SET) -> patchreg.Report:
    with registry.patched(target, m) as report:
        assert m.forward(1) == "own"
        assert all(layer.forward(1) == "patched" for layer in m.mtp.layers)
    return report


@contextmanager
def block(registry: Registry, target: Any, obj: Any) -> Iterator[tuple[patchreg.Report, int]]:
    """A ``patched`` block, with how many children its apply had served (0: it walked nothing, a plan held)."""
    before = SERVED[0]
    with registry.patched(target, obj) as report:
        yield report, SERVED[0] - before


def walked(registry: Registry, target: Any, obj: Any) -> int:
    """How many children one apply (reverted at once) had served: 0 when it re-used a plan."""
    with block(registry, target, obj) as (_report, walks):
        return walks


def planned(registry: Registry, m: Node, target: Any = SET) -> None:
    """Two applies: the first makes the plan, the second re-uses it."""
    cycle(registry, m, target)
    assert walked(registry, target, m) == 0


def test_a_plan_is_made_by_the_first_apply_and_reused() -> None:
    """The first apply resolves and keeps its plan, and every later one re-uses it, walking nothing."""
    registry, m = Registry("t"), model()
    walks = []
    for _ in range(4):
        with block(registry, SET, m) as (report, walked_now):
            assert report.installed == 3 and patched_tags(m) == ["layer0", "layer1"] and m.forward(1) == "own"
            walks.append(walked_now)
        assert patched_tags(m) == [] and "forward" not in vars(m)
    assert walks[0] > 0 and walks[1:] == [0, 0, 0]


@pytest.mark.parametrize("n", [1, 2, 12])  # guards: one element is compared alone, more in one map
@pytest.mark.parametrize("at", [0, -1])
def test_replaced_layer_is_patched_and_the_old_one_is_not(n: int, at: int) -> None:
    """A layer replaced after the plan was made is patched, and the layer it replaced is left alone."""
    registry, m = Registry("t"), model(n)
    planned(registry, m)
    i = at % n
    old = m.mtp.layers._children[str(i)]
    m.mtp.layers.replace(i, Node("new"))
    with block(registry, SET, m) as (_report, walks):
        assert walks > 0  # the guard saw the replacement: resolved again
        tags = [f"layer{k}" for k in range(n)]
        tags[i] = "new"
        assert patched_tags(m) == tags
        assert "forward" not in vars(old)
    assert patched_tags(m) == []


class Named(dict[str, Any]):
    """A ModuleDict-like mapping: ``[*]`` selects its values."""


def test_mapping_walks_and_nested_walks_are_guarded() -> None:
    """A key added to a walked mapping and an element replaced in a nested walk are both caught by the guards."""
    registry = Registry("t")
    inner = [Layers(Node("a0"), Node("a1")), Layers(Node("b0"))]
    tree = Node("tree", heads=Named(x=Node("x"), y=Node("y")), grid=Layers(*inner))
    heads = Patch("heads", "heads[*].forward", plain("h"))
    grid = Patch("grid", "grid[*][*].forward", plain("g"))  # the inner walks' containers are elements, not reads
    both = PatchSet("walks", (heads, grid))
    for _ in range(3):
        with block(registry, both, tree) as (report, walks):
            assert report.installed == 5
    assert walks == 0  # the third apply re-used the plan the second made
    tree.heads["z"] = Node("z")
    old = inner[1]._children["0"]  # kept alive: only the guard tells it was replaced
    inner[1].replace(0, Node("b0-new"))
    with block(registry, both, tree) as (report, walks):
        assert walks > 0 and report.installed == 6
        assert [tree.heads[k].forward(0) for k in "xyz"] == ["h", "h", "h"]
        assert inner[1]._children["0"].forward(0) == "g" and inner[1]._children["0"].tag == "b0-new"
        assert "forward" not in vars(old)
    assert all("forward" not in vars(node) for node in [*tree.heads.values(), *inner[0], *inner[1], old])


def test_appended_layer_is_patched() -> None:
    """A layer appended after the plan was made is patched too."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    m.mtp.layers.append(Node("layer2"))
    with registry.patched(SET, m) as report:
        assert patched_tags(m) == ["layer0", "layer1", "layer2"]
        assert report.installed == 4


def test_replaced_intermediate_is_followed() -> None:
    """A submodule replaced in its parent's children after the plan was made is followed to its own layers."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    old = list(m.mtp.layers)  # kept alive: only the guard tells they are no longer on the path
    m._children["mtp"] = Node("mtp2", layers=Layers(Node("other")))
    with registry.patched(SET, m):
        assert patched_tags(m) == ["other"] and all("forward" not in vars(layer) for layer in old)


def test_replaced_link_in_a_chain_is_followed() -> None:
    """A layer list replaced half-way along the chain after the plan was made is followed."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    old = list(m.mtp.layers)  # kept alive: only the guard tells they are no longer on the path
    m.mtp._children["layers"] = Layers(Node("relinked"))
    with registry.patched(SET, m):
        assert patched_tags(m) == ["relinked"] and all("forward" not in vars(layer) for layer in old)


def test_shadowing_instance_attribute_is_followed() -> None:
    """An instance attribute set over a child served by ``__getattr__`` is followed, as ``getattr`` would."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    m.mtp = Node("shadow", layers=Layers(Node("shadowed")))  # instance __dict__ wins over __getattr__
    with registry.patched(SET, m):
        assert patched_tags(m) == ["shadowed"]


def test_class_swap_of_a_holder_replans() -> None:
    """A holder whose class is swapped after the plan was made is patched and restored as a fresh apply would."""

    class Sub(Node):
        def forward(self, x: int) -> tuple[str, int]:
            return ("sub", x)

    registry, m = Registry("t"), model()
    planned(registry, m)
    layer = m.mtp.layers._children["0"]
    layer.__class__ = Sub
    with registry.patched(SET, m):
        assert layer.forward(1) == "patched"
    assert layer.forward(1) == ("sub", 1)


def test_refresh_re_evaluates_predicates() -> None:
    """A plan keeps its predicate answers until ``patchreg.refresh()``, after which they are asked again."""
    answer = [True]
    gated = Patch("gated", "forward", plain("gated"), when=check(lambda: (answer[0], "the flag"), "flag"))
    registry, m = Registry("t"), model()
    for _ in range(2):
        with registry.patched(gated, m) as report:
            assert report.installed == 1
    answer[0] = False
    with registry.patched(gated, m) as report:  # cached answer: still installs
        assert report.installed == 1
    patchreg.refresh()
    with registry.patched(gated, m) as report:
        assert report.installed == 0 and report.skipped == (("gated", "the flag"),)


def test_refresh_during_a_resolution_makes_no_plan_of_its_answers() -> None:
    """An apply whose resolution ran while ``refresh()`` was called keeps no plan of the answers it had before:
    the next apply asks the predicate again."""
    state = {"ok": True, "refresh_in_walk": False}
    gated = Patch(
        "gated",
        "mtp.layers[*].forward",
        plain("patched"),
        when=check(lambda: (state["ok"], "gate"), "the gate is open"),
    )

    class Refreshing(Node):
        def __getattr__(self, name: str) -> Any:
            if state["refresh_in_walk"]:  # the gate turns, and refresh() runs, while this apply resolves
                state["refresh_in_walk"], state["ok"] = False, False
                patchreg.refresh()
            return super().__getattr__(name)

    registry, m = Registry("t"), model()
    m.__class__ = Refreshing
    state["refresh_in_walk"] = True
    with registry.patched(gated, m) as first:  # the apply that would keep a plan: answered before refresh()
        assert first.installed == 2
    with registry.patched(gated, m) as second:
        assert second.installed == 0 and second.skipped == (("gated", "gate"),)
    assert patched_tags(m) == []


def test_a_foreign_value_in_the_namespace_takes_the_checked_path_and_is_restored() -> None:
    """A value someone else set in a planned holder's namespace is patched over and put back exactly."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    layer = m.mtp.layers._children["0"]
    mine = plain("mine")
    layer.forward = mine
    before = snapshot(layer)
    with registry.patched(SET, m):
        assert layer.forward(1) == "patched"
    assert snapshot(layer) == before and vars(layer)["forward"] is mine


def test_unplannable_walks_resolve_every_time() -> None:
    """A walk over a plain list (which guards cannot follow) is resolved again at every apply."""
    from tests.patchreg.sample import Leaf, Tree

    registry, tree = Registry("t"), Tree(2)  # blocks is a plain list: no weak references, no guard
    blocks = Patch("blocks", "blocks[*].forward", plain("b"))
    for _ in range(2):
        with registry.patched(blocks, tree):
            pass
    tree.blocks.append(Leaf("block2"))
    with registry.patched(blocks, tree) as report:
        assert report.installed == 3
        assert all(b.forward(0) == "b" for b in tree.blocks)


def test_nested_blocks_share_through_a_plan() -> None:
    """A planned block nested in another shares the outer block's installs and leaves them to it."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    with registry.patched(SET, m) as outer:
        with registry.patched(SET, m) as inner:
            assert inner.installed == 0 and outer.installed == 3
            assert {e.count for e in inner.entries} == {2}
        assert patched_tags(m) == ["layer0", "layer1"]
    assert patched_tags(m) == []


def test_a_shared_install_after_a_clean_one_counts_each_once() -> None:
    """A planned apply whose first install is clean and whose later ones an outer block holds installs the first
    once, counts a user of the others, and each block's exit restores exactly what it took."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    before = [snapshot(o) for o in (m, *m.mtp.layers)]
    with registry.patched(FORWARD, m) as outer:  # the layers' installs, held by an outer block only
        with block(registry, SET, m) as (inner, walks):
            assert walks == 0  # the plan, not a resolution
            assert inner.installed == 1 and m.forward(1) == "own"
            assert sorted((e.patch, e.count) for e in inner.entries) == [("forward", 2), ("forward", 2), ("own", 1)]
        assert "forward" not in vars(m) and patched_tags(m) == ["layer0", "layer1"]
        assert {e.count for e in outer.entries} == {1}
    for snap, obj in zip(before, (m, *m.mtp.layers), strict=True):
        assert_same_namespace(snap, obj)


def test_a_stale_holder_met_on_the_general_way_resolves_again() -> None:
    """A planned apply that takes the general way (an install shared) and then finds a holder of another class
    resolves again: it patches what a fresh resolution finds and leaves nothing of its own behind."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    layer = m.mtp.layers._children["1"]
    with registry.patched(FORWARD, m):  # layer0's and layer1's installs shared: the planned apply goes the general way
        layer.__class__ = type("Other", (Node,), {})  # and finds layer1 of another class
        with block(registry, SET, m) as (inner, walks):
            assert walks > 0 and inner.installed == 1 and m.forward(1) == "own"
        assert "forward" not in vars(m) and patched_tags(m) == ["layer0", "layer1"]
    assert patched_tags(m) == [] and "forward" not in vars(m)


def test_stale_holder_half_way_leaves_nothing_behind() -> None:
    """A plan found stale after some of its installs undoes them, resolves again and is replaced by a new plan."""
    registry, m = Registry("t"), model()
    planned(registry, m)
    layer = m.mtp.layers._children["1"]
    layer.__class__ = type("Other", (Node,), {})  # found stale at the second layer, after two installs
    with block(registry, SET, m) as (report, walks):
        assert walks > 0 and report.installed == 3 and layer.forward(1) == "patched"
        assert m.forward(1) == "own" and patched_tags(m) == ["layer0", "layer1"]
    assert patched_tags(m) == [] and "forward" not in vars(m)
    assert walked(registry, SET, m) == 0  # the apply that found it stale made a new plan


def test_plans_hold_no_strong_reference() -> None:
    """A planned model and its layers are freed by reference counting alone once the caller drops them."""
    registry = Registry("t")
    m = model()
    layers = list(m.mtp.layers)
    planned(registry, m)
    refs = [weakref.ref(o) for o in (m, m.mtp, *layers)]
    del m, layers
    gc.disable()
    try:
        assert [r() for r in refs] == [None] * len(refs)  # freed by reference counting alone
    finally:
        gc.enable()


def test_plans_of_dead_objects_do_not_accumulate() -> None:
    """A plan goes with its object: of twenty models planned and dropped, at most the last one's class lives on."""
    registry, classes = Registry("t"), []
    for i in range(20):
        kind = type(f"Layer{i}", (Node,), {})  # a plan holds its holders' classes strongly, its objects weakly
        m = Node("model", mtp=Node("mtp", layers=Layers(kind(f"layer{i}"))))
        planned_alone(registry, m, FORWARD)
        classes.append(weakref.ref(kind))
        del kind, m
    gc.collect()
    assert sum(r() is not None for r in classes) <= 1


def test_temporary_patch_sets_do_not_accumulate_plans() -> None:
    """A plan goes with its patch set: of twenty temporary sets planned and dropped, none lives on (not even the
    last one used, which the registry checks first at its next apply)."""
    registry, m, replacements = Registry("t"), model(), []
    for i in range(20):
        replacement = plain(i)  # a plan holds its patches (and so their replacements) strongly
        temporary = PatchSet(f"tmp{i}", (Patch("p", "mtp.layers[*].forward", replacement),))
        for _ in range(2):
            with registry.patched(temporary, m):
                assert [layer.forward(0) for layer in m.mtp.layers] == [i, i]
        assert walked(registry, temporary, m) == 0
        replacements.append(weakref.ref(replacement))
        del temporary, replacement
    gc.collect()
    assert sum(r() is not None for r in replacements) == 0


def test_chunk_lists_are_planned_per_chunk() -> None:
    """A list of model chunks is planned as one, and a layer replaced in one chunk is caught by its guard."""
    registry, a, b = Registry("t"), model(1), model(1)
    for _ in range(3):
        with block(registry, FORWARD, [a, b]) as (report, walks):
            assert report.installed == 2
    assert walks == 0
    old = b.mtp.layers._children["0"]  # kept alive: only the guard tells it was replaced
    b.mtp.layers.replace(0, Node("fresh"))
    with block(registry, FORWARD, [a, b]) as (_report, walks):
        assert walks > 0 and patched_tags(b) == ["fresh"] and patched_tags(a) == ["layer0"]
        assert "forward" not in vars(old)


@pytest.mark.parametrize("first", ["planned", "fresh"])
def test_strict_still_raises_on_a_planned_skip(first: str) -> None:
    """``strict=True`` raises on a predicate's skip whether the apply is planned or fresh."""
    gated = Patch("never", "forward", plain(0), when=check(lambda: (False, "never applies"), "never"))
    registry, m = Registry("t"), model()
    if first == "planned":
        registry.apply(gated, m)
        registry.apply(gated, m)
    with pytest.raises(patchreg.TargetNotFoundError, match="never applies"):
        registry.apply(gated, m, strict=True)


def planned_alone(registry: Registry, obj: Any, target: Any) -> None:
    """Two applies of ``target`` alone (no patch on ``obj`` itself, whose class the plan checks anyway); a third
    re-uses the plan."""
    for _ in range(2):
        registry.revert(registry.apply(target, obj))
    assert walked(registry, target, obj) == 0


@pytest.mark.parametrize("swapped", ["model", "mtp"])
def test_class_swap_of_an_intermediate_replans(swapped: str) -> None:
    """A class swapped on the model or a submodule on the path (bringing a property) makes the apply resolve again."""
    other = Node("other")

    class ModelSub(Node):
        mtp = property(lambda self: Node("mtp2", layers=Layers(other)))  # wins over __getattr__'s _children

    class MtpSub(Node):
        layers = property(lambda self: Layers(other))

    registry, m = Registry("t"), model()
    planned_alone(registry, m, FORWARD)  # no patch on the model itself: only the guards see the swap
    old = list(m.mtp.layers)
    before = [snapshot(o) for o in (*old, other)]
    if swapped == "model":
        m.__class__ = ModelSub
    else:
        m.mtp.__class__ = MtpSub
    with block(registry, FORWARD, m) as (report, walks):
        assert walks > 0 and report.installed == 1 and other.forward(1) == "patched"  # type: ignore[comparison-overlap]
        assert [o.tag for o in old if "forward" in vars(o)] == []
    assert [snapshot(o) for o in (*old, other)] == before


MISSING = Patch("missing", "nothing[*].forward", plain("never"))  # resolved at every apply: no flat plan


@pytest.mark.parametrize("target", [FORWARD, PatchSet("with-miss", (FORWARD, MISSING))], ids=["flat", "work"])
def test_a_method_deleted_from_the_class_is_not_patched(target: Any) -> None:
    """A method deleted from its class after the plan was made is skipped as a fresh apply would, touching nothing."""

    class Leaf:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def forward(self, x: int) -> tuple[str, int]:
            return (self.tag, x)

    registry, m = Registry("t"), Node("model", mtp=Node("mtp", layers=Layers(Leaf("a"), Leaf("b"))))
    for _ in range(2):
        with registry.patched(target, m) as report:
            assert report.installed == 2
    assert walked(registry, target, m) == 0  # planned (test_plans_internal: flat for one, per patch for the other)
    leaves = list(m.mtp.layers)
    before = [snapshot(leaf) for leaf in leaves]
    del Leaf.forward
    with registry.patched(target, m) as report:  # as a fresh resolution: nothing to patch
        assert report.installed == 0
        assert ("forward", "mtp.layers[0] has no attribute 'forward'") in report.skipped
        assert [snapshot(leaf) for leaf in leaves] == before
    assert [snapshot(leaf) for leaf in leaves] == before


def test_a_method_replaced_on_the_class_replans() -> None:
    """A method replaced on its class by a ``staticmethod`` after the plan was made is bound as a fresh apply binds."""

    class Leaf:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def forward(self, x: int) -> tuple[str, int]:
            return (self.tag, x)

    registry, m = Registry("t"), Node("model", mtp=Node("mtp", layers=Layers(Leaf("a"))))
    planned_alone(registry, m, FORWARD)
    leaf = next(iter(m.mtp.layers))
    before = snapshot(leaf)
    Leaf.forward = staticmethod(plain("static"))  # type: ignore[method-assign]
    with block(registry, FORWARD, m) as (_report, walks):  # the plan's bind mode was worked out for the old attribute
        assert walks > 0  # so it is stale: resolved again
        resolved_install = vars(leaf)["forward"]
        assert leaf.forward(1) == "patched"
    assert snapshot(leaf) == before
    with block(registry, FORWARD, m) as (_report, walks):  # re-planned for the new attribute
        assert walks == 0 and leaf.forward(1) == "patched"
        planned_install = vars(leaf)["forward"]
    assert snapshot(leaf) == before
    with Registry("fresh").patched(FORWARD, m):
        assert type(vars(leaf)["forward"]) is type(resolved_install) is type(planned_install)
    assert snapshot(leaf) == before and leaf.forward(1) == "static"


def test_a_classmethod_is_planned_by_what_the_class_stores() -> None:
    """A classmethod (a new bound method at every read) is planned by the object its class stores, and re-used."""

    class Leaf:
        @classmethod
        def forward(cls, x: int) -> tuple[str, int]:  # getattr(Leaf, "forward"): a new bound method each time
            return (cls.__name__, x)

    registry, leaf = Registry("t"), Leaf()
    m = Node("model", mtp=Node("mtp", layers=Layers(leaf)))
    planned_alone(registry, m, FORWARD)  # the stored classmethod is the same object at every apply
    for _ in range(2):
        with block(registry, FORWARD, m) as (report, walks):
            assert walks == 0 and report.installed == 1 and leaf.forward(1) == "patched"  # type: ignore[comparison-overlap]
        assert vars(leaf) == {} and leaf.forward(1) == ("Leaf", 1)
    del Leaf.forward
    with registry.patched(FORWARD, m) as report:
        assert report.installed == 0 and vars(leaf) == {}


def _args(*args: Any) -> int:
    return len(args)


@pytest.mark.parametrize("where", ["own class", "subclass"])
def test_a_function_rewrapped_as_staticmethod_replans(where: str) -> None:
    """``staticmethod(f)`` over ``f`` reads the same through getattr; the plan still binds as a fresh apply does."""

    class Base:
        forward = _args

    class Leaf(Base):
        pass

    owner = Base if where == "own class" else Leaf  # the subclass shadows the base's attribute
    registry, leaf = Registry("t"), Leaf()
    m = Node("model", mtp=Node("mtp", layers=Layers(leaf)))
    counting = Patch("forward", "mtp.layers[*].forward", _args)
    for _ in range(2):
        with registry.patched(counting, m):
            assert leaf.forward(1) == 2  # bound as a method: the leaf and 1
    owner.forward = staticmethod(_args)  # type: ignore[assignment]
    assert Leaf.forward is _args  # what a getattr-based check would compare
    with registry.patched(counting, m):
        assert leaf.forward(1) == 1  # not bound, as the class's own attribute is not
    with Registry("fresh").patched(counting, m):
        assert leaf.forward(1) == 1
    assert vars(leaf) == {} and leaf.forward(1) == 1


class Alternating:
    """A container whose every iteration yields the other of two element lists; it logs what each yielded."""

    def __init__(self, first: Any, second: Any) -> None:
        self.lists = ([second], [first])
        self.log: list[Any] = []

    def __iter__(self) -> Any:
        items = self.lists[len(self.log) % 2]
        self.log.append(items[0])
        return iter(items)


def test_a_walk_selects_the_elements_its_guard_recorded() -> None:
    """A container that yields different elements at every iteration has patched what this apply's iteration found."""
    a, b = Node("a"), Node("b")
    host = Node("host", layers=Alternating(a, b))
    registry = Registry("t")
    for _ in range(4):
        before = len(host.layers.log)
        with registry.patched(FORWARD_ON_LAYERS, host):
            patched = [o for o in (a, b) if "forward" in vars(o)]
            assert len(patched) == 1
            assert patched[0] in host.layers.log[before:]  # what this apply's own iteration found
        assert "forward" not in vars(a) and "forward" not in vars(b)


FORWARD_ON_LAYERS = Patch("layers", "layers[*].forward", plain("patched"))
