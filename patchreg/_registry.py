"""The Registry: a facade over the store, the plans and the checks.

``apply`` resolves (outside the lock: selectors and predicates are user code), then asks the store
to take a user of each install; ``revert`` (or the end of a ``patched`` block) asks it to release
one, and the last user's release puts back exactly what was there. Where each concept lives:
state in :mod:`patchreg._store` (an install's record in :mod:`patchreg._layers`), raw reads and writes in
:mod:`patchreg._namespace`, refusals in :mod:`patchreg._checks`, plans in :mod:`patchreg._plans` (their guards
in :mod:`patchreg._guards`), the hot path (a plan's clean installs and their release) in :mod:`patchreg._clean`,
lazy patches in :mod:`patchreg._lazy`, blocks in :mod:`patchreg._context`,
introspection in :mod:`patchreg._explain`.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable
from typing import Any

from patchreg import _explain, _lazy
from patchreg._checks import check_release, report_skips, to_release
from patchreg._clean import apply_planned, release
from patchreg._context import Patched, decorate
from patchreg._disable import off
from patchreg._explain import Explanation
from patchreg._plans import (
    SEEN_MAX,
    Plan,
    Trace,
    Work,
    generation,
    locate,
    plan_key,
    plannable,
    resolve_all,
)
from patchreg._records import Installed, Patch, PatchSet, Report, patches_of
from patchreg._store import LOCK, REGISTRIES, Checkpoint, Installs, InstallStack, Ledger, stack_key
from patchreg._targets import Miss, Site, identity
from patchreg.exceptions import PatchDefinitionError

__all__ = ["Checkpoint", "Explanation", "Patched", "Registry", "Target", "decorate"]

Target = Patch | PatchSet | Iterable[Patch]


class Registry:
    """Applies and reverts patches; reference-counted, exact, thread-safe.

    ``apply`` installs what is not yet installed and counts a user for what is;
    ``revert`` (or the end of a ``patched`` block) releases one user, and the last
    user's release puts back exactly what was there.
    """

    __slots__ = ("__weakref__", "_installs", "_last", "_plans", "_seen", "name")

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self._installs = Installs(self)
        self._plans: dict[tuple[int, ...], Plan] = {}
        self._last: Plan | None = None  # the plan used last: an RL loop re-enters the same block
        self._seen: dict[tuple[int, ...], None] = {}  # (set, object) keys applied once, not yet planned
        REGISTRIES.add(self)

    # -- applying -------------------------------------------------------------------------

    def apply(
        self, target: Target, obj: Any = None, *, strict: bool = False, warn: bool | None = None, lazy: bool = False
    ) -> Report:
        """Install every patch of ``target`` whose predicate holds; return a :class:`Report`.

        A patch whose target is not found is skipped with the reason, and (``warn=None``, the default)
        logged as a warning once per patch and process; ``warn=True`` logs every skip that matters at
        every apply, ``warn=False`` none, ``strict=True`` raises instead. A predicate saying no (or *not
        needed here*) is a decision, not a surprise: it is only in the report.

        With ``lazy=True``, an import-path patch whose module is not imported yet is installed
        by a post-import hook when it is (its predicate evaluated then); reverting first cancels it.

        The resolution of a Patch or PatchSet on an object is remembered (a plan) and re-used
        while cheap guards show that resolving again would find the same holders.
        """
        installs = self._installs
        plan = self._last  # an RL loop enters the same block on the same model: checked first, inline
        if plan is None or plan.target() is not target or plan.obj() is not obj:
            plan = self._plans.get((identity(target), identity(obj)))  # another block on one object: its plan
            if plan is not None and (plan.target() is not target or plan.obj() is not obj):
                plan = None
        if plan is not None and plan.flat is not None and not lazy:
            ledger = apply_planned(self, installs, plan, obj, strict, warn)
            if ledger is not None:
                self._last = plan
                if installs.checkpoints or installs.unnamed:
                    self._applied(ledger, obj)
                return ledger
        return self._apply(target, obj, strict, warn, lazy)

    def _apply(self, target: Target, obj: Any, strict: bool, warn: bool | None, lazy: bool) -> Report:
        """:meth:`apply` but for the last plan's fast path: another plan, or a resolution (and a plan made)."""
        key = None
        installs = self._installs
        if not lazy:
            key = plan_key(target, obj)
            plan = self._plans.get(key)
            if plan is not None and not plan.matches(target, obj):
                plan = None
            if plan is not None:
                if plan.flat is not None:
                    ledger = apply_planned(self, installs, plan, obj, strict, warn)
                else:
                    found = plan.work(obj, warn)
                    ledger = (
                        None
                        if found is None
                        else self._apply_work(plan.name, *found, strict, warn, patches=(p for p, _r, _e in plan.items))
                    )
                if ledger is not None:
                    self._last = plan
                    if installs.checkpoints or installs.unnamed:
                        self._applied(ledger, obj)
                    return ledger
        name, patches = patches_of(target)
        disabled = off(name, patches)  # PATCHREG_DISABLE: skipped (an essential one refuses), never waiting
        waiting = [p for p in patches if p.is_global and p.where.module not in sys.modules] if lazy else []  # type: ignore[union-attr]
        if disabled and waiting:
            waiting = [p for p in waiting if id(p) not in disabled]
        traces: list[Trace] | None = [] if not lazy and self._again(key, target, obj) else None
        gen = generation[0]
        todo = tuple(p for p in patches if p not in waiting) if waiting else patches
        work, skipped = resolve_all(todo, obj, traces, warn, disabled)
        ledger = self._apply_work(name, work, skipped, strict, warn, waiting, patches)
        if traces is not None and not ledger.waiting:
            with LOCK:
                self._last = Plan.remember(installs, self._plans, target, obj, name, traces, gen)
        _lazy.register_hooks(installs, ledger)
        if installs.checkpoints or installs.unnamed:
            self._applied(ledger, obj)
        return ledger

    def _applied(self, ledger: Ledger, obj: Any) -> None:
        """After an apply: note it in the live checkpoints, and name the instance stacks it made by path (a walk of
        ``obj``: user code). If that raises (an interrupt), the apply is reverted: its report never reaches the
        caller, so nothing of it may stay installed without an owner."""
        installs = self._installs
        try:
            if installs.checkpoints:
                installs.record(ledger)
            if installs.unnamed:
                _explain.name_stacks(installs, obj)
        except BaseException:
            self.revert(ledger)
            raise

    def _again(self, key: tuple[int, ...] | None, target: object, obj: Any) -> bool:
        """Whether this apply should make a plan: only on a second apply of ``target`` on ``obj``.

        An object patched once (a model built, patched and dropped) pays no tracing; the marks
        are keys only (a reused address at worst makes one plan early) and are bounded.
        """
        if not plannable(target, obj):
            return False
        key = plan_key(target, obj) if key is None else key
        if key in self._seen:
            return True
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()
        self._seen[key] = None
        return False

    def _apply_work(
        self,
        name: str,
        work: list[Work],
        skipped: list[tuple[str, str]],
        strict: bool,
        warn: bool | None,
        waiting: list[Patch] | None = None,
        patches: Iterable[Patch] = (),
    ) -> Ledger:
        """Take a user of every work item (under the lock), after refusing or warning about the skips."""
        if skipped and (strict or warn):
            report_skips(name, skipped, strict, patches)
        ledger = Ledger.make(self, name, tuple(skipped))
        installs = self._installs
        with LOCK:
            if installs.dead:
                installs.purge()
            ledger.new_installs = installs.take_all(work, ledger)
            if waiting:
                _lazy.wait_for_import(installs, ledger, waiting)
        return ledger

    # -- reverting ------------------------------------------------------------------------

    def revert(self, target: Target | Report, obj: Any = None) -> int:
        """Release one user of each patch of ``target`` on ``obj``; return how many originals came back.

        Given a :class:`Report`, releases exactly what that apply took (once).
        """
        installs = self._installs
        if isinstance(target, Report):
            ledger: Ledger = target  # type: ignore[assignment]  # every Report is the store's Ledger
            if ledger.owner is not self:
                msg = f"Report {target!r} came from registry {ledger.owner.name!r}; revert it there."
                raise PatchDefinitionError(msg, target=target.name)
            LOCK.acquire()
            try:
                restored: int = release(installs, ledger)
            finally:
                LOCK.release()
            return restored
        name, patches = patches_of(target)
        hits = [(patch, _hits(patch, obj)) for patch in patches]  # user code (selectors): outside the lock
        ledger = Ledger.make(self, name)
        with LOCK:
            installs.purge()
            _lazy.cancel_patches(installs, patches)
            for patch, found in hits:
                for stack in self._stacks_of(patch, found):
                    ledger.layers.extend(la for la in stack.layers if la.patch is patch and la.count > 0)
            ledger.layers.sort(key=lambda la: la.seq)  # released last-installed first, whatever the set's order
            return installs.release(ledger)

    def _stacks_of(self, patch: Patch, found: list[Site] | None) -> list[InstallStack]:
        """Our stacks that ``patch`` is on, restricted to ``found`` holders (under the lock)."""
        stacks = self._installs.stacks
        if found is None:
            return [s for s in stacks.values() if any(la.patch is patch for la in s.layers)]
        mine = []
        for hit in found:
            stack = stacks.get(stack_key(patch, hit.holder, hit.attr))
            if stack is not None and stack.ref() is hit.holder:
                mine.append(stack)
        return mine

    def revert_all(self) -> int:
        """Restore every original this registry displaced (top layers first); return how many.

        All or nothing: when one install cannot be released (someone patched over it), nothing is.
        """
        with LOCK:
            return self._installs.release_everything()

    def checkpoint(self) -> Checkpoint:
        """Remember this moment, for :meth:`rollback`: every apply from now on is recorded while it lives."""
        installs = self._installs
        with LOCK:
            installs.purge()
            checkpoint = Checkpoint(self, sum(len(s.layers) for s in installs.stacks.values()))
            installs.checkpoints.append(weakref.ref(checkpoint))
            return checkpoint

    def rollback(self, checkpoint: Checkpoint) -> int:
        """Release every apply made since ``checkpoint`` that is not released yet, last first; return restores.

        All or nothing. Those applies' reports end released (a block exited later releases nothing
        again), and lazy patches of earlier applies that were installed since stay.
        """
        if not isinstance(checkpoint, Checkpoint):
            msg = (
                f"rollback() takes what checkpoint() returned, got {checkpoint!r}; take one with registry.checkpoint()."
            )
            raise PatchDefinitionError(msg, target=checkpoint)
        if checkpoint.owner is not self:
            msg = f"Checkpoint came from registry {checkpoint.owner.name!r}; roll back there."
            raise PatchDefinitionError(msg)
        installs = self._installs
        with LOCK:
            installs.purge()
            ledgers = [r for r in reversed(checkpoint.ledgers) if not r.released]
            check_release([la for r in ledgers for la in to_release(r)])
            restored: int = sum(installs.release(r) for r in ledgers)
            checkpoint.ledgers.clear()
            return restored

    def patched(self, target: Target, obj: Any = None, *, strict: bool = False) -> Patched[Report]:
        """A context manager (and decorator) that applies on entry and reverts on exit."""
        patches_of(target)  # fail at the call site on a bad target
        return Patched(self, target, obj, strict)

    # -- introspection --------------------------------------------------------------------

    def active(self) -> tuple[Installed, ...]:
        """Copies of every active install, in install order per attribute."""
        return _explain.active(self._installs)

    def is_active(self, name: str | Patch, obj: Any = None) -> bool:
        """True when a patch named ``name`` (or that very Patch) is installed (on ``obj``, or what ``obj`` contains)."""
        if not isinstance(name, (str, Patch)):
            msg = f"is_active() takes a patch name or a Patch, got {name!r}; pass e.g. 'postprocess'."
            raise PatchDefinitionError(msg, target=name)
        wanted = (lambda p: p is name) if isinstance(name, Patch) else (lambda p: p.name == name)
        installs = self._installs
        with LOCK:
            installs.purge()
            patches = {la.patch for s in installs.stacks.values() for la in s.layers if wanted(la.patch)}
        for patch in patches:
            if obj is None or patch.is_global:
                return True
            found = _hits(patch, obj)
            with LOCK:
                if any(la.patch is patch for s in self._stacks_of(patch, found) for la in s.layers):
                    return True
            with LOCK:  # obj may be the patched holder itself
                if any(s.ref() is obj and la.patch is patch for s in installs.stacks.values() for la in s.layers):
                    return True
        return False

    def explain(self, target: Target, obj: Any = None) -> Explanation:
        """What ``apply(target, obj)`` would do now, without doing it."""
        name, patches = patches_of(target)
        return _explain.explain(self._installs, name, patches, obj)

    def summary(self) -> str:
        """A table of active installs: patch, target, holder, count, state, since."""
        return _explain.summary(self)

    def fingerprint(self) -> str:
        """A stable digest of :meth:`fingerprint_lines`: equal in two processes with the same patches active."""
        return _explain.fingerprint(self._installs)

    def fingerprint_lines(self) -> list[str]:
        """What the fingerprint digests, sorted: installs (no ids or times), predicate answers, versions."""
        return _explain.fingerprint_lines(self._installs)

    def __repr__(self) -> str:
        installs = self._installs
        with LOCK:
            stacks = [s for s in installs.stacks.values() if s.layers and s.ref() is not None]
            n = sum(len(s.layers) for s in stacks)
            waiting = f", {len(installs.pending)} pending (lazy)" if installs.pending else ""
        return f"<patchreg.Registry {self.name!r}: {n} active install(s) on {len(stacks)} attribute(s){waiting}>"


def _hits(patch: Patch, obj: Any) -> list[Site] | None:
    """The selector's holders on ``obj`` (None: every holder of the patch)."""
    if patch.is_global or obj is None:
        return None
    found = locate(patch, obj)
    return [] if isinstance(found, Miss) else found
