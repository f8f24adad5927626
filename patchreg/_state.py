"""The only mutable state of patchreg, the only code that changes it, and the only lock (no other module takes it).

Every attribute (or mapping key) any registry patched has one :class:`~patchreg._ledger.Stack` here, with every
registry's layers on it, bottom first; each registry has a :class:`Book`. An apply runs :func:`take` over a plan's
steps; a revert, an exit or a failed apply runs :func:`release`, which checks :func:`check_release` before it
restores anything. Everything else reads this state (:func:`consistent`) or asks it to change.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from patchreg._checks import conflict, covered, not_ours, stored_another, wrapped_over
from patchreg._ledger import (
    GONE,
    Checkpoint,
    Layer,
    Pending,
    Plan,
    Ref,
    Report,
    Stack,
    Step,
    Strong,
    WeakOriginal,
    no_holder,
    plan_key,
    weak_or_id,
)
from patchreg._namespace import ABSENT, binding, checked_writes, holder_kind, put_back, reorder, same, write
from patchreg._predicates import REFRESHES
from patchreg._records import INSTALL_ORDER, Patch
from patchreg._targets import identity
from patchreg.exceptions import PatchConflictError, PatchOwnershipError, UnpatchableTargetError

__all__ = [
    "BOOKS",
    "LOCK",
    "STACKS",
    "Book",
    "awaited",
    "cancel",
    "check_compatible",
    "check_release",
    "consistent",
    "purge",
    "release",
    "shared_layer",
    "stack_for",
    "stack_key",
    "take",
    "to_release",
]

log = logging.getLogger("patchreg")

#: One lock for every registry: they all write the same namespaces. No user code runs under it.
LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):  # a fork waits out any apply/revert in flight; the child's lock is free
    os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release)

#: every stack, by ``(identity of the holder, attribute)`` (``(identity of the mapping, ("[]", key))`` for an item)
STACKS: dict[tuple[int, Any], Stack] = {}
#: every live registry's book (weakly): lazy patches of any registry are looked up through them
BOOKS: weakref.WeakSet[Book] = weakref.WeakSet()
_DEAD: list[object] = []  # death notices of holders: their stacks are dropped under the lock (purge)
_SEQUENCE = itertools.count()  # the install order across registries
_time = time.time_ns
_T = TypeVar("_T")


class Book:
    """One registry's own state: its plans (the one used last first), its checkpoints, its lazy patches waiting for
    an import, and the instance stacks its resolutions made that want a name by path."""

    __slots__ = ("__weakref__", "checkpoints", "last", "owner", "pending", "plans", "unnamed")

    def __init__(self, owner: Any) -> None:
        self.owner = weakref.ref(owner, _DEAD.append)  # a registry gone: its installs stay, forgotten (purge)
        self.plans: dict[tuple[int, ...], Plan] = {}
        self.last: Plan | None = None  # an RL loop enters the same block on the same model
        self.checkpoints: list[weakref.ref[Checkpoint]] = []
        self.pending: list[Pending] = []
        self.unnamed: list[Stack] = []
        BOOKS.add(self)

    @property
    def name(self) -> str:
        """The registry's name (for messages)."""
        owner = self.owner()
        return "<gone>" if owner is None else str(owner.name)

    def plan_for(self, target: object, obj: Any) -> Plan | None:
        """The plan kept for an apply of ``target`` on ``obj`` (those very objects) since the last ``refresh()``, or
        None: the one used last first, then the others by key."""
        plan = self.last
        if plan is None or plan.target() is not target or plan.obj() is not obj:
            plan = self.plans.get(plan_key(target, obj))
            if plan is None or not plan.matches(target, obj):
                return None
        return plan if plan.gen == REFRESHES[0] else None

    def keep(self, plan: Plan) -> None:
        """Keep ``plan`` by its key, as the one used last."""
        self.plans[plan.key] = self.last = plan

    def forget(self, plan: Plan) -> None:
        """Drop ``plan`` (its target or object died), also as the last one (it holds classes)."""
        if self.plans.get(plan.key) is plan:
            del self.plans[plan.key]
        if self.last is plan:
            self.last = None

    def live_layers(self) -> list[Layer]:
        """This registry's live layers, per attribute bottom first, the attributes in this registry's install order."""
        with LOCK:
            purge()
            per = [[la for la in s.layers if la.owner is self] for s in STACKS.values()]
            return [la for layers in sorted(filter(None, per), key=lambda ls: ls[0].seq) for la in layers]

    # -- lazy patches, checkpoints ----------------------------------------------------------------

    def wait_for_import(self, ledger: Report, waiting: Sequence[Patch]) -> None:
        """Make ``waiting`` lazy patches of ``ledger`` (under the lock): each installs when its module is imported."""
        ledger.waiting = [Pending(p, ledger, self) for p in waiting]
        self.pending.extend(ledger.waiting)

    def take_on_import(self, pending: Pending, steps: Sequence[Step], skipped: tuple[tuple[str, str], ...]) -> bool:
        """Install a lazy patch whose module was just imported (``steps``, ``skipped``: its resolution now), for its
        apply's report; False when it was cancelled meanwhile. A failure releases only what this patch took."""
        with LOCK:
            if pending.state != "pending":
                return False
            self.pending.remove(pending)
            ledger = pending.ledger
            pending.state = "skipped: " + skipped[0][1] if skipped else "installed"
            ledger.skips = (*ledger.skips, *skipped)  # the apply's report says so too
            taken = Report(ledger.owner, ledger.set_name, ())
            try:
                take(self, steps, taken)
            except Exception as exc:
                pending.state = f"failed: {exc}"
                raise
            ledger.layers.extend(taken.layers)
            ledger.new_installs += taken.new_installs
            return True

    def failed_on_import(self, pending: Pending, exc: BaseException) -> None:
        """Note that a lazy patch's install on import failed (it waits no more)."""
        with LOCK:
            if pending in self.pending:
                self.pending.remove(pending)
            pending.state = f"failed: {exc}"

    def checkpoint(self) -> Checkpoint:
        """A checkpoint of this moment: every apply from now on is recorded while it lives."""
        with LOCK:
            checkpoint = Checkpoint(self.owner(), len(self.live_layers()))
            self.checkpoints.append(weakref.ref(checkpoint))
            return checkpoint

    def record(self, ledger: Report) -> None:
        """Note ``ledger`` in every live checkpoint (an apply made while one exists)."""
        with LOCK:
            live = []
            for ref in self.checkpoints:
                checkpoint = ref()
                if checkpoint is not None:
                    live.append(ref)
                    ledgers = checkpoint.ledgers
                    if len(ledgers) >= 64 and len(ledgers) & (len(ledgers) - 1) == 0:  # now and then: drop released
                        ledgers[:] = [r for r in ledgers if not r.released]
                    ledgers.append(ledger)
            self.checkpoints[:] = live

    def rollback(self, checkpoint: Checkpoint) -> int:
        """Release every apply recorded in ``checkpoint`` not released yet, last first; all or nothing."""
        with LOCK:
            purge()
            ledgers = [r for r in reversed(checkpoint.ledgers) if not r.released]
            check_release([la for r in ledgers for la in to_release(r)])
            restored = sum(release(r, checked=True) for r in ledgers)
            checkpoint.ledgers.clear()
            return restored

    def release_everything(self) -> int:
        """Restore every original this registry displaced (the latest installed first); all or nothing."""
        with LOCK:
            everything = Report(self.owner(), "revert_all", ())  # every user of every layer, in install order:
            everything.layers = [la for la in sorted(self.live_layers(), key=INSTALL_ORDER) for _ in range(la.count)]
            everything.repeats = True  # released last installed first (a wrap before what it wraps)
            check_release(everything.layers[::-1])
            cancel(self.pending)
            return release(everything, checked=True)

    def layers_of(self, patch: Patch, found: Sequence[Any] | None) -> list[Layer]:
        """This registry's live layers of ``patch`` on the ``found`` sites' holders and attributes (None: on any)."""
        with LOCK:
            mine = [la for la in patch.backup.layers() if la.owner is self and la.count > 0]
            if found is None:
                return mine
            return [la for la in mine if any(la.stack.ref() is h.holder and la.stack.attr == h.attr for h in found)]

    def release_of(self, ledger: Report, patches: Sequence[Patch], found: Sequence[Sequence[Any] | None]) -> int:
        """Release one user of this registry's layers of each of ``patches`` on its ``found`` sites (None: any), last
        installed first, through ``ledger``; cancel their waiting lazy patches. How many originals came back."""
        with LOCK:
            purge()
            cancel([p for p in self.pending if p.patch in patches])
            for patch, sites in zip(patches, found, strict=True):
                ledger.layers.extend(self.layers_of(patch, sites))
            ledger.layers.sort(key=INSTALL_ORDER)  # released last-installed first, whatever the set's order
            return release(ledger)

    def take_unnamed(self) -> list[Stack]:
        """The stacks made for this registry since the last call that want a name by path."""
        with LOCK:
            stacks, self.unnamed = self.unnamed, []
        return stacks

    @staticmethod
    def set_path(stack: Stack, path: str | None) -> None:
        """Name ``stack``'s holder by its path from the object its first apply was given (``model.mtp.layers[0]``)."""
        stack.path = path


