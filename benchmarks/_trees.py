"""Plain objects for the engine-only measurements: call-overhead targets and nn.Module trees of N targets."""

from __future__ import annotations

from typing import Any

import torch


class ReplaceByRegistry:
    """Its ``step`` is replaced on the class by the registry."""

    def step(self, x: Any) -> Any:
        return x


class ReplaceByHand:
    """Its ``step`` is replaced on the class by hand (``cls.step = f``)."""

    def step(self, x: Any) -> Any:
        return x


class WrapByRegistry:
    """Its ``step`` is wrapped on the class by the registry."""

    def step(self, x: Any) -> Any:
        return x


class WrapByWrapt:
    """Its ``step`` is wrapped on the class by ``wrapt.wrap_function_wrapper``."""

    def step(self, x: Any) -> Any:
        return x


class Plain:
    """An instance target: its ``step`` is replaced or wrapped on the instance."""

    def step(self, x: Any) -> Any:
        return x


def fast_step(self: Any, x: Any) -> Any:
    """The replacement: the same body as the original."""
    return x


def passthrough(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """The wrapper: calls through unchanged."""
    return wrapped(*args, **kwargs)


class Leaf(torch.nn.Module):
    """Stands in for an MTP layer: one method to patch."""

    def _get_embeddings(self, x: Any) -> Any:
        return x


class Tree(torch.nn.Module):
    """A model whose ``mtp.layers`` hold ``n`` leaves: ``n`` targets for ``mtp.layers[*]._get_embeddings``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.mtp = torch.nn.Module()
        self.mtp.layers = torch.nn.ModuleList(Leaf() for _ in range(n))


def leaf_embeddings(self: Any, x: Any) -> Any:
    """The replacement installed on every leaf."""
    return x
