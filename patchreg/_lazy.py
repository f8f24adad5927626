"""Patches waiting for an import: ``apply(..., lazy=True)`` of an import path whose module is not imported yet."""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any

import wrapt

from patchreg._disable import off
from patchreg._plans import resolve_all
from patchreg._records import Installed
from patchreg._store import LOCK, REGISTRIES, Installs, Ledger, cancel

if TYPE_CHECKING:
    from patchreg._records import Patch

__all__ = ["Pending", "awaited", "cancel_patches", "install_on_import", "register_hooks", "wait_for_import"]

log = logging.getLogger("patchreg")


class Pending:
    """A lazy patch waiting for its module to be imported.

    ``state``: ``"pending"``, then ``"installed"``, ``"skipped: <reason>"``, ``"failed: <error>"`` or ``"cancelled"``.
    """

    __slots__ = ("ledger", "module", "patch", "since", "state")

    def __init__(self, patch: Patch, ledger: Ledger) -> None:
        self.patch = patch
        self.ledger = ledger
        self.module: str = patch.where.module  # type: ignore[union-attr]
        self.since = time.time()
        self.state = "pending"

    def entry(self) -> Installed:
        patch = self.patch
        *owner, attr = patch.where.parts  # type: ignore[union-attr]
        holder = ".".join((self.module, *owner))  # as an install's holder reads: module, then qualname
        return Installed(patch.name, str(patch.where), holder, attr, patch.kind, 0, self.since, "pending", holder)


def awaited(module: str) -> bool:
    """Whether a lazy patch of any registry waits for ``module`` to be imported."""
    with LOCK:
        return any(p.module == module and p.state == "pending" for r in list(REGISTRIES) for p in r._installs.pending)


def wait_for_import(installs: Installs, ledger: Ledger, waiting: list[Patch]) -> None:
    """Make ``waiting`` lazy patches of ``ledger`` (under the lock): each installs when its module is imported."""
    ledger.waiting = [Pending(p, ledger) for p in waiting]
    installs.pending.extend(ledger.waiting)


def register_hooks(installs: Installs, ledger: Ledger) -> None:
    """Register the post-import hooks of ``ledger``'s lazy patches (outside the lock: one may fire at once)."""
    for pending in ledger.waiting:
        wrapt.register_post_import_hook(functools.partial(install_on_import, installs, pending), pending.module)


def install_on_import(installs: Installs, pending: Pending, module: Any) -> None:
    """Post-import hook of a lazy patch: install it now unless it was cancelled."""
    if pending.state != "pending":
        return
    try:
        work, skipped = resolve_all((pending.patch,), None, disabled=off(pending.ledger.set_name, (pending.patch,)))
        with LOCK:
            if pending.state != "pending":
                return
            installs.pending.remove(pending)
            pending.state = "skipped: " + skipped[0][1] if skipped else "installed"
            ledger = pending.ledger
            ledger.skips = (*ledger.skips, *skipped)  # the apply's report says so too
            taken = Ledger.make(ledger.owner, ledger.set_name)
            installs.take_all(work, taken)  # a failure releases only what this patch took, not the user's others
            ledger.layers.extend(taken.layers)
    except Exception as exc:  # never break the user's import statement
        pending.state = f"failed: {exc}"
        log.error("patchreg: lazy patch %s on import of %s failed: %s", pending.patch.name, pending.module, exc)
        return
    if skipped:
        log.warning(
            "patchreg: lazy patch %s skipped on import of %s: %s", pending.patch.name, pending.module, skipped[0][1]
        )


def cancel_patches(installs: Installs, patches: tuple[Patch, ...]) -> None:
    """Cancel the lazy patches of ``installs`` that wait to install one of ``patches`` (under the lock)."""
    cancel(installs, [p for p in installs.pending if p.patch in patches])
