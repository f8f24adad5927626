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
from collections.abc import Mapping

from patchreg._api import registry
from patchreg._discovery import Discovery, discover
from patchreg._records import PatchSet, Report
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = ["ENV_PATCHSETS", "bootstrap", "named_sets"]

log = logging.getLogger("patchreg")

#: The environment variable naming the patch sets :func:`bootstrap` applies (comma-separated).
ENV_PATCHSETS = "PATCHREG_PATCHSETS"

_LOCK = threading.RLock()  # one bootstrap at a time: two threads must not both apply a set
_held: dict[str, Report] = {}  # the sets bootstrap applied in this process, held for its life


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
            sets = _find(todo, discover())
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
            raise PatchDefinitionError(msg)
    return {n: by_name[n] for n in names}
