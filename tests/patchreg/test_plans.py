"""Plans: a Patch or PatchSet resolved once on an object, re-used only while resolving again would agree.

Every test changes the object between two applies and checks the second apply patches exactly what a
fresh resolution finds (and nothing the first one found but no longer belongs), then restores exactly.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

import patchreg
from patchreg import Patch, PatchSet, Registry, check
from tests.patchreg.helpers import plain, snapshot


class Node:
    """A module-like object: children live in ``_children`` and are served by ``__getattr__`` (as nn.Module)."""

    def __init__(self, tag: str = "node", **children: Any) -> None:
        self.tag = tag
        self._children: dict[str, Any] = dict(children)

    def __getattr__(self, name: str) -> Any:
        children = self.__dict__.get("_children", {})
        if name in children:
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


def planned(registry: Registry, m: Node, target: Any = SET) -> None:
    """Two applies: the second makes the plan (an object patched once is never traced)."""
    cycle(registry, m, target)
    cycle(registry, m, target)
    assert any(p.matches(target, m) for p in registry._plans.values())


def test_a_plan_is_made_on_the_second_apply_and_reused() -> None:
    registry, m = Registry("t"), model()
    cycle(registry, m)
    assert registry._plans == {}
    cycle(registry, m)
    (plan,) = registry._plans.values()
    cycle(registry, m)
    assert list(registry._plans.values()) == [plan] and registry._last is plan
    assert plan.flat is not None and len(plan.flat) == 3


@pytest.mark.parametrize("n", [1, 2, 12])  # guards: one element is compared alone, more in one map
@pytest.mark.parametrize("at", [0, -1])
def test_replaced_layer_is_patched_and_the_old_one_is_not(n: int, at: int) -> None:
    registry, m = Registry("t"), model(n)
    planned(registry, m)
    i = at % n
    old = m.mtp.layers._children[str(i)]
    m.mtp.layers.replace(i, Node("new"))
    with registry.patched(SET, m):
        tags = [f"layer{k}" for k in range(n)]
        tags[i] = "new"
        assert patched_tags(m) == tags
        assert "forward" not in vars(old)
    assert patched_tags(m) == []


class Named(dict[str, Any]):
    """A ModuleDict-like mapping: ``[*]`` selects its values."""


def test_mapping_walks_and_nested_walks_are_guarded() -> None:
    registry = Registry("t")
    inner = [Layers(Node("a0"), Node("a1")), Layers(Node("b0"))]
    tree = Node("tree", heads=Named(x=Node("x"), y=Node("y")), grid=Layers(*inner))
    heads = Patch("heads", "heads[*].forward", plain("h"))
    grid = Patch("grid", "grid[*][*].forward", plain("g"))  # the inner walks' containers are elements, not reads
    both = PatchSet("walks", (heads, grid))
    for _ in range(3):
        with registry.patched(both, tree) as report:
            assert report.installed == 5
    assert registry._last is not None and registry._last.flat is not None
    tree.heads["z"] = Node("z")
    inner[1].replace(0, Node("b0-new"))
    with registry.patched(both, tree) as report:
        assert report.installed == 6
        assert [tree.heads[k].forward(0) for k in "xyz"] == ["h", "h", "h"]
        assert inner[1]._children["0"].forward(0) == "g" and inner[1]._children["0"].tag == "b0-new"
    assert all("forward" not in vars(node) for node in [*tree.heads.values(), *inner[0], *inner[1]])


def test_appended_layer_is_patched() -> None:
    registry, m = Registry("t"), model()
    planned(registry, m)
    m.mtp.layers.append(Node("layer2"))
    with registry.patched(SET, m) as report:
        assert patched_tags(m) == ["layer0", "layer1", "layer2"]
        assert report.installed == 4


def test_replaced_intermediate_is_followed() -> None:
    registry, m = Registry("t"), model()
    planned(registry, m)
    m._children["mtp"] = Node("mtp2", layers=Layers(Node("other")))
    with registry.patched(SET, m):
        assert patched_tags(m) == ["other"]


def test_replaced_link_in_a_chain_is_followed() -> None:
    registry, m = Registry("t"), model()
    planned(registry, m)
    m.mtp._children["layers"] = Layers(Node("relinked"))
    with registry.patched(SET, m):
        assert patched_tags(m) == ["relinked"]


def test_shadowing_instance_attribute_is_followed() -> None:
    registry, m = Registry("t"), model()
    planned(registry, m)
    m.mtp = Node("shadow", layers=Layers(Node("shadowed")))  # instance __dict__ wins over __getattr__
    with registry.patched(SET, m):
        assert patched_tags(m) == ["shadowed"]


def test_class_swap_of_a_holder_replans() -> None:
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


def test_a_foreign_value_in_the_namespace_takes_the_checked_path_and_is_restored() -> None:
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
    registry, m = Registry("t"), model()
    planned(registry, m)
    with registry.patched(SET, m) as outer:
        with registry.patched(SET, m) as inner:
            assert inner.installed == 0 and outer.installed == 3
            assert {e.count for e in inner.entries} == {2}
        assert patched_tags(m) == ["layer0", "layer1"]
    assert patched_tags(m) == []


def test_stale_holder_half_way_leaves_nothing_behind() -> None:
    registry, m = Registry("t"), model()
    planned(registry, m)
    (plan,) = registry._plans.values()
    layer = m.mtp.layers._children["1"]
    layer.__class__ = type("Other", (Node,), {})  # found stale at the second layer, after two installs
    with registry.patched(SET, m) as report:
        assert report.installed == 3
    assert registry._plans[plan.key] is not plan
    assert patched_tags(m) == [] and "forward" not in vars(m)


def test_plans_hold_no_strong_reference() -> None:
    registry = Registry("t")
    m = model()
    layers = list(m.mtp.layers)
    planned(registry, m)
    refs = [weakref.ref(o) for o in (m, m.mtp, *layers)]
    del m, layers
    gc.disable()
    try:
        assert [r() for r in refs] == [None] * len(refs)  # freed by reference counting alone
        assert registry._plans == {}
    finally:
        gc.enable()


def test_temporary_patch_sets_do_not_accumulate_plans() -> None:
    registry, m = Registry("t"), model()
    for i in range(20):
        temporary = PatchSet(f"tmp{i}", (Patch("p", "mtp.layers[*].forward", plain(i)),))
        for _ in range(2):
            with registry.patched(temporary, m):
                pass
        del temporary
    assert len(registry._plans) <= 1


def test_first_applies_are_remembered_boundedly() -> None:
    registry = Registry("t")
    for _ in range(5000):
        registry.revert(registry.apply(FORWARD, model(1)))
    assert registry._plans == {} and len(registry._seen) <= 4096


def test_chunk_lists_are_planned_per_chunk() -> None:
    registry, a, b = Registry("t"), model(1), model(1)
    for _ in range(3):
        with registry.patched(FORWARD, [a, b]) as report:
            assert report.installed == 2
    b.mtp.layers.replace(0, Node("fresh"))
    with registry.patched(FORWARD, [a, b]):
        assert patched_tags(b) == ["fresh"]


@pytest.mark.parametrize("first", ["planned", "fresh"])
def test_strict_still_raises_on_a_planned_skip(first: str) -> None:
    gated = Patch("never", "forward", plain(0), when=check(lambda: (False, "never applies"), "never"))
    registry, m = Registry("t"), model()
    if first == "planned":
        registry.apply(gated, m)
        registry.apply(gated, m)
    with pytest.raises(patchreg.TargetNotFoundError, match="never applies"):
        registry.apply(gated, m, strict=True)


def planned_alone(registry: Registry, obj: Any, target: Any) -> None:
    """Two applies of ``target`` alone (no patch on ``obj`` itself, whose class the plan checks anyway)."""
    for _ in range(2):
        registry.revert(registry.apply(target, obj))
    assert any(p.matches(target, obj) for p in registry._plans.values())


@pytest.mark.parametrize("swapped", ["model", "mtp"])
def test_class_swap_of_an_intermediate_replans(swapped: str) -> None:
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
    with registry.patched(FORWARD, m) as report:
        assert report.installed == 1 and other.forward(1) == "patched"  # type: ignore[comparison-overlap]
        assert [o.tag for o in old if "forward" in vars(o)] == []
    assert [snapshot(o) for o in (*old, other)] == before


def test_class_swap_of_an_intermediate_module_replans() -> None:
    nn = pytest.importorskip("torch.nn")

    class Leaf(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag

        def forward(self, x: int) -> tuple[str, int]:
            return (self.tag, x)

    class Block(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, *tags: str) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Leaf(t) for t in tags])

    other = Block("other0")

    class Root(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.mtp = Block("l0", "l1")

    class RootWithProp(Root):
        @property
        def mtp(self) -> Any:  # type: ignore[override]  # a data descriptor: wins over nn.Module._modules
            return other

    registry, root = Registry("t"), Root()
    planned_alone(registry, root, FORWARD)
    old = list(root.mtp.layers)
    before = [snapshot(o) for o in (*old, *other.layers)]
    root.__class__ = RootWithProp
    with registry.patched(FORWARD, root) as report:
        assert report.installed == 1 and root.mtp.layers[0].forward(0) == "patched"
        assert [o.tag for o in old if "forward" in vars(o)] == []
    assert [snapshot(o) for o in (*old, *other.layers)] == before
    assert root.mtp.layers[0].forward(0) == ("other0", 0)


MISSING = Patch("missing", "nothing[*].forward", plain("never"))  # resolved at every apply: no flat plan


@pytest.mark.parametrize("target", [FORWARD, PatchSet("with-miss", (FORWARD, MISSING))], ids=["flat", "work"])
def test_a_method_deleted_from_the_class_is_not_patched(target: Any) -> None:
    class Leaf:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def forward(self, x: int) -> tuple[str, int]:
            return (self.tag, x)

    registry, m = Registry("t"), Node("model", mtp=Node("mtp", layers=Layers(Leaf("a"), Leaf("b"))))
    for _ in range(2):
        with registry.patched(target, m) as report:
            assert report.installed == 2
    (plan,) = registry._plans.values()
    assert (plan.flat is not None) == (target is FORWARD)
    leaves = list(m.mtp.layers)
    before = [snapshot(leaf) for leaf in leaves]
    del Leaf.forward
    with registry.patched(target, m) as report:  # as a fresh resolution: nothing to patch
        assert report.installed == 0
        assert ("forward", "mtp.layers[0] has no attribute 'forward'") in report.skipped
        assert [snapshot(leaf) for leaf in leaves] == before
    assert [snapshot(leaf) for leaf in leaves] == before


def test_a_method_replaced_on_the_class_replans() -> None:
    class Leaf:
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def forward(self, x: int) -> tuple[str, int]:
            return (self.tag, x)

    registry, m = Registry("t"), Node("model", mtp=Node("mtp", layers=Layers(Leaf("a"))))
    planned_alone(registry, m, FORWARD)
    (plan,) = registry._plans.values()
    leaf = next(iter(m.mtp.layers))
    before = snapshot(leaf)
    Leaf.forward = staticmethod(plain("static"))  # type: ignore[method-assign]
    with registry.patched(FORWARD, m):  # the plan's bind mode was worked out for the old attribute
        assert registry._plans.get(plan.key) is not plan
        planned_install = vars(leaf)["forward"]
        assert leaf.forward(1) == "patched"
    assert snapshot(leaf) == before
    with Registry("fresh").patched(FORWARD, m):
        assert type(vars(leaf)["forward"]) is type(planned_install)
    assert snapshot(leaf) == before and leaf.forward(1) == "static"


def test_a_classmethod_is_planned_by_what_the_class_stores() -> None:
    class Leaf:
        @classmethod
        def forward(cls, x: int) -> tuple[str, int]:  # getattr(Leaf, "forward"): a new bound method each time
            return (cls.__name__, x)

    registry, leaf = Registry("t"), Leaf()
    m = Node("model", mtp=Node("mtp", layers=Layers(leaf)))
    planned_alone(registry, m, FORWARD)
    (plan,) = registry._plans.values()
    assert plan.flat is not None  # the stored classmethod is the same object at every apply
    for _ in range(2):
        with registry.patched(FORWARD, m) as report:
            assert report.installed == 1 and leaf.forward(1) == "patched"  # type: ignore[comparison-overlap]
        assert vars(leaf) == {} and leaf.forward(1) == ("Leaf", 1)
        assert registry._plans.get(plan.key) is plan
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