def consistent(read: Callable[[], _T]) -> _T:
    """``read()`` under the lock: what it reads of the state is never half of an install or a release."""
    with LOCK:
        return read()


def awaited(module: str) -> bool:
    """Whether a lazy patch of any registry waits for ``module`` to be imported."""
    with LOCK:
        return any(p.module == module and p.state == "pending" for b in list(BOOKS) for p in b.pending)


def cancel(pendings: Iterable[Pending]) -> None:
    """Cancel the lazy patches among ``pendings`` that still wait (under the lock)."""
    for pending in list(pendings):
        if pending.state == "pending":
            pending.state = "cancelled"
            pending.book.pending.remove(pending)


def stack_key(holder: Any, attr: Any, item: bool = False) -> tuple[int, Any]:
    """Where :data:`STACKS` keeps the stack of ``holder.attr`` (``item``: of the mapping ``holder``'s key ``attr``)."""
    return (identity(holder), ("[]", attr) if item else attr)


def stack_for(book: Book, patch: Patch, holder: Any, attr: Any) -> Stack:
    """The stack of ``patch``'s install on ``holder.attr`` (or the mapping ``holder``'s key ``attr``), made if new."""
    key = stack_key(holder, attr, patch.is_item)
    with LOCK:
        stack = STACKS.get(key)
        if stack is not None and stack.ref() is holder:
            patch.backup.stacks.add(stack)
            return stack
        if stack is not None:
            _drop(key)  # an identity reused by a new object
        try:
            ref: Callable[[], Any] = weakref.ref(holder, _DEAD.append)  # (the callback only records: gc may run it
        except TypeError:  # inside a locked section; purge drops the stack)
            ref = Strong(holder)
        title = str(patch.where) if patch.is_item and patch.is_global else None  # else named by path
        kind = "item" if patch.is_item else holder_kind(holder)
        stack = STACKS[key] = Stack(ref, attr, kind, key, title, checked_writes(kind, holder))
        if stack.kind == "instance" or (stack.kind == "item" and title is None):
            book.unnamed.append(stack)  # named by its path from the object after the apply
        patch.backup.stacks.add(stack)
        return stack


