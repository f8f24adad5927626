"""Where a module name resolves, found without importing: the longest module prefix of a dotted name
(:func:`found_module`, for a target written ``"json.dumps"`` where ``"json:dumps"`` was meant), and whether the
top-level name ``patches`` is patchreg's own package (:func:`shadowing`), with the words for when it is not.

patchreg's distribution installs two top-level packages side by side: ``patchreg`` (the engine) and ``patches``
(its patch sets). A user's own ``patches`` (a folder with an ``__init__.py``, or a ``patches.py``) earlier on
``sys.path`` takes that name, often from the current directory, and then ``import patches.megatron`` fails. Every
place that imports our sets says so instead, naming the path that shadows ours and the remedy: discovery (``list``,
``doctor``, entry points) through :func:`shadowing`, and ``import patches.megatron`` itself through a finder put
last on ``sys.meta_path`` when patchreg is imported (it answers only an import every other finder failed).

Nothing here imports ``patches``: the name is looked up (``sys.modules``, else ``importlib.util.find_spec``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["PACKAGE", "found_module", "is_ours", "missing_package", "ours", "shadowed_by", "shadowing"]

#: The top-level name of patchreg's patch sets.
PACKAGE = "patches"
#: Our subpackages: an import of one of them that no finder answers is explained by :func:`shadowing`.
SUBPACKAGES = ("megatron", "vllm", "verl")


def _specs(name: str) -> Iterator[tuple[str, importlib.machinery.ModuleSpec | None]]:
    """Each prefix of the dotted ``name`` with its spec, found without importing, up to the first not found (None)."""
    parts, where = name.split("."), None
    for i in range(1, len(parts) + 1):
        prefix, parent = ".".join(parts[:i]), ".".join(parts[: i - 1])
        try:
            if i == 1 or parent in sys.modules:
                spec = importlib.util.find_spec(prefix)
            else:
                spec = importlib.machinery.PathFinder.find_spec(prefix, where) if where is not None else None
        except (ImportError, ValueError):
            spec = None
        yield prefix, spec
        if spec is None:
            return
        where = spec.submodule_search_locations


def found_module(name: str) -> str:
    """The longest prefix of the dotted ``name`` that is a module, found without importing anything; "" if none."""
    found = ""
    for prefix, spec in _specs(name):
        if spec is not None:
            found = prefix
    return found


def missing_package(name: str) -> str:
    """The package of the dotted module ``name`` that is not installed, found without importing: its first prefix
    that cannot be found before one that is a regular package or module (``megatron.bridge`` under the namespace
    ``megatron``; ``verl``); "" when that package is installed, whether or not ``name`` itself exists in it."""
    for prefix, spec in _specs(name):
        if spec is None:
            return prefix
        if spec.origin not in (None, "namespace"):  # a regular package or module: its distribution is installed
            return ""
    return ""


def ours() -> Path:
    """Where the distribution put our ``patches``: beside the ``patchreg`` package."""
    return Path(__file__).resolve().parent.parent / PACKAGE


def _where() -> list[Path] | None:
    """The paths the name ``patches`` resolves to now (a package's folders, or a module's file); None: not found."""
    module = sys.modules.get(PACKAGE)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):  # a module without a spec, or a finder that raises
        spec = None
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
