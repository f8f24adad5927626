"""Plans on real ``torch.nn`` modules: a ``model.mtp.layers[*]`` walk re-used only while a fresh resolution agrees.

The guards of a walk through ``nn.Module._modules`` and an ``nn.ModuleList`` take their own path (the shape
every Megatron-Core MTP patch has), so each way of rebuilding such a model between two applies is checked
here: the apply after the change patches exactly what a fresh resolution finds, leaves what it no longer
finds alone, and the exit restores everything. "A plan was re-used" is observed as in ``test_plans``: a
resolution reads children through the modules' ``__getattr__`` (counted), a planned apply reads none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from patchreg import Patch, PatchSet, Registry
from tests.patchreg.helpers import plain, snapshot

nn = pytest.importorskip("torch.nn")

SERVED = [0]  # children served by the modules' __getattr__: what a resolution walks through


class Counting(nn.Module):  # type: ignore[misc,name-defined]
    """nn.Module's own ``__getattr__`` (children from ``_modules``), counted."""

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        SERVED[0] += 1
        return value


class Leaf(nn.Module):  # type: ignore[misc,name-defined]
    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def probe(self) -> str:
        return self.tag


class Block(Counting):
    def __init__(self, *tags: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Leaf(t) for t in tags])

    def probe(self) -> str:
        return "block"


class Root(Counting):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.mtp = Block(*(f"layer{i}" for i in range(n)))

    def probe(self) -> str:
        return "root"


class OtherList(nn.ModuleList):  # type: ignore[misc,name-defined]
    """A ModuleList subclass: a class swap of the list the guards walk."""


ELSEWHERE = nn.ModuleList([Leaf("elsewhere")])


class BlockWithProperty(Block):
    @property
    def layers(self) -> Any:  # type: ignore[override]  # a data descriptor: wins over nn.Module._modules
        return ELSEWHERE


class RootWithProperty(Root):
    @property
    def mtp(self) -> Any:  # type: ignore[override]
        return OTHER_BLOCK


OTHER_BLOCK = Block("other")


LAYERS = Patch("layers", "mtp.layers[*].probe", plain("patched"))
OWN = Patch("own", "probe", plain("own"))
SET = PatchSet("modules", (OWN, LAYERS))
#: the block's own method too: its guard reads model.mtp twice, which the general guard check follows
MIXED = PatchSet("modules-mixed", (OWN, Patch("block", "mtp.probe", plain("block patched")), LAYERS))


def patched(root: Root) -> list[str]:
    """The tags of the layers whose ``probe`` is patched, as a fresh resolution finds the layers now."""
    mtp = root.mtp
    if mtp is None:
        return []
    return [layer.tag for layer in mtp.layers if "probe" in vars(layer)]


def walks(registry: Registry, root: Root, target: Patch | PatchSet = SET) -> tuple[int, list[str], int]:
    """One block: (children its apply had served, the layers patched inside it, installs)."""
    before = SERVED[0]
    with registry.patched(target, root) as report:
        served = SERVED[0] - before
        inside = patched(root)
        assert root.probe() == ("root" if target is LAYERS else "own")
        installed = sum(1 for entry in report.entries if entry.patch == "layers")
    assert "probe" not in vars(root)
    return served, inside, installed


def _replace_layer(root: Root) -> None:
    root.mtp.layers[0] = Leaf("new")


def _append_layer(root: Root) -> None:
    root.mtp.layers.append(Leaf("extra"))


def _delete_layer(root: Root) -> None:
    del root.mtp.layers[-1]


def _replace_list(root: Root) -> None:
    root.mtp.layers = nn.ModuleList([Leaf("relisted")])


def _replace_block(root: Root) -> None:
    root.mtp = Block("reblocked", "second")


def _shadow_block(root: Root) -> None:
    root.__dict__["mtp"] = Block("shadow")  # an instance attribute wins over nn.Module.__getattr__


def _shadow_list(root: Root) -> None:
    object.__setattr__(root.mtp, "layers", nn.ModuleList([Leaf("shadowed")]))


def _replace_modules_dict(root: Root) -> None:
    object.__setattr__(root.mtp, "_modules", {"layers": nn.ModuleList([Leaf("redict")])})


def _drop_block(root: Root) -> None:
    root.mtp = None  # nn.Module keeps None in _modules: the selector finds no layers


def _swap_list_class(root: Root) -> None:
    root.mtp.layers.__class__ = OtherList


def _swap_block_class(root: Root) -> None:
    root.mtp.__class__ = BlockWithProperty


def _swap_root_class(root: Root) -> None:
    root.__class__ = RootWithProperty


CHANGES: dict[str, Callable[[Root], None]] = {
    "block class swapped": _swap_block_class,
    "root class swapped": _swap_root_class,
    "layer replaced": _replace_layer,
    "layer appended": _append_layer,
    "layer deleted": _delete_layer,
    "list replaced": _replace_list,
    "block replaced": _replace_block,
    "block shadowed": _shadow_block,
    "list shadowed": _shadow_list,
    "_modules replaced": _replace_modules_dict,
    "block set to None": _drop_block,
    "list class swapped": _swap_list_class,
}


@pytest.mark.parametrize("n", [1, 2, 3])  # one MTP layer has its own straight-line guard
def test_an_unchanged_model_re_uses_its_plan(n: int) -> None:
    """The second apply on an unchanged model walks nothing and patches the same layers."""
    registry, root = Registry("t"), Root(n)
    assert walks(registry, root)[0] > 0
    assert walks(registry, root) == (0, [f"layer{i}" for i in range(n)], n)


@pytest.mark.parametrize("target", [SET, LAYERS, MIXED], ids=["with-the-root", "layers-alone", "with-the-block"])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_rebuilt_model_is_patched_where_a_fresh_resolution_finds(change: str, n: int, target: Any) -> None:
    """After each change the apply resolves again, patches what a fresh resolution finds, and restores all.

    With the root patched too its own install checks its class; alone, the layers' guards must. With the block's
    own method patched as well, the guards take the general check instead of the straight-line one."""
    registry, root = Registry("t"), Root(n)
    for _ in range(3):
        walks(registry, root, target)
    old = [*root.mtp.layers]  # kept alive: only the guards tell they may no longer be on the path
    before = [snapshot(o) for o in old]
    CHANGES[change](root)
    expected = [layer.tag for layer in root.mtp.layers] if root.mtp is not None else []
    layers_now = {id(layer) for layer in root.mtp.layers} if root.mtp is not None else set()
    served, inside, installed = walks(registry, root, target)
    assert served > 0, "the guards missed the change: the apply re-used a stale plan"
    assert inside == expected and installed == len(expected)
    assert [o.tag for o in old if id(o) not in layers_now and "probe" in vars(o)] == []
    assert patched(root) == []
    assert [snapshot(o) for o in old] == before  # restored exactly, found or not


def test_a_model_changed_back_re_plans_and_then_re_uses() -> None:
    """A change found stale makes a fresh plan, which the next apply re-uses again (walking nothing)."""
    registry, root = Registry("t"), Root(1)
    for _ in range(3):
        walks(registry, root)
    _replace_layer(root)
    assert walks(registry, root)[0] > 0
    walks(registry, root)
    assert walks(registry, root) == (0, ["new"], 1)