def purge() -> None:
    """Drop the stacks of dead holders, and the layers of registries gone (under the lock): they count no user any
    more (what a registry gone installed stays where it is, as an original to whatever is over it)."""
    if _DEAD:
        _DEAD.clear()
        for key in [k for k, s in STACKS.items() if s.ref() is None]:
            _drop(key)
        for stack in STACKS.values():
            gone = [la for la in stack.layers if la.owner.owner() is None]
            for layer in gone:
                stack.layers.remove(layer)
                _forget(layer)


def _drop(key: tuple[int, Any]) -> None:
    for layer in STACKS.pop(key).layers:
        _forget(layer)


def _forget(layer: Layer) -> None:
    """``layer`` is gone (no user counted, no original kept alive)."""
    layer.count = 0
    layer.original = None


def take(book: Book, steps: Sequence[Step], ledger: Report, waiting: Sequence[Patch] = ()) -> bool:
    """The one install loop: a user of every step's install for ``ledger``, all or nothing; then the apply's
    ``waiting`` lazy patches wait for their imports. False, before any change, when a holder is no longer what the
    plan found (resolve again). A step shares this registry's install of its patch, or (no conflict) installs over
    what the holder stores now: the plan's binding while that is what the plan found, the binding rule again else.
    Its layer is recorded before the write, so a write that raises after storing is restored by the release.
    """
    with LOCK:
        if _DEAD:
            purge()
        for (
            _patch,
            stack,
            _found,
            _value,
            _make,
            cls,
            mro,
            view,
            raw,
            above,
            _order,
            _calls,
        ) in steps:  # what it must find
            holder = stack.ref()
            if holder is None or (
                cls is not None
                and (
                    type(holder) is not cls
                    or view.get(stack.attr, ABSENT) is not raw
                    or (above and (cls.__mro__ is not mro or any(stack.attr in v for v in above)))
                )
            ):
                return False
        now = _time()
        taken = ledger.layers
        made = 0
        try:
            for step in steps:
                patch, stack, found, value, make, cls, _mro, view, raw, _above, order, calls = step
                on = stack.layers
                if on:
                    shared = shared_layer(on, patch, book)
                    if shared is not None:
                        shared.count += 1
                        ledger.repeats = ledger.repeats or shared in taken
                        taken.append(shared)
                        continue
                    check_compatible(patch, stack, book)
                holder = stack.ref()
                kind, attr = stack.kind, stack.attr
                current = (holder if kind == "item" else holder.__dict__).get(attr, ABSENT)
                if not (
                    found is current
                    or (
                        cls is not None
                        and found is not ABSENT
                        and (found() is current if type(found) is Ref else identity(current) == found)
                    )
                ) or (
                    view is not None and view.get(attr, ABSENT) is not raw
                ):  # changed since the plan (by another install, or an earlier step of this one): the rule again
                    value, make = binding(patch.kind, patch.replacement, kind, holder, attr, current, patch.prepend)
                installed = value if make is None else make(holder)
                layer = Layer()
                layer.patch, layer.stack, layer.owner, layer.since, layer.seq = patch, stack, book, now, next(_SEQUENCE)
                layer.count, layer.uppers, layer.order, layer.original = 1, None, order, current
                on.append(layer)
                taken.append(layer)
                if kind == "instance":  # its own dict, written directly
                    layer.installed = weak_or_id(installed)
                    if current is not ABSENT and (
                        installed is current or getattr(installed, "__wrapped__", None) is current
                    ):
                        held = weak_or_id(current)
                        if type(held) is Ref:
                            layer.original = WeakOriginal(held)
                    if installed is ABSENT:  # a delete
                        holder.__dict__.pop(attr, None)
                    else:
                        holder.__dict__[attr] = installed
                else:
                    layer.installed = installed
                    _write(step, holder, layer, ledger, installed, current)
                if calls and current is ABSENT:  # a wrap calls what its class stores there:
                    below = _inherited(holder, attr, kind)  # a layer installed there is released after it
                    if below is not None:
                        below.uppers = [u for u in below.uppers or () if u.count > 0]
                        below.uppers.append(layer)
                made += 1
        except BaseException:
            ledger.new_installs = made
            release(ledger)
            raise
        ledger.new_installs = made
        if waiting:
            book.wait_for_import(ledger, waiting)
    if made and log.isEnabledFor(logging.DEBUG):
        for layer in taken[-made:]:
            log.debug("patchreg: installed %s on %s", layer.patch.name, layer.stack.where)
    return True


