"""The only mutable state of patchreg, and the only code that changes it.

One lock for every registry (they all write the same namespaces), the live registries, each
registry's installs (a stack of layers per attribute), the ledger behind every :class:`Report`,
and checkpoints. Everything else reads this state or asks it to change: records read it (a
Patch's backup, a Report's entries), the registry and plans ask for users to be taken and released.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from patchreg._checks import check_compatible, check_release, to_release
from patchreg._namespace import ABSENT, build, holder_kind, put_back, same, write
from patchreg._records import ORIGINALS, Patch
from patchreg._stacks import GONE, Checkpoint, Layer, Pending, Ref, Report, Stack, Strong, gone
from patchreg._targets import identity
from patchreg.exceptions import PatchOwnershipError, UnpatchableTargetError

__all__ = [
    "LOCK",
    "REGISTRIES",
    "Checkpoint",
    "Stack",
    "Store",
    "Report",
    "originals",
    "stack_key",
    "top_owner",
]

log = logging.getLogger("patchreg")
_LEVELS: dict[int, bool] = getattr(log, "_cache", {})  # logging's own per-logger answers (cleared on setLevel)
_DEBUG = logging.DEBUG


def debugging() -> bool:
    """``log.isEnabledFor(DEBUG)``, read from logging's cache when it has the answer (no Python call)."""
    answer = _LEVELS.get(logging.DEBUG)
    return log.isEnabledFor(logging.DEBUG) if answer is None else answer


#: One lock for every registry: they all write the same namespaces.
LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):  # a fork waits out any apply/revert in flight; the child's lock is free
    os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release)


class Owner(Protocol):
    """What the store needs of a registry: its name (for messages) and its installs."""

    name: str
    _installs: Store


SEQUENCE = itertools.count()  # install order across registries (a patch's backup stacks by it)

#: Every live registry (weakly): cross-registry ownership and a patch's backup look through all of them.
REGISTRIES: weakref.WeakSet[Any] = weakref.WeakSet()


def stack_key(patch: Patch, holder: Any, attr: Any) -> tuple[int, Any]:
    """The key of the stack ``patch`` installs on: ``(holder, attribute)``, or ``(mapping, ("[]", key))`` for an item."""
    return (identity(holder), ("[]", attr) if patch.kind == "item" else attr)


class Store:
    """One registry's installs: an :class:`Stack` per attribute, its lazy patches, its checkpoints.

    Every method that changes something runs under :data:`LOCK` (the caller holds it).
    Stacks stay while their holder lives (weakly), so re-applying is cheap.
    """

    __slots__ = ("checkpoints", "dead", "owner", "pending", "stacks", "unnamed")

    def __init__(self, owner: Owner) -> None:
        self.owner = weakref.ref(owner)
        self.stacks: dict[tuple[int, str], Stack] = {}
        self.unnamed: list[Stack] = []  # new instance stacks, named by path after the apply (outside the lock)
        self.dead: list[Any] = []  # holders' death notices, purged under the lock
        self.pending: list[Pending] = []
        self.checkpoints: list[weakref.ref[Checkpoint]] = []  # live checkpoints record every apply

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
        """Take a user of every ``(patch, holder, attr)`` for ``ledger``; all or nothing; how many installed."""
        installed = 0
        now = time.time_ns()
        try:
            for patch, holder, attr in work:
                installed += self.take(patch, holder, attr, ledger, now)
        except BaseException:
            self.release(ledger)
            raise
        return installed

    def take(self, patch: Patch, holder: Any, attr: str, ledger: Report, now: int) -> int:
        """Count a user of ``patch`` on ``holder.attr``, installing it if it is the first; 1 if installed."""
        key = stack_key(patch, holder, attr)
        stack = self.stacks.get(key)
        if stack is None or stack.ref() is not holder:
            if stack is not None:
                self.drop(key)
            # the death callback only records: it may run inside a locked section (gc); purge drops the stack
            if patch.kind == "item":
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
        value = build(patch.replacement, patch.kind, kind, holder, attr, original)
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
            how = "a custom __setitem__" if kind == "item" else "a custom __setattr__"
            back = stack.current()
            after = (
                "Nothing was changed"
                if same(kind, back, original)
                else f"It now holds {back!r}, which putting back the original {original!r} stored; check it"
            )
            msg = (
                f"Cannot patch {stack.where} (patch {patch.name!r}): setting it stored {stored!r} instead "
                f"of the replacement ({how}), so patchreg could not tell its install from someone "
                f"else's or restore exactly. {after}; patch the code that uses it instead."
            )
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
        if below is not None:  # the other registry's layer is covered: its revert must wait for ours
            depend(below[1], below[2], layer)
        if wrapped is not None:  # the wrap calls that layer's install: its revert must wait for ours
            depend(*wrapped, layer)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("patchreg: installed %s on %s", patch.name, stack.where)

    def foreign_top(
        self, key: tuple[int, str], layers: list[Layer], holder: Any, current: Any
    ) -> tuple[Owner, Stack, Layer] | None:
        """Another registry's live layer that installed ``current`` on this attribute (the topmost), if any.

        ``layers``: this registry's on the attribute (``key``), bottom first.
        """
        if len(REGISTRIES) < 2:
            return None
        mine = layers[-1] if layers else None
        found = top_owner(key, holder, current, skip=self)
        if found is not None and mine is not None and mine.seq > found[2].seq and mine.owns(current):
            return None  # our own layer is on top (two registries installed the very same object): it covers
        return found

    # -- releasing users ---------------------------------------------------------------------

    def release(self, ledger: Report) -> int:
        """Drop one user per layer of ``ledger`` (last taken first); all or nothing; how many restored.

        The general way, for every case; a block's exit and ``Registry.revert(report)`` try
        :func:`patchreg._clean.release` first.
        """
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
        debug = _LEVELS.get(_DEBUG)
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
        layers = sorted(self.live_layers(), key=_seq, reverse=True)  # a wrap goes before the layer it wraps
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


