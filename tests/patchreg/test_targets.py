"""Targets (``_targets``): import paths and their skip reasons."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from patchreg import Patch, Registry
from patchreg._targets import parse_import_path
from tests.patchreg import sample
from tests.patchreg.helpers import plain


@pytest.fixture
def lazy_module() -> Iterator[types.ModuleType]:
    """A module whose ``Leaf``, ``Made`` and ``FLAG`` are served by its module-level ``__getattr__``."""
    served = {"Leaf": sample.Leaf, "Made": lambda: 1, "FLAG": True}

    def __getattr__(name: str) -> Any:
        try:
            return served[name]
        except KeyError:
            raise AttributeError(name) from None

    mod = types.ModuleType("lazy_targets_xyz")
    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def test_getattr_served_class_suggests_where_it_is_defined(lazy_module: types.ModuleType) -> None:
    """A class served by a module __getattr__ is skipped with a valid import path where it is defined."""
    reason = Registry("t").apply(Patch("p", "lazy_targets_xyz:Leaf", plain(1))).skipped[0][1]
    assert "e.g. 'tests.patchreg.sample:Leaf'" in reason
    assert parse_import_path("tests.patchreg.sample:Leaf").resolve() == [(sample, "Leaf")]


@pytest.mark.parametrize("name", ["Made", "FLAG"])
def test_getattr_served_lambda_or_value_suggests_no_invalid_target(lazy_module: types.ModuleType, name: str) -> None:
    """A lambda or a plain value served by __getattr__ gets no '<locals>'/'<lambda>' target in the skip reason."""
    reason = Registry("t").apply(Patch("p", f"lazy_targets_xyz:{name}", plain(1))).skipped[0][1]
    assert "<locals>" not in reason and "<lambda>" not in reason and "e.g. '" not in reason
    assert "patch the code that uses it" in reason
