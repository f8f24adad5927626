"""Targets (``_targets``): import paths and their skip reasons."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from patchreg import Patch, Registry, UnpatchableTargetError
from patchreg._targets import import_path_meant, parse_import_path
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


def test_a_dotted_target_naming_a_module_is_answered_with_the_import_path() -> None:
    """'json.dumps' applied without an object is told to write 'json:dumps', not only to pass obj=."""
    with pytest.raises(UnpatchableTargetError) as info:
        Registry("t").apply(Patch("p", "json.dumps", plain(1)))
    assert "write the import path 'json:dumps'" in str(info.value)


def test_the_import_path_meant_is_the_longest_module_prefix_found_without_importing() -> None:
    """A deep dotted name gets 'package.module:Qual.attr'; a selector whose head is no module gets no hint."""
    assert import_path_meant("tests.patchreg.sample.Child.method") == "tests.patchreg.sample:Child.method"
    if "wsgiref.simple_server" not in sys.modules:  # found, not imported
        assert import_path_meant("wsgiref.simple_server.WSGIServer.serve_forever") == (
            "wsgiref.simple_server:WSGIServer.serve_forever"
        )
        assert "wsgiref.simple_server" not in sys.modules and "wsgiref" not in sys.modules
    assert import_path_meant("os.path.join") == "os.path:join"
    assert import_path_meant("mtp.layers[*].forward") == ""
    assert import_path_meant("config.mtp_detach_heads") == ""
    assert import_path_meant("forward") == ""


def test_a_module_given_to_a_selector_is_told_its_import_path() -> None:
    """A selector applied to a module names the import path of that module's attribute."""
    with pytest.raises(UnpatchableTargetError) as info:
        Registry("t").apply(Patch("p", "module_func", plain(1)), sample)
    assert "use an import path such as 'tests.patchreg.sample:module_func'" in str(info.value)
