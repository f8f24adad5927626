"""The house rules hold in the tree (issue 17's acceptance list): module sizes, patch sets on the public API only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import patchreg

ROOT = Path(__file__).resolve().parents[1]
ENGINE = sorted((ROOT / "patchreg").rglob("*.py"))
PATCH_SETS = sorted((ROOT / "patches").rglob("*.py"))
BENCHMARKS = sorted((ROOT / "benchmarks").rglob("*.py"))
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


#: patchreg's public modules besides the package itself
PUBLIC_MODULES = {"patchreg.exceptions", "patchreg.testing", "patchreg.distributed"}


def _private_uses(tree: ast.AST) -> list[str]:
    """Where a module reaches past patchreg's public names: a private submodule, a name not in ``__all__``, or a
    private attribute (``_x``, not a dunder) read through a name bound to patchreg or to one of its public names."""
    public = set(patchreg.__all__)
    found: list[str] = []
    bound: set[str] = set()  # local names bound to patchreg or to its public names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "patchreg" or (alias.name.startswith("patchreg.") and alias.asname is None):
                    bound.add(alias.asname or "patchreg")  # (import patchreg.x binds patchreg too)
                if alias.name.startswith("patchreg.") and alias.name not in PUBLIC_MODULES:
                    found.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module.startswith("patchreg.") and node.module not in PUBLIC_MODULES:
                found.append(f"from {node.module} import ...")
            elif node.module == "patchreg":
                for alias in node.names:
                    if alias.name in public:
                        bound.add(alias.asname or alias.name)
                    else:
                        found.append(f"from patchreg import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            module_name = node.value.id == "patchreg" or node.value.id not in public
            if private or (module_name and node.attr not in public and f"patchreg.{node.attr}" not in PUBLIC_MODULES):
                found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


@pytest.mark.parametrize("path", PATCH_SETS + BENCHMARKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_patch_sets_and_benchmarks_use_only_public_names(path: Path) -> None:
    """A module of patches/ or benchmarks/ imports and reads only names in ``patchreg.__all__``."""
    assert _private_uses(ast.parse(path.read_text())) == []


def test_the_import_check_catches_a_private_use() -> None:
    """The check above refuses each way of reaching past the public API it knows, and lets the public ones by."""
    source = (
        "import patchreg._store\nfrom patchreg._plans import Plan\nfrom patchreg import _store\npatchreg._lazy\n"
        "import patchreg as pr\npr._store\nfrom patchreg import registry\nregistry._plans\n"
    )
    assert len(_private_uses(ast.parse(source))) == 6
    fine = (
        "import patchreg\nfrom patchreg import Patch, Patched\npatchreg.registry\nPatched.__init__\n"
        "from patchreg.exceptions import PatchError\nimport patchreg.testing\n"
    )
    assert _private_uses(ast.parse(fine)) == []
