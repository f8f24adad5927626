"""Patches waiting for an import: ``apply(..., lazy=True)`` of an import path whose module is not imported yet.

The post-import hooks live here; what they change (the store's pending list, the apply's report) the store changes
(:meth:`patchreg._store.Store.take_on_import`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import wrapt

from patchreg._disable import off
from patchreg._plans import resolve_all
from patchreg._stacks import Pending, Report
from patchreg._store import LOCK, STORES, Store

__all__ = ["awaited", "install_on_import", "register_hooks"]

log = logging.getLogger("patchreg")


def awaited(module: str) -> bool:
    """Whether a lazy patch of any registry waits for ``module`` to be imported."""
    with LOCK:
        return any(p.module == module and p.state == "pending" for s in list(STORES) for p in s.pending)


def register_hooks(installs: Store, ledger: Report) -> None:
    """Register the post-import hooks of ``ledger``'s lazy patches (outside the lock: one may fire at once)."""
    for pending in ledger.waiting:
        wrapt.register_post_import_hook(functools.partial(install_on_import, installs, pending), pending.module)


def install_on_import(installs: Store, pending: Pending, module: Any) -> None:
    """Post-import hook of a lazy patch: install it now unless it was cancelled."""
    if pending.state != "pending":
        return
    try:
        work, skipped = resolve_all((pending.patch,), None, disabled=off(pending.ledger.set_name, (pending.patch,)))
        with LOCK:
            if not installs.take_on_import(pending, work, skipped):
                return
    except Exception as exc:  # never break the user's import statement
        installs.failed_on_import(pending, exc)
        log.error("patchreg: lazy patch %s on import of %s failed: %s", pending.patch.name, pending.module, exc)
        return
    if skipped:
        log.warning(
            "patchreg: lazy patch %s skipped on import of %s: %s", pending.patch.name, pending.module, skipped[0][1]
        )
