"""Guards (in patchreg._plans): the check of a traced walk holds exactly while a new walk would find the same holders."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from patchreg import Selector
from patchreg._plans import guard_check, trace

SELECTOR = Selector("mtp.layers[*].forward")


class _Layer(torch.nn.Module):
    """An MTP layer stand-in: a torch module with a forward (the walk is torch's own ModuleList)."""

    def forward(self, x: Any) -> Any:
        return x


class _Other(_Layer):
    """Another class of layer."""


def _model(n: int) -> torch.nn.Module:
    model = torch.nn.Module()
    model.mtp = torch.nn.Module()
    model.mtp.layers = torch.nn.ModuleList(_Layer() for _ in range(n))
    return model


def _holders(model: Any) -> list[int] | None:
    traced = trace(SELECTOR, model)
    return None if traced is None else [id(site.holder) for site in traced[0]]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_check_is_the_one_generic_check_for_every_layer_count(n: int) -> None:
    """The check of ``model.mtp.layers[*]`` is the one generic check (no shape of its own) for 1, 2, 3 or 5 layers."""
    model = _model(n)
    sites, guards = trace(SELECTOR, model)  # type: ignore[misc]
    check = guard_check(guards)
    assert check.__name__ == "check" and len(sites) == n and check(model)


def _replace(model: Any) -> None:
    model.mtp.layers[0] = _Layer()


def _append(model: Any) -> None:
    model.mtp.layers.append(_Layer())


def _remove(model: Any) -> None:
    del model.mtp.layers[len(model.mtp.layers) - 1]


def _swap_class(model: Any) -> None:
    model.mtp.__class__ = type("Mtp", (torch.nn.Module,), {})


def _shadow(model: Any) -> None:
    model.__dict__["mtp"] = model.mtp  # the instance dict now serves it: walked another way


def _new_list(model: Any) -> None:
    model.mtp.layers = torch.nn.ModuleList(model.mtp.layers)  # the same layers in a new list: still the same holders


def _reorder(model: Any) -> None:
    modules = model.mtp.layers._modules
    first = next(iter(modules))
    modules[first] = modules.pop(first)  # the same layers under the same keys, in another order


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("change", [_replace, _append, _remove, _swap_class, _shadow, _new_list, _reorder])
def test_the_check_holds_exactly_while_a_new_walk_finds_the_same_holders(n: int, change: Any) -> None:
    """After each change to the walked tree the check says True exactly when a new trace finds the same holders."""
    model = _model(n)
    before = _holders(model)
    _sites, guards = trace(SELECTOR, model)  # type: ignore[misc]
    check = guard_check(guards)
    change(model)
    after = _holders(model)
    assert check(model) is False or after == before  # it holds only where a new walk finds the same, in order
