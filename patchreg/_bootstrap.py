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

from patchreg._disable import ENV_DISABLE, names, near, unmatched_text
from patchreg._discovery import ENV_PATCHSETS, Discovery, discover, named, named_sets, unknown_disabled
from patchreg._ledger import Report
from patchreg._registry import registry

__all__ = ["RAY_SETUP_HOOK", "bootstrap", "ray_runtime_env"]

log = logging.getLogger("patchreg")


_LOCK = threading.RLock()  # one bootstrap at a time: two threads must not both apply a set
_held: dict[str, Report] = {}  # the sets bootstrap applied in this process, held for its life
_warned: list[bool] = [False]  # the unknown PATCHREG_DISABLE names are logged once per process

#: Ray's ``worker_process_setup_hook`` that bootstraps each worker process before its actor's ``__init__``.
RAY_SETUP_HOOK = "patchreg.bootstrap"


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
            sets = named(todo, found)
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


def _warn_unknown_disabled(found: Discovery) -> None:
    """Log once per process the ``PATCHREG_DISABLE`` names that match nothing, each with the name it may mean."""
    if _warned[0] or not names():
        return
    _warned[0] = True
    unknown, known = unknown_disabled(found)
    if unknown:
        log.warning("patchreg: %s", unmatched_text(near(unknown, known)))
