"""The only mutable state of patchreg, and the only code that changes it.

One lock for every registry (they all write the same namespaces), and per registry a :class:`Store`: its installs
(a stack of layers per attribute), the report of every apply, its checkpoints, its lazy patches waiting for an
import, and its plans. Everything else reads this state or asks a store to change it: records read it (a Patch's
backup, a Report's entries), the registry, the plans and the lazy hooks ask for users to be taken and released.
A planned apply's installs and their release have a one-pass way here (:meth:`Store.take_planned`, the fast part
of :meth:`Store.release`): the hot path of a block entered once per training step.
"""

from __future__ import annotations

import itertools
import logging
import operator
import time
import types
import weakref
from collections.abc import Iterable
from typing import Any

import wrapt

from patchreg._checks import check_compatible, check_release, stored_another, to_release
from patchreg._namespace import ABSENT, build, holder_kind, put_back, same, write
from patchreg._records import Patch
from patchreg._stacks import (
    GLOBAL,
    GONE,
    LOCK,
    LOG_LEVELS,
    METHOD,
    PLAIN,
    STORES,
    Checkpoint,
    Layer,
    Owner,
    Pending,
    Ref,
    Report,
    Stack,
    Strong,
    WeakOriginal,
    debugging,
    gone,
    inherited_layer,
    plan_key,
    stack_key,
    top_owner,
    weak_or_id,
)
from patchreg._targets import identity
from patchreg.exceptions import PatchOwnershipError, UnpatchableTargetError

__all__ = [
    "LOCK",
    "STORES",
    "Stack",
    "Store",
    "top_owner",
]

log = logging.getLogger("patchreg")
_DEBUG = logging.DEBUG
SEQUENCE = itertools.count()  # install order across registries (a patch's backup stacks by it)

_MethodType = types.MethodType
_SEQ = operator.attrgetter("seq")
_stores: set[Any] = STORES.data  # type: ignore[attr-defined]  # under the WeakSet: len() in C (counts a dead one)
_FunctionWrapper = wrapt.FunctionWrapper
_Ref = weakref.ReferenceType
_setattr = type.__setattr__
_acquire, _release = LOCK.acquire, LOCK.release  # bound once: the fast path pays for no method lookup
_time = time.time_ns


