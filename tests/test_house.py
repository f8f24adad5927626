"""The house rules hold in the tree (issues 17 and 34): module sizes, no import cycle, every engine module mapped and
tested, no private name read across engine modules, patch sets and benchmarks on the public API only."""

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
ARCHITECTURE = ROOT / "docs" / "guides" / "architecture.md"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: p.name)
def test_no_engine_module_is_over_600_lines(path: Path) -> None:
    """Every module of patchreg/ has at most 600 lines."""
    assert _lines(path) <= MODULE_MAX, f"{path.name} has {_lines(path)} lines; split it along a concept"


def _module(path: Path) -> str:
    return path.stem


def _engine_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports anywhere: at the top, inside functions and under ``TYPE_CHECKING``."""
    names = {_module(p) for p in ENGINE}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module == "patchreg":  # from patchreg import _explain (a module) or a public name (the package)
                found.update(a.name if a.name in names else "__init__" for a in node.names)
            elif node.module.startswith("patchreg."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("patchreg."))
    return found - {_module(path)}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_engine_import_graph_has_no_cycle() -> None:
    """No engine module imports, even inside a function or under TYPE_CHECKING, one that imports it back."""
    graph = {_module(p): _engine_imports(p) for p in ENGINE}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    """The cycle check finds a two-module and a three-module cycle, and passes a chain."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_every_engine_module_is_in_the_architecture_guide_in_import_order() -> None:
    """docs/guides/architecture.md's table names every module of patchreg/, each after every module it imports."""
    rows = [
        line.split("|")[1].strip().strip("`")
        for line in ARCHITECTURE.read_text().splitlines()
        if line.startswith("| `")
    ]
    order = {name: i for i, name in enumerate(rows)}
    assert sorted(rows) == sorted(_module(p) for p in ENGINE)
    for path in ENGINE:
        later = [m for m in _engine_imports(path) if order[m] > order[_module(path)]]
        assert later == [], f"{_module(path)} imports {later}, listed after it"


#: engine modules whose tests live in a file named otherwise
TESTED_IN = {
    "__init__": "test_registry.py",
    "__main__": "test_cli.py",
    "testing": "test_testing_plugin.py",
}


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: p.name)
def test_every_engine_module_has_a_test_file(path: Path) -> None:
    """Each module of patchreg/ has its own test file in tests/patchreg/ (test_<name>.py)."""
    name = TESTED_IN.get(_module(path), f"test_{_module(path).lstrip('_')}.py")
    assert (ROOT / "tests" / "patchreg" / name).exists(), f"{path.name} has no tests/patchreg/{name}"


def _lock_uses(tree: ast.AST) -> list[str]:
    """Where a module reaches the engine's lock (``patchreg._state.LOCK``): imported by name or read as an attribute."""
    found = [
        f"import LOCK (line {n.lineno})"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "patchreg._state" and any(a.name == "LOCK" for a in n.names)
    ]
    return found + [
        f".LOCK (line {n.lineno})" for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "LOCK"
    ]


@pytest.mark.parametrize("path", [p for p in ENGINE if p.name != "_state.py"], ids=lambda p: p.name)
def test_only_the_state_module_takes_the_lock(path: Path) -> None:
    """The engine's one lock is taken in ``_state`` only: other modules ask it for a consistent read
    (``consistent``) or a change (``take``, ``release``, the book's methods), which take it themselves."""
    assert _lock_uses(ast.parse(path.read_text())) == []


def test_the_lock_check_finds_a_use() -> None:
    source = "from patchreg._state import LOCK, take\nimport patchreg._state as s\nwith s.LOCK:\n    pass\n"
    assert len(_lock_uses(ast.parse(source))) == 2


@pytest.mark.parametrize("path", ENGINE, ids=lambda p: p.name)
def test_no_engine_module_imports_another_modules_private_names(path: Path) -> None:
    """No module of patchreg/ imports a private name (``_x``) of another, nor reads one through a module it imports."""
    found = []
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.startswith("patchreg"):
            for alias in node.names:
                if node.module == "patchreg" and alias.name.startswith("_") and not alias.name.startswith("__"):
                    modules.add(alias.asname or alias.name)  # from patchreg import _explain: a module
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
    for node in ast.walk(ast.parse(path.read_text())):
        is_module = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
        if is_module and node.attr.startswith("_") and not node.attr.startswith("__"):  # type: ignore[union-attr]
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")  # type: ignore[union-attr]
    assert found == []


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


def _private_patch_modules(tree: ast.AST) -> list[str]:
    """Imports of a private module of our patch sets (``patches.megatron._native``)."""
    found: list[str] = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [node.module]
        found += [n for n in names if n.split(".")[0] == "patches" and any(p.startswith("_") for p in n.split("."))]
    return found


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_benchmarks_use_the_patch_sets_as_a_user_can(path: Path) -> None:
    """A benchmark imports no private module of patches/ (it measures what a user can call)."""
    assert _private_patch_modules(ast.parse(path.read_text())) == []


def test_the_patch_module_check_catches_a_private_module() -> None:
    source = "from patches.megatron._native import native\nimport patches.vllm._x\nfrom patches.megatron import mtp\n"
    assert _private_patch_modules(ast.parse(source)) == ["patches.megatron._native", "patches.vllm._x"]


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
