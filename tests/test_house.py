"""The house rules DESIGN.md states hold in the tree: module sizes, and patch sets on the public API only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import patchreg

ROOT = Path(__file__).resolve().parents[1]
ENGINE = sorted((ROOT / "patchreg").glob("*.py"))
PATCH_SETS = sorted((ROOT / "patches").rglob("*.py"))
MODULE_MAX = 600  # a module over this is asking to be split along a concept
FACADE_MAX = 450  # the registry is a facade over the store, the plans and the checks


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: p.name)
def test_no_engine_module_is_over_600_lines(path: Path) -> None:
    """Every module of patchreg/ has at most 600 lines."""
    assert _lines(path) <= MODULE_MAX, f"{path.name} has {_lines(path)} lines; split it along a concept"


def test_the_registry_is_a_facade() -> None:
    """patchreg/_registry.py has at most 450 lines."""
    assert _lines(ROOT / "patchreg" / "_registry.py") <= FACADE_MAX


def _private_uses(tree: ast.AST) -> list[str]:
    """Where a module reaches past patchreg's public names: a submodule import, a name not in ``__all__``."""
    public = set(patchreg.__all__)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("patchreg.")]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module.startswith("patchreg."):
                found.append(f"from {node.module} import ...")
            elif node.module == "patchreg":
                found += [f"from patchreg import {a.name}" for a in node.names if a.name not in public]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "patchreg":
            found += [f"patchreg.{node.attr} (line {node.lineno})"] if node.attr not in public else []
    return found


@pytest.mark.parametrize("path", PATCH_SETS, ids=lambda p: str(p.relative_to(ROOT)))
def test_patch_sets_use_only_public_names(path: Path) -> None:
    """A module of patches/ imports and reads only names in ``patchreg.__all__``."""
    assert _private_uses(ast.parse(path.read_text())) == []


def test_the_import_check_catches_a_private_use() -> None:
    """The check above refuses each way of reaching past the public API."""
    source = "import patchreg._store\nfrom patchreg._plans import Plan\nfrom patchreg import _store\npatchreg._lazy\n"
    assert len(_private_uses(ast.parse(source))) == 4
    assert _private_uses(ast.parse("from patchreg import Patch\npatchreg.registry\n")) == []