def shared_layer(layers: list[Layer], patch: Patch, book: Book) -> Layer | None:
    """This registry's layer of ``patch`` on a stack, if any (a second apply shares it)."""
    for layer in layers:
        if layer.patch is patch and layer.owner is book:
            return layer
    return None


def _write(step: Step, holder: Any, layer: Layer, ledger: Report, installed: Any, current: Any) -> None:
    """Write ``installed`` into a module's or class's namespace (``setattr``) or a mapping; refused, with nothing kept,
    where the write fails or a ``__setattr__`` / ``__setitem__`` stores another object."""
    stack, patch = step.stack, step.patch
    kind, attr = stack.kind, stack.attr
    try:
        write(kind, holder, attr, installed)
    except (TypeError, AttributeError) as exc:
        if same(kind, stack.current(), current):  # nothing was stored: forget the layer
            _unrecord(layer, ledger)
        msg = f"Cannot set {stack.where} for patch {patch.name!r}: {exc}. Patch the code that uses it instead."
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target) from exc
    if stack.checked:
        stored = stack.current()
        if not same(kind, stored, installed):
            put_back(kind, holder, attr, current, raw=True)
            _unrecord(layer, ledger)  # never kept: nothing of this install may stay registered
            raise stored_another(patch, stack.where, kind, stored, current, stack.current())


