"""Clean installs: the hot path of a planned apply and of its release, and (with the guards,
:mod:`patchreg._guards`) the only place where code is inlined for speed.

A *clean* install is what a block entered once per training step meets: a plan (:class:`~patchreg._plans.Plan`)
whose every install is a function bound to its holder as an instance attribute the instance does not have,
on an attribute none of the registry's layers is on (another registry's install there is in the instance's
``__dict__``, so it is not clean either). :func:`take_clean` makes those installs, a layer each and the
ledger, in one pass under the lock; :func:`release` puts them back in one pass once it has found each still
alone and holding what it installed. Anything else (a stale plan, a shared or covered install, an install
someone changed since) takes the general path of the store (:meth:`Store.take_all`,
:meth:`Store.release`), which handles every case: these functions only decide that it is not needed.
"""

from __future__ import annotations

import logging
import time
import types
import weakref
from typing import Any

from patchreg._checks import report_skips
from patchreg._namespace import ABSENT
from patchreg._plans import Plan
from patchreg._stacks import Layer, Report
from patchreg._store import _LEVELS, LOCK, SEQUENCE, Owner, Store, debugging

__all__ = ["apply_planned", "release", "take_clean"]

log = logging.getLogger("patchreg")
_MethodType = types.MethodType
_Ref = weakref.ReferenceType
_acquire, _release = LOCK.acquire, LOCK.release  # bound once: a block pays for no method lookup
_time = time.time_ns
_DEBUG = logging.DEBUG


def take_clean(owner: Owner, installs: Store, plan: Plan) -> Report | None:
    """The installs of ``plan`` (:attr:`Plan.bound` is set, its guards hold) made the clean way, under
    the lock: their ledger; None when one is not a clean install or the plan turned stale: nothing changed, take
    the general path (:func:`apply_planned`'s, or a resolution)."""
    ledger = Report()  # Report.make(owner, plan.name, plan.skipped), inline
    ledger.owner = owner
    ledger.set_name = plan.name
    ledger.skips = plan.skipped
    ledger.layers = layers = []
    ledger.waiting = ()  # no lazy patch (the empty tuple: immortal, no reference counted)
    ledger.released = False
    ledger.unwound = 0
    ledger.new_installs = 0
    ledger.clean = False
    _acquire()  # acquire/release (bound once): a third of what a with statement costs here
    try:
        if installs.dead:
            installs.purge()
        now = _time()  # (the general way reads the clock in Store.take_all)
        seq = next(SEQUENCE)
        for stack, cls, view, raw, attr, replacement, patch, layers_on in plan.bound:  # type: ignore[union-attr]
            holder = stack.ref()
            if type(holder) is not cls or view.get(attr, ABSENT) is not raw:  # died, class swapped, or the class's
                break  # attribute changed (deleted, replaced): stale
            ns = holder.__dict__
            if layers_on or attr in ns:  # shared with an outer block, covered, or the instance has its own
                break
            value = ns[attr] = _MethodType(replacement, holder)
            layer = Layer()  # Layer.make(patch, stack, value, now, seq, ABSENT), inline
            layer.patch = patch
            layer.stack = stack
            layer.count = 1
            layer.since = now
            layer.seq = seq  # one per apply: its clean installs are on distinct attributes, so never compared
            layer.original = ABSENT
            layer.installed = _Ref(value)
            layers_on.append(layer)
            layers.append(layer)
        else:
            ledger.new_installs = len(layers)
            ledger.clean = True
        if not ledger.clean:  # put back the clean installs made so far (exactly): the caller goes the general way
            installs.release(ledger)
            return None
    except BaseException:
        installs.release(ledger)
        raise
    finally:
        _release()
    if _LEVELS.get(_DEBUG) is not False and debugging():  # logging's cached answer, else asked
        for layer in layers:
            log.debug("patchreg: installed %s on %s", layer.patch.name, layer.stack.where)
    return ledger


def release(installs: Store, ledger: Report) -> int:
    """Drop one user per layer of ``ledger`` (under the lock): :meth:`Store.release`, in one pass for a clean
    ledger whose every layer is still alone on its attribute with one user and holds what it installed there."""
    if not ledger.clean or ledger.unwound or ledger.released or _LEVELS.get(_DEBUG) is not False:
        return installs.release(ledger)
    taken = ledger.layers
    for layer in taken:  # all checked before any is put back (all or nothing)
        stack = layer.stack
        mine = layer.installed()  # a method bound to the holder (see Report.clean): its __self__ is the holder
        if (
            mine is None
            or layer.count != 1
            or stack.dependents is not None
            or len(stack.layers) != 1
            or mine.__self__.__dict__.get(stack.attr) is not mine
        ):
            return installs.release(ledger)  # one is not as installed: the general way says what to do
    n = i = len(taken)
    while i:  # last taken first; an index, no iterator to allocate
        i -= 1
        layer = taken[i]
        stack = layer.stack
        holder = stack.ref()
        if holder is not None:  # (collected since the check: gone with it)
            holder.__dict__.pop(stack.attr, None)
        stack.layers.pop()
        layer.count = 0
        ledger.unwound = n - i  # a retry after an interrupt releases only the rest
    ledger.released = True
    return n


def apply_planned(
    owner: Owner, installs: Store, plan: Plan, obj: Any, strict: bool, warn: bool | None
) -> Report | None:
    """Apply a plan whose every patch is planned; None when it turns out stale (nothing changed).

    A plan whose every install is a method bound to its holder (:attr:`Plan.bound`) installs the clean way
    (:func:`take_clean`) while it can; else (shared with an outer block, covered by another registry) each
    install is taken the general way.
    """
    if not plan.holds(obj):
        return None
    if plan.skipped and (strict or warn):
        report_skips(plan.name, list(plan.skipped), strict, [p for p, _r, _e in plan.items])
    if plan.bound is not None:
        ledger = take_clean(owner, installs, plan)
        if ledger is not None:
            return ledger
    with LOCK:
        if installs.dead:
            installs.purge()
        found = plan.work(obj)  # under the lock, as the takes: what it checked still holds when they run
        if found is None:
            return None
        ledger = Report.make(owner, plan.name, plan.skipped)
        ledger.new_installs = installs.take_all(found[0], ledger)
    return ledger
