"""Finding patch sets: patchreg's own modules, and third-party sets from entry points.

Our sets are the :class:`~patchreg.PatchSet` objects bound at module level in the
known modules (:data:`KNOWN_MODULES`, and every public submodule of the packages in
:data:`KNOWN_PACKAGES`). Third-party sets come from the entry-point group
``patchreg.patchsets`` declared by installed distributions: each entry point names a
``PatchSet`` or a zero-argument callable returning one. Only declared entry points
are loaded, never arbitrary strings.

A module that is missing or fails to import, or an entry point that does not load
or yields no PatchSet, becomes a :class:`LoadError`: discovery never raises for it,
not even when it calls ``sys.exit()`` (a script-like module parsing ``sys.argv``).
Only ``KeyboardInterrupt`` gets through. Where another ``patches`` takes the name of ours
(:func:`patchreg._sources.shadowing`), our modules are not imported: one LoadError names the path
in the way and the remedy, and so does each of our entry points that fails for it.

A :class:`Found` set is *bundled* when its module is in the ``patches`` folder patchreg installs
(ours, as opposed to the user's own sets: ``-m`` modules and other distributions' entry points).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import pkgutil
import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from patchreg._disable import ENV_DISABLE, is_disabled, is_essential, names
from patchreg._records import PatchSet
from patchreg._sources import PACKAGE, is_ours, shadowed_by, shadowing
from patchreg._targets import import_path_meant
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_PATCHSETS",
    "KNOWN_MODULES",
    "KNOWN_PACKAGES",
    "VERSION",
    "Discovery",
    "Found",
    "LoadError",
    "discover",
    "env_problems",
    "named",
    "named_sets",
    "unknown_disabled",
]

#: patchreg's own version (``patchreg.__version__``; pyproject.toml reads it from here).
VERSION = "0.1.0"

log = logging.getLogger("patchreg")

#: The entry-point group third-party distributions declare their patch sets in.
ENTRY_POINT_GROUP = "patchreg.patchsets"
#: Modules scanned for module-level PatchSet objects.
KNOWN_MODULES = ("patches.megatron.mtp", "patches.megatron.cpu")
#: Packages whose public submodules (and the package itself) are scanned.
KNOWN_PACKAGES = ("patches.vllm",)


@attrs.frozen
class Found:
    """One patch set and where it came from (``module patches.x`` or ``entry point ...``)."""

    patch_set: PatchSet
    source: str
    origin: str  # the module name, or the entry point's name
    bundled: bool = False  # defined in patchreg's own ``patches`` folder

    @property
    def name(self) -> str:
        """The patch set's name."""
        return self.patch_set.name


@attrs.frozen
class LoadError:
    """A module or entry point that could not be loaded, and why (one sentence)."""

    source: str
    origin: str
    reason: str


@attrs.frozen
class Discovery:
    """Every patch set found, in discovery order, and what failed to load."""

    sets: tuple[Found, ...]
    errors: tuple[LoadError, ...]


def discover(
    modules: Sequence[str] = KNOWN_MODULES,
    packages: Sequence[str] = KNOWN_PACKAGES,
    *,
    group: str | None = ENTRY_POINT_GROUP,
) -> Discovery:
    """Import the known modules and load the entry points of ``group``; never raises for a bad one."""
    found: list[Found] = []
    errors: list[LoadError] = []
    modules, packages = _unless_shadowed(modules, packages, errors)
    for name in _expand(modules, packages, errors):
        _scan_module(name, found, errors)
    if group is not None:
        for ep in _entry_points(group):
            _load_entry_point(ep, found, errors)
    return Discovery(_unique(found), tuple(errors))


def _unless_shadowed(
    modules: Sequence[str], packages: Sequence[str], errors: list[LoadError]
) -> tuple[Sequence[str], Sequence[str]]:
    """``modules`` and ``packages`` less ours when another ``patches`` shadows ours (one LoadError says so)."""
    mine = [n for n in (*modules, *packages) if n.partition(".")[0] == PACKAGE]
    text = shadowing() if mine else ""
    if not text:
        return modules, packages
    reason = f"patchreg's patch sets ({', '.join(mine)}) not loaded: {text}"
    log.warning("patchreg: %s", reason)
    errors.append(LoadError(f"module {PACKAGE}", PACKAGE, reason))
    return [m for m in modules if m not in mine], [p for p in packages if p not in mine]


def _expand(modules: Sequence[str], packages: Sequence[str], errors: list[LoadError]) -> list[str]:
    names = list(modules)
    for package in packages:
        pkg = _import(package, errors)
        if pkg is None:
            continue
        paths = getattr(pkg, "__path__", None)
        if paths is not None:  # submodules first: a set's source is where it is defined, not re-exported
            names += sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(paths) if not m.name.startswith("_"))
        names.append(package)
    return names


def _import(name: str, errors: list[LoadError]) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == name or name.startswith(missing + "."):
            reason = f"module {name} is not installed (no module named {missing!r})"
        else:
            reason = f"importing {name} failed: {type(exc).__name__}: {exc}"
    except (Exception, SystemExit) as exc:  # a patch module may raise anything at import, or exit
        reason = f"importing {name} failed: {_failure(exc)}"
    log.info("patchreg: %s", reason)
    errors.append(LoadError(f"module {name}", name, reason))
    return None


def _failure(exc: BaseException) -> str:
    """What went wrong, for a load error: the exception's type and message, or the exit code."""
    if isinstance(exc, SystemExit):
        return (
            f"SystemExit with exit code {exc.code!r}: it exits when loaded; "
            "keep command-line code under `if __name__ == '__main__':`"
        )
    return f"{type(exc).__name__}: {exc}"