def _seq(layer: Layer) -> int:
    return layer.seq


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
    if debug:
        log.debug("patchreg: restored %s (%s)", stack.where, layer.patch.name)


def cancel(installs: Store, pendings: Iterable[Pending]) -> None:
    """Cancel the lazy patches among ``pendings`` that still wait (under the lock)."""
    for pending in list(pendings):
        if pending.state == "pending":
            pending.state = "cancelled"
            installs.pending.remove(pending)


def originals(patch: Patch) -> list[tuple[Any, Any]]:
    """``(holder, original)`` of every live install of ``patch`` in any registry, oldest first."""
    found: list[tuple[int, Any, Any]] = []
    with LOCK:
        for registry in list(REGISTRIES):
            for stack in registry._installs.stacks.values():
                holder = stack.ref()
                if holder is not None:
                    found.extend((la.seq, holder, la.displaced()) for la in stack.layers if la.patch is patch)
    found.sort(key=lambda item: item[0])
    return [(holder, original) for _seq, holder, original in found]


ORIGINALS.append(originals)  # what a Patch's backup reads (the records cannot import the store, which imports them)


def top_owner(
    key: tuple[int, str], holder: Any, current: Any, skip: Store | None = None
) -> tuple[Owner, Stack, Layer] | None:
    """The topmost live layer, of any registry but ``skip``'s, that installed ``current`` on ``holder``'s attribute."""
    found: tuple[Owner, Stack, Layer] | None = None
    for registry in list(REGISTRIES):
        installs = registry._installs
        if installs is skip:
            continue
        other = installs.stacks.get(key)
        if other is None or not other.layers or other.ref() is not holder:
            continue
        top = other.layers[-1]
        if top.count > 0 and top.owns(current) and (found is None or top.seq > found[2].seq):
            found = (registry, other, top)
    return found


def inherited_layer(stack: Stack, holder: Any) -> tuple[Stack, Layer] | None:
    """The live layer (any registry's) that installed the class attribute ``holder.attr`` inherits, if any."""
    if stack.kind == "module":
        return None
    mro = holder.__mro__[1:] if stack.kind == "class" else type(holder).__mro__
    for klass in mro:
        view = vars(klass)
        if stack.attr in view:
            raw, key = view[stack.attr], (identity(klass), stack.attr)
            break
    else:
        return None
    found = top_owner(key, klass, raw)
    return None if found is None else (found[1], found[2])


def depend(stack: Stack, layer: Layer, upper: Layer) -> None:
    """Note that ``upper`` depends on ``layer`` (of ``stack``): releasing ``layer`` waits for it."""
    if stack.dependents is None:
        stack.dependents = {}
    uppers = stack.dependents.setdefault(layer, [])
    uppers[:] = [u for u in uppers if u.count > 0 and u.stack.ref() is not None]  # forget those gone
    uppers.append(upper)
