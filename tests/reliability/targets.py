"""Targets of every kind for the reliability tests, kept apart from the engine tests' sample module."""

from __future__ import annotations

import functools


def module_func(x: int) -> int:
    """A module-level function."""
    return x + 1


def other_func(x: int) -> int:
    """A second module-level function."""
    return x - 1


class Base:
    """A base class whose method is inherited by Child."""

    def inherited(self) -> str:
        return "base-inherited"


class Child(Base):
    """Every kind of class attribute."""

    def method(self) -> str:
        return "method"

    def other(self) -> str:
        return "other"

    @staticmethod
    def static(x: int) -> int:
        return x * 2

    @classmethod
    def klass(cls) -> str:
        return "klass"

    @property
    def prop(self) -> str:
        return "prop"

    @functools.cached_property
    def cached(self) -> str:
        return "cached"


class Leaf:
    """A plain object patched through selectors; ``tag`` is an instance attribute present from the start."""

    def __init__(self, tag: str = "leaf") -> None:
        self.tag = tag

    def forward(self, x: int) -> tuple[str, int]:
        return (self.tag, x)

    def backward(self, x: int) -> tuple[str, int]:
        return (self.tag, -x)


class Tree:
    """A model-like tree: ``tree.blocks[*].forward`` and ``tree.head.forward``."""

    def __init__(self, n: int = 2) -> None:
        self.blocks = [Leaf(f"block{i}") for i in range(n)]
        self.head = Leaf("head")


class Slotted:
    """Instances have no ``__dict__``."""

    __slots__ = ("value",)

    def method(self) -> str:
        return "slotted"


class SlottedNoWeakref:
    """Instances have a ``__dict__`` but cannot be weakly referenced."""

    __slots__ = ("__dict__",)

    def method(self) -> str:
        return "no-weakref"


#: A module constant (not callable).
CONSTANT = 41

#: An instance reached by an import path (import paths patch modules and classes, not instances).
LEAF = Leaf("module-level")

HANDLER = object()
#: a registry dict, for mapping-item patches
TABLE: dict[str, object] = {"k": HANDLER}
