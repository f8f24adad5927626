"""Patch sets named in the environment, applied once per process: ``PATCHREG_PATCHSETS``.

Every process of a job reads the same variables, so one variable turns a set on everywhere:
each engine's own start-up hook calls :func:`bootstrap` (a vLLM general plugin, Ray's worker
setup hook, a verl plugin, or the user's ``__main__``). With the variable unset or empty it
returns at once and imports nothing: installing patchreg changes nothing until a set is named.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from patchreg._disable import ENV_DISABLE, is_disabled, is_essential, names, near, unmatched_text
from patchreg._discovery import Discovery, discover
from patchreg._ledger import Report
from patchreg._records import PatchSet
from patchreg._registry import registry
from patchreg._targets import import_path_meant
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = [
    "ENV_PATCHSETS",
    "RAY_SETUP_HOOK",
    "bootstrap",
    "env_problems",
    "named_sets",
    "ray_runtime_env",
    "unknown_disabled",
]

log = logging.getLogger("patchreg")

#: The environment variable naming the patch sets :func:`bootstrap` applies (comma-separated).
ENV_PATCHSETS = "PATCHREG_PATCHSETS"

_LOCK = threading.RLock()  # one bootstrap at a time: two threads must not both apply a set
_held: dict[str, Report] = {}  # the sets bootstrap applied in this process, held for its life
_warned: list[bool] = [False]  # the unknown PATCHREG_DISABLE names are logged once per process

#: Ray's ``worker_process_setup_hook`` that bootstraps each worker process before its actor's ``__init__``.
RAY_SETUP_HOOK = "patchreg.bootstrap"


def named_sets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The set names in ``PATCHREG_PATCHSETS`` (of ``environ``, default ``os.environ``), in order, once each."""
    env = os.environ if environ is None else environ
    names = (n.strip() for n in env.get(ENV_PATCHSETS, "").split(","))
    return tuple(dict.fromkeys(n for n in names if n))


def bootstrap() -> tuple[Report, ...]:
    """Apply the patch sets named in ``PATCHREG_PATCHSETS``, once per process; return their reports.

    Each set is applied to the default registry (lazily: a patch whose module is not imported yet
    installs when it is) and held for the life of the process; a second call applies nothing new
    and returns the same reports. With the variable unset or empty it does nothing. An unknown
    name, or a set whose patches need an object (a selector such as ``mtp_patched``'s), raises a
    :class:`~patchreg.PatchError` naming the known sets; nothing of that call is installed then.
    """
    names = named_sets()
    if not names:
        return ()
    with _LOCK:
        todo = [n for n in names if n not in _held]
        if todo:
            found = discover()
            _warn_unknown_disabled(found)
            sets = _find(todo, found)
            reports: list[tuple[str, Report]] = []
            try:
                for name in todo:
                    reports.append((name, registry.apply(sets[name], lazy=True)))
            except BaseException:
                for _name, report in reversed(reports):
                    registry.revert(report)
                raise
            for name, report in reports:
                log.info("patchreg: bootstrap applied %s from %s: %d installed", name, ENV_PATCHSETS, report.installed)
                _held[name] = report
        return tuple(_held[n] for n in names)


def _find(names: list[str], found: Discovery) -> dict[str, PatchSet]:
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


def ray_runtime_env(
    sets: Iterable[str] | None = None, disable: Iterable[str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``runtime_env`` fragment that bootstraps patchreg in every Ray worker process of a job.

    ``ray.init(runtime_env=patchreg.ray_runtime_env())``: the variables (``sets`` / ``disable`` given, else
    this process's own, of ``environ``) as ``env_vars``, present before any import in each worker, and
    :data:`RAY_SETUP_HOOK` as ``worker_process_setup_hook``, which Ray runs in each worker process before
    an actor's ``__init__``. Merge it with your own ``runtime_env`` (its ``env_vars`` into yours).
    """
    env = os.environ if environ is None else environ
    env_vars = {
        ENV_PATCHSETS: ",".join(sets) if sets is not None else env.get(ENV_PATCHSETS, ""),
        ENV_DISABLE: ",".join(disable) if disable is not None else env.get(ENV_DISABLE, ""),
    }
    return {"env_vars": {k: v for k, v in env_vars.items() if v}, "worker_process_setup_hook": RAY_SETUP_HOOK}


def unknown_disabled(found: Discovery) -> tuple[list[str], list[str]]:
    """``(unknown, known)``: the ``PATCHREG_DISABLE`` names no found set or patch answers to, and the known names
    (sets, and patches as ``set.patch``)."""
    shown = {f.name for f in found.sets} | {f"{f.name}.{p.name}" for f in found.sets for p in f.patch_set}
    bare = {p.name for f in found.sets for p in f.patch_set}  # a bare patch name matches too; not listed
    return sorted(n for n in names() if n not in shown and n not in bare), sorted(shown)


def _warn_unknown_disabled(found: Discovery) -> None:
    """Log once per process the ``PATCHREG_DISABLE`` names that match nothing, each with the name it may mean."""
    if _warned[0] or not names():
        return
    _warned[0] = True
    unknown, known = unknown_disabled(found)
    if unknown:
        log.warning("patchreg: %s", unmatched_text(near(unknown, known)))


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
            _find([name], found)
        except PatchError as exc:
            problems.append(str(exc))
        problems.extend(
            f"{name}.{p.name} is essential to {name!r} and disabled by {ENV_DISABLE}: bootstrap() would refuse"
            for p in by_name[name]
            if is_essential(p) and is_disabled(name, p)
        )
    return problems