def _inherited(holder: Any, attr: Any, kind: str) -> Layer | None:
    """The live layer (any registry's) that installed what ``holder.attr`` inherits from a class, if any."""
    for klass in holder.__mro__[1:] if kind == "class" else type(holder).__mro__:
        view = vars(klass)
        if attr in view:
            stack = STACKS.get(stack_key(klass, attr))
            if stack is None or not stack.layers or stack.ref() is not klass:
                return None
            top = stack.layers[-1]
            return top if top.owns(view[attr]) else None
    return None


def _unrecord(layer: Layer, ledger: Report) -> None:
    """Forget the layer of an install whose write stored nothing of ours."""
    layer.stack.layers.remove(layer)
    ledger.layers.remove(layer)
    _forget(layer)


def release(ledger: Report, checked: bool = False) -> int:
    """The one release loop: one user of every layer ``ledger`` still holds, last taken first, all or nothing
    (:func:`check_release` first); how many originals came back. A layer whose last user goes puts back exactly what
    it displaced, then leaves its stack (an interrupt before that loses nothing: a retry restores); a dict patch's
    mapping gets its keys back in their order (as ``mock.patch.dict``'s). ``checked``: the caller checked a batch
    of reports that holds this one.
    """
    with LOCK:
        if ledger.released:
            return 0
        if ledger.waiting:
            cancel(ledger.waiting)
        taken = ledger.layers
        todo = len(taken) - ledger.unwound
        if not checked:
            check_release(taken[todo - 1 :: -1] if todo else [], ledger.repeats)
        restored = 0
        orders: dict[int, tuple[Any, list[Any]]] | None = None  # per mapping, its keys' order, put back once
        debug = log.isEnabledFor(logging.DEBUG)
        while todo:  # last taken first; an interrupt between two resumes with the rest
            todo -= 1
            layer = taken[todo]
            count = layer.count
            if count == 1:
                stack = layer.stack
                holder = stack.ref()
                if holder is not None:
                    original = layer.original
                    if type(original) is WeakOriginal:
                        original = layer.displaced()
                        if original is GONE:  # the check saw our install there, which keeps it alive: cannot be
                            msg = f"patchreg lost the original of {stack.where} (patch {layer.patch.name!r})."
                            raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
                    kind = stack.kind
                    if kind == "instance":  # its own dict
                        if original is ABSENT:
                            holder.__dict__.pop(stack.attr, None)
                        else:
                            holder.__dict__[stack.attr] = original
                    else:
                        put_back(kind, holder, stack.attr, original)
                        if stack.checked and not same(kind, stack.current(), original):  # a __setattr__ stored another
                            put_back(kind, holder, stack.attr, original, raw=True)
                    restored += 1
                on = stack.layers
                if on[-1] is layer:
                    on.pop()
                else:
                    on.remove(layer)
                if layer.order is not None:
                    orders = orders or {}
                    orders[id(holder)] = (holder, layer.order)
                _forget(layer)
                if debug:
                    log.debug("patchreg: restored %s (%s)", stack.where, layer.patch.name)
                if not on and type(stack.ref) is Strong:  # a mapping held strongly: let it go, keep its name
                    stack.title = stack.label
                    stack.ref = no_holder
                    _DEAD.append(None)
            elif count > 1:
                layer.count = count - 1
            ledger.unwound += 1
        ledger.released = True
        if orders:
            for mapping, order in orders.values():
                if mapping is not None:
                    reorder(mapping, order)
        return restored