class Store:
    """One registry's state: a :class:`Stack` per attribute, its lazy patches, its checkpoints, its plans.

    Every method that changes something runs under :data:`LOCK` (the caller holds it, unless the method says it
    takes it). Stacks stay while their holder lives (weakly), so re-applying is cheap. Plans
    (:class:`patchreg._plans.Plan`, a module above this one) are kept here and read through what they offer.
    """

    __slots__ = (
        "__weakref__",
        "checkpoints",
        "dead",
        "last",
        "owner",
        "pending",
        "plans",
        "seen",
        "stacks",
        "unnamed",
    )

    def __init__(self, owner: Owner) -> None:
        self.owner = weakref.ref(owner)
        self.stacks: dict[tuple[int, str], Stack] = {}
        self.unnamed: list[Stack] = []  # new instance stacks, named by path after the apply (outside the lock)
        self.dead: list[Any] = []  # holders' death notices, purged under the lock
        self.pending: list[Pending] = []
        self.checkpoints: list[weakref.ref[Checkpoint]] = []  # live checkpoints record every apply
        self.plans: dict[tuple[int, ...], Any] = {}  # remembered resolutions (patchreg._plans.Plan), by plan_key
        self.last: Any = None  # the plan used last: an RL loop enters the same block on the same model
        self.seen: dict[tuple[int, ...], None] = {}  # (set, object) keys applied once, not yet planned
        STORES.add(self)

    @property
    def name(self) -> str:
        """The registry's name (for messages)."""
        owner = self.owner()
        return "<gone>" if owner is None else owner.name

    # -- plans -------------------------------------------------------------------------------

    def plan_for(self, target: object, obj: Any) -> Any:
        """The plan remembered for an apply of ``target`` on ``obj`` (the same objects), or None: the one used last
        first (an RL loop), then the others by key."""
        plan = self.last
        if plan is not None and plan.target() is target and plan.obj() is obj:
            return plan
        plan = self.plans.get(plan_key(target, obj))
        return plan if plan is not None and plan.matches(target, obj) else None

    def keep_plan(self, plan: Any) -> None:
        """Remember ``plan`` (under its key) as the one used last (or forget the last, for None)."""
        if plan is not None:
            self.plans[plan.key] = plan
        self.last = plan

    def forget_plan(self, plan: Any) -> None:
        """Drop ``plan`` (its target or object died), also as the last one (it holds classes)."""
        key = plan.key
        if self.plans.get(key) is plan:
            del self.plans[key]
        if self.last is plan:
            self.last = None

    def forget_plans(self) -> None:
        """Drop every plan (``refresh()``: they hold predicate answers)."""
        self.plans.clear()
        self.last = None

    def again(self, key: tuple[int, ...], limit: int) -> bool:
        """Whether ``key`` was applied before (then a plan is worth making); mark it otherwise (at most ``limit``)."""
        if key in self.seen:
            return True
        if len(self.seen) >= limit:
            self.seen.clear()
        self.seen[key] = None
        return False

    def purge(self) -> None:
        if self.dead:
            self.dead.clear()
            for key in [k for k, s in self.stacks.items() if s.ref() is None]:
                self.drop(key)

    def drop(self, key: tuple[int, str]) -> None:
        stack = self.stacks.pop(key)
        for layer in stack.layers:
            layer.count = 0

    def live_layers(self) -> list[Layer]:
        """Every layer on a live holder, per attribute bottom first."""
        return [la for s in self.stacks.values() if s.ref() is not None for la in s.layers]

    # -- taking users ------------------------------------------------------------------------

    def take_all(self, work: Iterable[tuple[Patch, Any, str]], ledger: Report) -> int:
        """Take a user of every ``(patch, holder, attr)`` for ``ledger``; all or nothing; how many installed (added
        to the report's count)."""
        installed = 0
        now = time.time_ns()
        try:
            for patch, holder, attr in work:
                installed += self.take(patch, holder, attr, ledger, now)
        except BaseException:
            self.release(ledger)
            raise
        ledger.new_installs += installed
        return installed

    def take_planned(self, owner: Owner, plan: Any) -> Report | None:
        """The installs of ``plan`` (its ``fast`` is set, its guards hold) made in one pass, under the lock: their
        report (the plan is then the one used last); None when one is not clean or the plan turned stale: nothing
        changed, take the general way. *Clean*: on an attribute none of our layers is on, whose holder (or class)
        stores what the plan read, that no other registry's layer installed; on an instance, one it does not have
        (a function bound to it, a wrap of its class's function) or a value; on a module or a class, the object the
        plan's first install built, over the original it displaced then."""
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
            if self.dead:
                self.purge()
            now = _time()
            shared = 0
            for mode, stack, cls, view, raw, attr, value, patch, layers_on in plan.fast:
                holder = stack.ref()
                if layers_on:  # a module's or class's install of this patch by an outer block (another model's):
                    top = layers_on[-1]  # one user more of it, as the general way counts; else the general way
                    if mode != GLOBAL or len(layers_on) != 1 or top.patch is not patch or top.count < 1:
                        break
                    top.count += 1
                    layers.append(top)
                    shared += 1
                    continue
                if view.get(attr, ABSENT) is not raw:  # the class's attribute (a module's or class's own) changed
                    break
                if mode == GLOBAL:  # the object built at the first install, over the original it displaced then
                    if holder is None or (len(_stores) > 1 and top_owner(stack.key, holder, raw, self) is not None):
                        break  # (another registry installed that very object: ours must wait for it, the general way)
                    if type(view) is dict:  # a module's namespace
                        view[attr] = value
                    else:  # a class's (its metaclass keeps type's __setattr__: checked when planned)
                        _setattr(holder, attr, value)
                    original = raw
                    held = value
                else:
                    if type(holder) is not cls:  # died, or its class swapped
                        break
                    ns = holder.__dict__
                    original = ns.get(attr, ABSENT)
                    if mode == PLAIN:  # the value as it is, over the instance's own (not another registry's)
                        if original is not ABSENT and len(_stores) > 1 and top_owner(stack.key, holder, original, self):
                            break
                        installed = ns[attr] = value
                        held = _Ref(installed) if type(installed).__weakrefoffset__ else identity(installed)
                        if original is not ABSENT and (
                            installed is original or getattr(installed, "__wrapped__", None) is original
                        ):
                            original = WeakOriginal.of(original)  # (as Layer.make: what is installed keeps it alive)
                    elif original is not ABSENT:  # a method or wrap over the instance's own: the general way
                        break
                    else:
                        method = _MethodType(value if mode == METHOD else raw, holder)
                        if mode == METHOD:
                            installed = ns[attr] = method
                            held = _Ref(method)
                        else:  # WRAP
                            installed = ns[attr] = _FunctionWrapper(method, value)
                            held = weak_or_id(installed)
                layer = Layer()  # Layer.make(patch, stack, installed, now, seq, original), inline
                layer.patch = patch
                layer.stack = stack
                layer.count = 1
                layer.since = now
                layer.seq = next(SEQUENCE)
                layer.original = original
                layer.installed = held
                layers_on.append(layer)
                layers.append(layer)
            else:
                ledger.new_installs = len(layers) - shared
                ledger.clean = True
                self.last = plan
            if not ledger.clean:  # put back the clean installs made so far (exactly): the caller goes the general way
                self.release(ledger)
                return None
        except BaseException:
            self.release(ledger)
            raise
        finally:
            _release()
        if LOG_LEVELS.get(_DEBUG) is not False and debugging():  # logging's cached answer, else asked
            for layer in layers:
                log.debug("patchreg: installed %s on %s", layer.patch.name, layer.stack.where)
        return ledger

    def take(self, patch: Patch, holder: Any, attr: str, ledger: Report, now: int) -> int:
        """Count a user of ``patch`` on ``holder.attr``, installing it if it is the first; 1 if installed."""
        key = stack_key(patch, holder, attr)
        stack = self.stacks.get(key)
        if stack is None or stack.ref() is not holder:
            if stack is not None:
                self.drop(key)
            # the death callback only records: it may run inside a locked section (gc); purge drops the stack
            if patch.is_item:
                title = str(patch.where) if patch.is_global else None  # else named by path, as an instance
                stack = Stack(holder, attr, "item", self.dead.append, key, title)
            else:
                stack = Stack(holder, attr, holder_kind(holder), self.dead.append)
            self.stacks[key] = stack
            if stack.kind == "instance" or (stack.kind == "item" and stack.title is None):
                self.unnamed.append(stack)  # named by its path from the object after the apply
        elif stack.layers:
            for layer in stack.layers:
                if layer.patch is patch:
                    layer.count += 1
                    ledger.layers.append(layer)
                    return 0
            check_compatible(patch, stack)
        self._install(patch, stack, holder, ledger, now)
        return 1

    def _install(self, patch: Patch, stack: Stack, holder: Any, ledger: Report, now: int) -> None:
        original = stack.current()
        below = self.foreign_top(stack.key, stack.layers, holder, original)
        if below is not None and below[2].patch is not patch:  # the same patch stacks, as in one registry
            check_compatible(patch, stack, below[2].patch, f" (in registry {below[0].name!r})")
        wrapped = inherited_layer(stack, holder) if patch.kind == "wrap" and original is ABSENT else None
        kind, attr = stack.kind, stack.attr
        value = build(patch.replacement, patch.kind, kind, holder, attr, original, patch.prepend)
        layer = Layer.make(patch, stack, value, now, next(SEQUENCE), original)
        stack.layers.append(layer)  # recorded before the write: if the write raises after storing, a release restores
        ledger.layers.append(layer)
        try:
            write(kind, holder, attr, value)
        except (TypeError, AttributeError) as exc:
            if same(kind, stack.current(), original):  # nothing was stored: forget the layer
                stack.layers.pop()
                ledger.layers.pop()
            msg = f"Cannot set {stack.where} for patch {patch.name!r}: {exc}. Patch the code that uses it instead."
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target) from exc
        stored = stack.current()
        if not same(kind, stored, value):  # a __setattr__ (a metaclass's, a module's) or __setitem__ stored another
            put_back(kind, holder, attr, original, raw=True)
            stack.layers.pop()  # never kept: nothing of this install may stay registered
            ledger.layers.pop()
            raise stored_another(patch, stack, stored, original)
        if below is not None:  # the other registry's layer is covered: its revert must wait for ours
            depend(below[1], below[2], layer)
        if wrapped is not None:  # the wrap calls that layer's install: its revert must wait for ours
            depend(*wrapped, layer)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("patchreg: installed %s on %s", patch.name, stack.where)

    def foreign_top(
        self, key: tuple[int, str], layers: list[Layer], holder: Any, current: Any
    ) -> tuple[Store, Stack, Layer] | None:
        """Another registry's live layer that installed ``current`` on this attribute (the topmost), if any
        (``layers``: this registry's on the attribute ``key``, bottom first)."""
        if len(STORES) < 2:
            return None
        mine = layers[-1] if layers else None
        found = top_owner(key, holder, current, skip=self)
        if found is not None and mine is not None and mine.seq > found[2].seq and mine.owns(current):
            return None  # our own layer is on top (two registries installed the very same object): it covers
        return found

    # -- releasing users ---------------------------------------------------------------------

    def release(self, ledger: Report) -> int:
        """Drop one user per layer of ``ledger`` (last taken first); all or nothing; how many restored. In one pass
        for a clean report (:meth:`take_planned`'s) whose layers are as installed; else the general way."""
        if ledger.clean and not ledger.unwound and not ledger.released and LOG_LEVELS.get(_DEBUG) is False:
            taken = ledger.layers
            for layer in taken:  # all checked before any is put back (all or nothing)
                stack = layer.stack
                if layer.count > 1 and stack.kind != "instance":  # shared with an outer block: a user less
                    continue
                if layer.count != 1 or stack.dependents is not None or len(stack.layers) != 1:
                    break  # one is not as installed: the general way says what to do
                installed, holder = layer.installed, stack.ref()
                if holder is None:
                    break
                if stack.kind != "instance":  # a module's or class's: held strongly
                    if vars(holder).get(stack.attr, ABSENT) is not installed:
                        break
                else:  # an instance's: held weakly (it, or a wrap of it, may keep the holder), or by identity
                    current = holder.__dict__.get(stack.attr, ABSENT)
                    if type(installed) is _Ref:
                        mine = installed()
                        if mine is None or current is not mine:
                            break
                    elif identity(current) != installed:
                        break
                    if type(layer.original) is WeakOriginal and layer.original.ref() is None:
                        break  # (its original died with what kept it: the general way says so)
            else:
                n = i = len(taken)
                kept = 0  # shared layers: nothing restored
                while i:  # last taken first; an index, no iterator to allocate
                    i -= 1
                    layer = taken[i]
                    stack = layer.stack
                    holder = stack.ref()
                    if layer.count > 1:  # shared with an outer block: a user less
                        layer.count -= 1
                        kept += 1
                    else:
                        if holder is not None:  # (collected since the check: gone with it)
                            original = layer.original
                            if original is ABSENT:  # an instance's attribute it did not have
                                holder.__dict__.pop(stack.attr, None)
                            elif stack.kind == "instance":
                                holder.__dict__[stack.attr] = layer.displaced()  # (not GONE: checked)
                            elif stack.kind == "module":
                                holder.__dict__[stack.attr] = original
                            else:
                                _setattr(holder, stack.attr, original)
                        stack.layers.pop()
                        layer.count = 0
                        if layer.original is not ABSENT:
                            layer.original = None  # as uninstall: a released layer keeps no original alive
                    ledger.unwound = n - i  # a retry after an interrupt releases only the rest
                ledger.released = True
                return n - kept
        return self._release(ledger)

    def _release(self, ledger: Report) -> int:
        """:meth:`release`, the general way."""
        if ledger.released:
            return 0
        taken = ledger.layers
        if ledger.waiting:
            cancel(self, ledger.waiting)
        todo = len(taken) - ledger.unwound
        for i in range(todo):  # each layer alone on its stack with one user is checked here, the rest by check_release
            layer = taken[i]
            stack = layer.stack
            if layer.count == 1 and len(stack.layers) == 1 and stack.dependents is None:
                installed = layer.installed
                if stack.kind == "instance" and type(installed) is Ref:  # layer.owns(stack.current()), inline
                    holder, mine = stack.ref(), installed()
                    if holder is not None and mine is not None and holder.__dict__.get(stack.attr, ABSENT) is mine:
                        continue
                elif layer.owns(stack.current()):
                    continue
            check_release(to_release(ledger))
            break
        restored = 0
        debug = LOG_LEVELS.get(_DEBUG)
        if debug is None:
            debug = debugging()
        for i in range(todo - 1, -1, -1):  # last taken first
            layer = taken[i]
            if layer.count == 1:  # restore before forgetting: an interrupt loses nothing
                stack = layer.stack
                holder = stack.ref()
                if holder is not None:
                    if stack.kind == "instance" and layer.original is ABSENT and not debug:  # uninstall, inline
                        holder.__dict__.pop(stack.attr, None)  # absent if someone else removed it: nothing to restore
                        stack.layers.pop()
                    else:
                        uninstall(layer, debug)
                        if not stack.layers and type(stack.ref) is Strong:
                            self.let_go(stack)
                    restored += 1
                layer.count = 0
            elif layer.count > 0:
                layer.count -= 1
            ledger.unwound += 1  # a retry after an interrupt releases only the rest
        ledger.released = True
        return restored

    def release_everything(self) -> int:
        """Restore every original this registry displaced (top layers first); all or nothing; how many."""
        self.purge()
        layers = sorted(self.live_layers(), key=_SEQ, reverse=True)  # a wrap goes before the layer it wraps
        check_release([la for la in layers for _ in range(la.count)])
        cancel(self, self.pending)
        for layer in layers:
            uninstall(layer)
            layer.count = 0
            if not layer.stack.layers and type(layer.stack.ref) is Strong:
                self.let_go(layer.stack)
        return len(layers)

    def let_go(self, stack: Stack) -> None:
        """Forget a stack that holds its mapping strongly once its last layer is gone: neither the stack nor a
        report that still reads its layers keeps the mapping (and what it refers to) alive. Its name stays."""
        stack.title = stack.label
        stack.ref = gone
        self.dead.append(None)  # purged with the dead holders' stacks

    # -- lazy patches, checkpoints, names -------------------------------------------------------

    def wait_for_import(self, ledger: Report, waiting: list[Patch]) -> None:
        """Make ``waiting`` lazy patches of ``ledger``: each installs when its module is imported."""
        ledger.waiting = [Pending(p, ledger) for p in waiting]
        self.pending.extend(ledger.waiting)

    def take_on_import(
        self, pending: Pending, work: list[tuple[Patch, Any, str]], skipped: list[tuple[str, str]]
    ) -> bool:
        """Install a lazy patch whose module was just imported (``work``: its resolution then), for its apply's
        report; False when it was cancelled meanwhile. A failure releases only what this patch took."""
        if pending.state != "pending":
            return False
        self.pending.remove(pending)
        pending.state = "skipped: " + skipped[0][1] if skipped else "installed"
        ledger = pending.ledger
        ledger.skips = (*ledger.skips, *skipped)  # the apply's report says so too
        taken = Report.make(ledger.owner, ledger.set_name)
        try:
            self.take_all(work, taken)
        except Exception as exc:
            pending.state = f"failed: {exc}"
            raise
        ledger.layers.extend(taken.layers)
        return True

    def failed_on_import(self, pending: Pending, exc: BaseException) -> None:
        """Note that a lazy patch's install on import failed (it waits no more)."""
        with LOCK:
            if pending in self.pending:
                self.pending.remove(pending)
            pending.state = f"failed: {exc}"

    def cancel_patches(self, patches: Iterable[Patch]) -> None:
        """Cancel the lazy patches that wait to install one of ``patches``."""
        wanted = set(patches)
        cancel(self, [p for p in self.pending if p.patch in wanted])

    def checkpoint(self) -> Checkpoint:
        """A checkpoint of this moment (it takes the lock): every apply from now on is recorded while it lives."""
        with LOCK:
            self.purge()
            checkpoint = Checkpoint(self.owner(), sum(len(s.layers) for s in self.stacks.values()))
            self.checkpoints.append(weakref.ref(checkpoint))
            return checkpoint

    def rollback(self, checkpoint: Checkpoint) -> int:
        """Release every apply recorded in ``checkpoint`` not released yet, last first (it takes the lock)."""
        with LOCK:
            self.purge()
            ledgers = [r for r in reversed(checkpoint.ledgers) if not r.released]
            check_release([la for r in ledgers for la in to_release(r)])
            restored: int = sum(self.release(r) for r in ledgers)
            checkpoint.ledgers.clear()
            return restored

    def take_unnamed(self) -> list[Stack]:
        """The stacks made since the last call that want a name by path (it takes the lock)."""
        with LOCK:
            stacks, self.unnamed = self.unnamed, []
        return stacks

    @staticmethod
    def set_path(stack: Stack, path: str | None) -> None:
        """Name ``stack``'s holder by its path from the object its first apply was given (``model.mtp.layers[0]``)."""
        stack.path = path

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