def _scan_module(name: str, found: list[Found], errors: list[LoadError]) -> None:
    module = _import(name, errors)
    if module is None:
        return
    bundled = is_ours(module)
    for value in list(vars(module).values()):
        if isinstance(value, PatchSet):
            found.append(Found(value, f"module {name}", name, bundled))


def _entry_points(group: str) -> Iterable[importlib.metadata.EntryPoint]:
    seen: set[tuple[str, str]] = set()
    for ep in importlib.metadata.entry_points(group=group):
        key = (ep.name, ep.value)
        if key not in seen:  # one distribution on sys.path twice lists its entry points twice
            seen.add(key)
            yield ep


def _describe(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    by = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value}{by}"


def _load_entry_point(ep: importlib.metadata.EntryPoint, found: list[Found], errors: list[LoadError]) -> None:
    source = _describe(ep)
    try:
        value = ep.load()
        patch_set = _as_patch_set(value, ep)
    except (Exception, SystemExit) as exc:  # third-party code may raise anything, or exit
        path = shadowed_by() if ep.module.partition(".")[0] == PACKAGE else ""
        shadowed = f"{PACKAGE!r} is {path!r}, not patchreg's patch sets (rename yours)" if path else ""
        reason = f"{source} failed to load: {shadowed or _failure(exc)}"
        log.info("patchreg: %s", reason)
        errors.append(LoadError(source, ep.name, reason))
        return
    found.append(Found(patch_set, source, ep.name, is_ours(sys.modules.get(ep.module))))


def _as_patch_set(value: Any, ep: importlib.metadata.EntryPoint) -> PatchSet:
    if isinstance(value, PatchSet):
        return value
    if callable(value):
        result = value()
        if isinstance(result, PatchSet):
            return result
        msg = f"{ep.value!r} returned {result!r}, not a PatchSet; make the callable return a PatchSet"
        raise TypeError(msg)
    msg = f"{ep.value!r} is {value!r}, neither a PatchSet nor a zero-argument callable returning one"
    raise TypeError(msg)


def _unique(found: list[Found]) -> tuple[Found, ...]:
    seen: set[int] = set()
    out = []
    for item in found:
        if id(item.patch_set) not in seen:
            seen.add(id(item.patch_set))
            out.append(item)
    return tuple(out)


# -- the sets the environment names: PATCHREG_PATCHSETS ---------------------------------------------------

#: The environment variable naming the patch sets :func:`patchreg.bootstrap` applies (comma-separated).
ENV_PATCHSETS = "PATCHREG_PATCHSETS"


def named_sets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The set names in ``PATCHREG_PATCHSETS`` (of ``environ``, default ``os.environ``), in order, once each."""
    env = os.environ if environ is None else environ
    names = (n.strip() for n in env.get(ENV_PATCHSETS, "").split(","))
    return tuple(dict.fromkeys(n for n in names if n))


def named(names: list[str], found: Discovery) -> dict[str, PatchSet]:
    """The named sets, or a PatchError naming the unknown ones (and what failed to load) and the known ones."""
    by_name = {f.name: f.patch_set for f in found.sets}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        failed = "".join(f"; not loaded: {e.reason}" for e in found.errors)
        msg = (
            f"{ENV_PATCHSETS} names unknown patch set(s) {', '.join(map(repr, unknown))}; known sets: {known}"
            f"{failed}. Fix the variable (comma-separated names, as `python -m patchreg list` prints them)."
        )
        raise PatchError(msg)
    for name in names:
        bound = [p for p in by_name[name] if not p.is_global]
        if bound:
            msg = (
                f"{ENV_PATCHSETS} names patch set {name!r}, but its patch {bound[0].name!r} targets an object given "
                f"at apply time ({str(bound[0].where)!r}); such a set cannot be applied from the environment. "
                f"Remove {name!r} from {ENV_PATCHSETS} and apply it in code with the object (its block, or "
                "registry.apply(set, obj))."
            )
            meant = import_path_meant(str(bound[0].where))
            if meant:  # "json.dumps": a dotted selector, where the module attribute was meant
                msg += f" If {str(bound[0].where)!r} means a module attribute, write the import path {meant!r}."
            raise PatchDefinitionError(msg)
    return {n: by_name[n] for n in names}


def unknown_disabled(found: Discovery) -> tuple[list[str], list[str]]:
    """``(unknown, known)``: the ``PATCHREG_DISABLE`` names no found set or patch answers to, and the known names
    (sets, and patches as ``set.patch``)."""
    shown = {f.name for f in found.sets} | {f"{f.name}.{p.name}" for f in found.sets for p in f.patch_set}
    bare = {p.name for f in found.sets for p in f.patch_set}  # a bare patch name matches too; not listed
    return sorted(n for n in names() if n not in shown and n not in bare), sorted(shown)


def env_problems(found: Discovery) -> list[str]:
    """Why :func:`bootstrap` would not install each named set fully here (empty: it would); changes nothing.

    A name no set has, a set whose patches need an object, and a set whose essential patch
    ``PATCHREG_DISABLE`` names each make one line; what the patches' predicates say is ``doctor``'s table.
    """
    problems = []
    by_name = {f.name: f.patch_set for f in found.sets}
    for name in named_sets():
        if name not in by_name:
            problems.append(
                f"{ENV_PATCHSETS} names unknown patch set {name!r}; known sets: {', '.join(sorted(by_name))}"
            )
            continue
        try:
            named([name], found)
        except PatchError as exc:
            problems.append(str(exc))
        problems.extend(
            f"{name}.{p.name} is essential to {name!r} and disabled by {ENV_DISABLE}: bootstrap() would refuse"
            for p in by_name[name]
            if is_essential(p) and is_disabled(name, p)
        )
    return problems