# -- the rules the loops apply -----------------------------------------------------------------------


def to_release(ledger: Report) -> list[Layer]:
    """The live layers ``ledger`` still holds a user of, in release order (last taken first)."""
    taken = ledger.layers
    return [la for la in reversed(taken[: len(taken) - ledger.unwound]) if la.count > 0 and la.stack.ref() is not None]


def check_compatible(patch: Patch, stack: Stack, owner: Any) -> None:
    """Two replaces on one attribute conflict (a replace over wraps would discard them): a replace by ``owner`` (a
    registry's book) conflicts with its own layers there and with another registry's top layer, unless that is the
    same patch (which stacks, as a wrap does)."""
    if patch.kind == "wrap" or not stack.layers:
        return
    mine = [la for la in stack.layers if la.owner is owner]
    other = mine[-1] if mine else stack.layers[-1]
    if other.patch is patch:
        return
    msg = conflict(patch, other.patch, stack.where, "" if mine else other.owner.name)
    raise PatchConflictError(msg, patch=patch, target=patch.target)


def check_release(layers: Sequence[Layer], repeats: bool = True) -> None:
    """The ownership rule, checked before anything changes: releasing one user of each of ``layers`` in this order
    restores exactly. A layer whose last user goes is the top of its stack (after those this batch released before),
    no wrap over it (on a subclass, an instance) stays, and its attribute holds what it installed, or its original.
    ``repeats=False``: no layer is twice in ``layers``."""
    users: dict[Layer, int] | None = {} if repeats else None
    gone: dict[Stack, int] | None = None  # per stack, how many of its top layers this batch releases before
    for layer in layers:
        count = layer.count
        if users is not None:
            count = users.get(layer, count)
            users[layer] = count - 1
        if count != 1:  # still shared, or released already
            continue
        stack = layer.stack
        holder = stack.ref()
        if holder is None:  # its holder died: nothing to restore
            continue
        if layer.uppers:
            _check_uppers(layer, layers, users)
        on = stack.layers
        done = gone.get(stack, 0) if gone else 0
        top = on[-1 - done] if done < len(on) else None
        if top is not layer:
            over = None if top is None else (top.patch.name, top.owner is not layer.owner)
            msg = covered(layer.patch.name, stack.where, over)
            raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        if not done:
            kind = stack.kind
            current = (holder if kind == "item" else holder.__dict__).get(stack.attr, ABSENT)
            if not layer.owns(current) and not same(kind, current, layer.displaced()):
                msg = not_ours(layer.patch.name, stack.where, current)
                raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        if len(on) > 1:  # another layer of this batch may be on it
            if gone is None:
                gone = {}
            gone[stack] = done + 1


def _check_uppers(layer: Layer, layers: Sequence[Layer], users: dict[Layer, int] | None) -> None:
    """No install that calls ``layer``'s (a wrap over it on a subclass or an instance) is left by this batch
    (``users``: the users left of the layers released before it in the batch, when counted)."""
    if users is None:
        users = {la: la.count - 1 for la in layers[: layers.index(layer)]}
    for upper in layer.uppers or ():
        left = users.get(upper, upper.count)
        if left > 0 and upper.stack.ref() is not None:
            msg = wrapped_over(layer.patch.name, layer.stack.where, upper.patch.name, upper.stack.label)
            raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
