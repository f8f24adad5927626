"""Targets of every kind for the engine's tests: functions, methods, descriptors, nesting, slots."""

from __future__ import annotations

import functools


def module_func(x: int) -> int:
    """A module-level function."""
    return x + 1


CONSTANT = 41


class Base:
    """A base class whose methods are inherited."""

    def inherited(self) -> str:
        return "base"

    def method(self) -> str:
        return "base-method"


class Child(Base):
    """Every kind of class attribute."""

    def method(self) -> str:
        return "child-method"

    @staticmethod
    def static(x: int) -> int:
        return x * 2

    @classmethod
    def klass(cls) -> str:
        return cls.__name__

    @property
    def prop(self) -> str:
        return "prop"

    @functools.cached_property
    def cached(self) -> str:
        return "cached"

    class Nested:
        """A nested class."""

        def deep(self) -> str:
            return "deep"


class Slotted:
    """Instances have no __dict__."""

    __slots__ = ("value",)

    def method(self) -> str:
        return "slotted"


class Leaf:
    """A plain object used as a selector holder."""

    def __init__(self, tag: str = "leaf") -> None:
        self.tag = tag

    def forward(self, x: int) -> tuple[str, int]:
        return (self.tag, x)


class Tree:
    """A model-like tree: tree.blocks[*].forward, tree.head.forward."""

    def __init__(self, n: int = 2) -> None:
        self.blocks = [Leaf(f"block{i}") for i in range(n)]
        self.head = Leaf("head")

    def forward(self, x: int) -> int:
        return x


class Wrapper:
    """A DDP/Float16Module-like wrapper exposing .module."""

    def __init__(self, module: object) -> None:
        self.module = module


class VLM:
    """A vision-language model exposing .language_model."""

    def __init__(self, language_model: object) -> None:
        self.language_model = language_model