def uninstall(layer: Layer, debug: bool = False) -> None:
    """Put back what ``layer`` displaced (checked releasable before) and pop it off its stack."""
    stack = layer.stack
    holder = stack.ref()
    original = layer.displaced()
    if original is GONE:  # releasable() said current is ours, which keeps the original alive: cannot happen
        msg = f"patchreg lost the original of {stack.where} (patch {layer.patch.name!r})."
        raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
    if not same(stack.kind, stack.current(), original):  # already there (put back by someone, ...): no write
        put_back(stack.kind, holder, stack.attr, original)
        if not same(
            stack.kind, stack.current(), original
        ):  # a __setattr__ (a metaclass's, a module's) stored something else
            put_back(stack.kind, holder, stack.attr, original, raw=True)
    stack.layers.pop()  # after the restore: an interrupt loses nothing
    layer.original = None
    dependents = stack.dependents
    if dependents is not None and layer in dependents:  # what depended on it is gone (checked before)
        del dependents[layer]
        if not dependents:
            stack.dependents = None
    if debug:
        log.debug("patchreg: restored %s (%s)", stack.where, layer.patch.name)


def cancel(installs: Store, pendings: Iterable[Pending]) -> None:
    """Cancel the lazy patches among ``pendings`` that still wait (under the lock)."""
    for pending in list(pendings):
        if pending.state == "pending":
            pending.state = "cancelled"
            installs.pending.remove(pending)


def depend(stack: Stack, layer: Layer, upper: Layer) -> None:
    """Note that ``upper`` depends on ``layer`` (of ``stack``): releasing ``layer`` waits for it."""
    if stack.dependents is None:
        stack.dependents = {}
    uppers = stack.dependents.setdefault(layer, [])
    uppers[:] = [u for u in uppers if u.count > 0 and u.stack.ref() is not None]  # forget those gone
    uppers.append(upper)
