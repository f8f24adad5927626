"""The store's records: a layer (one patch installed on one attribute), the stack of layers on one attribute, the
report of an apply, a lazy patch waiting for its import, and a checkpoint.

Only :mod:`patchreg._store` writes them (its one-pass path makes a layer and a report field by field, without an
``__init__``); reports, ``explain`` and the checks read them. On an instance a layer
holds neither what it installed nor the original strongly where that would keep the instance alive: a weak
reference, or an identity.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from patchreg._drift import Drift, drift
from patchreg._format import WIDTH, wrap
from patchreg._namespace import ABSENT, label, same
from patchreg._records import ORIGINALS, Installed, Patch
from patchreg._targets import identity

__all__ = [
    "GLOBAL",
    "GONE",
    "LOCK",
    "LOG_LEVELS",
    "METHOD",
    "PLAIN",
    "STORES",
    "WRAP",
    "Checkpoint",
    "Layer",
    "Owner",
    "Pending",
    "Ref",
    "Report",
    "Stack",
    "Strong",
    "WeakOriginal",
    "debugging",
    "entry",
    "gone",
    "inherited_layer",
    "originals",
    "plan_key",
    "stack_key",
    "top_owner",
    "weak_or_id",
]

Ref = weakref.ReferenceType
log = logging.getLogger("patchreg")
LOG_LEVELS: dict[int, bool] = getattr(log, "_cache", {})  # logging's own per-logger answers (cleared on setLevel)


def debugging() -> bool:
    """``log.isEnabledFor(DEBUG)``, read from logging's cache when it has the answer (no Python call)."""
    answer = LOG_LEVELS.get(logging.DEBUG)
    return log.isEnabledFor(logging.DEBUG) if answer is None else answer


class Owner(Protocol):
    """What a store needs of a registry: its name (for messages)."""

    name: str


#: how a planned install is made in one pass (a plan entry's mode; 0: the general way). On an instance: the
#: replacement as it is (a value), a function bound to the holder, a wrap of the class's function bound to the
#: holder; on a module or a class (an import path): the very object its first install built, installed again.
PLAIN, METHOD, WRAP, GLOBAL = 1, 2, 3, 4


def plan_key(target: object, obj: Any) -> tuple[int, ...]:
    """The key of a plan: the identities of the target and of the object (or each chunk)."""
    if isinstance(obj, (list, tuple)):
        return (identity(target), *map(identity, obj))
    return (identity(target), identity(obj))


def stack_key(patch: Patch, holder: Any, attr: Any) -> tuple[int, Any]:
    """The key of the stack ``patch`` installs on: ``(holder, attribute)``, or ``(mapping, ("[]", key))`` for an item."""
    return (identity(holder), ("[]", attr) if patch.is_item else attr)


#: One lock for every registry: they all write the same namespaces (the store takes it; readers here too).
LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):  # a fork waits out any apply/revert in flight; the child's lock is free
    os.register_at_fork(before=LOCK.acquire, after_in_parent=LOCK.release, after_in_child=LOCK.release)


class Layer:
    """One patch installed on one attribute, with its user count and the original it displaced.

    ``owns`` is an ``is`` test for the installed object that keeps no strong reference to an
    instance it was bound to: on instances the installed object (a bound method, usually) is
    held through a weak reference; one that cannot be weakly referenced, by its identity.
    The original is held weakly too (:class:`WeakOriginal`) where what is installed keeps it alive
    (it is that very object, or a wrapper of it): a layer over another on an instance then holds
    no method bound to the instance either.
    """

    __slots__ = ("count", "installed", "original", "patch", "seq", "since", "stack")

    patch: Patch
    stack: Stack
    count: int  # users (0 once released)
    since: int  # time.time_ns() at install (an int: the float of time.time() is dearer in cold caches)
    seq: int  # the store's SEQUENCE at install: the install order across registries (a patch's backup stacks by it)
    original: Any  # what patch.backup shows (read it through displaced()); dropped once restored
    installed: Any  # what was installed: on an instance, its weak reference (weak_or_id)

    @classmethod
    def make(cls, patch: Patch, stack: Stack, installed: Any, since: int, seq: int, original: Any) -> Layer:
        """A layer of ``patch`` on ``stack``: ``installed`` displaced ``original`` at ``since``, ``seq`` in the install
        order (the store's count). (The class has no ``__init__``: a planned apply makes its layers with a bare
        ``Layer()``, the cheapest allocation.)"""
        self = cls()
        self.patch = patch
        self.stack = stack
        self.count = 1
        self.since = since
        self.seq = seq
        self.original = original
        self.installed = installed
        if stack.kind == "instance":
            self.installed = weak_or_id(installed)
            if original is not ABSENT and (
                installed is original or getattr(installed, "__wrapped__", None) is original
            ):
                self.original = WeakOriginal.of(original)
        return self

    def displaced(self) -> Any:
        """The original this layer displaced (``GONE`` once a weakly held one died with what kept it)."""
        original = self.original
        if type(original) is not WeakOriginal:
            return original
        found = original.ref()
        return GONE if found is None else found

    def owns(self, current: Any) -> bool:
        """True when ``current`` is the very object this layer installed."""
        installed: Any = self.installed
        kind = self.stack.kind
        if kind != "instance":
            return current is installed or (kind == "item" and same(kind, current, installed))
        if type(installed) is Ref:
            mine = installed()  # None once what was installed is gone: then nothing there is ours
            return mine is not None and mine is current
        return bool(identity(current) == installed)

    def releasable(self, current: Any) -> bool:
        """True when releasing this layer (the top one) restores exactly: ``current`` is what it installed,
        or the original is already there (someone else put it back or removed the attribute it added, or
        a write of ours stored and then raised, or raised before storing)."""
        return self.owns(current) or same(self.stack.kind, current, self.displaced())


class WeakOriginal:
    """An original held weakly because the object installed over it keeps it alive."""

    __slots__ = ("ref",)
    ref: weakref.ref[Any]

    @staticmethod
    def of(original: Any) -> Any:
        """``original`` held weakly where it can be, else itself."""
        if not type(original).__weakrefoffset__:  # (asked first: a refused weak reference raises, which is dear)
            return original
        kept = WeakOriginal()
        try:
            kept.ref = Ref(original)
        except TypeError:
            return original
        return kept


GONE = object()  # a weakly held original that died (what kept it alive was removed by someone else)


def weak_or_id(installed: Any) -> Any:
    """How an instance layer holds what it installed: a weak reference, or else its identity."""
    if not type(installed).__weakrefoffset__:  # (asked first: a refused weak reference raises, which is dear)
        return identity(installed)
    try:
        return Ref(installed)
    except TypeError:
        return identity(installed)


class Strong:
    """A strong reference with a weak reference's call: for a mapping (a dict) that has no weak references."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def gone() -> None:
    """The reference of a stack whose mapping it let go (:meth:`patchreg._store.Store.let_go`)."""
    return None


class Stack:
    """One attribute on one holder (held weakly), or one key of a mapping, and one registry's layers on it.

    ``kind``: ``"module"``, ``"class"``, ``"instance"`` or ``"item"``; layers bottom first. A mapping
    that cannot be weakly referenced (a dict) is held strongly while the stack lives.
    """

    __slots__ = ("attr", "dependents", "key", "kind", "layers", "path", "ref", "title")

    def __init__(
        self,
        holder: Any,
        attr: Any,
        kind: str,
        on_death: Callable[[Any], None],
        key: tuple[int, Any] | None = None,
        title: str | None = None,
    ) -> None:
        try:
            self.ref: Callable[[], Any] = weakref.ref(holder, on_death)
        except TypeError:
            self.ref = Strong(holder)
        self.attr = attr
        self.kind = kind
        #: an instance's path from the object its first apply was given (``model.mtp.layers[0]``), once named
        self.path: str | None = None
        self.key = (identity(holder), attr) if key is None else key
        self.title = title  # how an item's mapping is named (its import path), else the holder's label
        self.layers: list[Layer] = []
        #: our layers that others depend on: {our layer: the layers over it}; None when there are none. Over it:
        #: another registry's layer on this attribute, or a wrap (any registry's) of this class attribute
        #: installed on a subclass or an instance, which calls what it wrapped
        self.dependents: dict[Layer, list[Layer]] | None = None

    @property
    def label(self) -> str:
        """How reports and messages name the holder: an item's mapping by its title, an instance by its path
        from the object passed (once named), else :func:`label`."""
        if self.title is not None:
            return self.title
        if self.path is not None:
            return self.path
        holder = self.ref()
        return "<dead object>" if holder is None else label(holder)

    @property
    def address(self) -> str:
        """The holder's type and address (an instance), dotted name, or an item mapping's title: tells holders apart."""
        if self.title is not None:
            return self.title
        holder = self.ref()
        return "<dead object>" if holder is None else label(holder)

    @property
    def where(self) -> str:
        """``holder.attr`` (``mapping['key']`` for an item), as messages name it."""
        return f"{self.label}[{self.attr!r}]" if self.kind == "item" else f"{self.label}.{self.attr}"

    def current(self) -> Any:
        holder = self.ref()
        if holder is None:
            return ABSENT
        if self.kind == "item":
            return holder.get(self.attr, ABSENT)
        return vars(holder).get(self.attr, ABSENT)


def entry(layer: Layer, state: str | None = None) -> Installed:
    """An :class:`Installed` copy of one of a registry's installs (its layer).

    ``state="reverted"`` shows the layer as released (count 0), whoever else still uses it.
    """
    patch, site = layer.patch, layer.stack
    count = 0 if state == "reverted" else layer.count
    if state is None:
        state = "active" if count > 0 else "reverted"
    return Installed(
        patch=patch.name,
        target=str(patch.where),
        holder=site.label,
        attr=site.attr if isinstance(site.attr, str) else repr(site.attr),
        kind=patch.kind,
        count=count,
        since=layer.since / 1e9,
        state=state,
        address=site.address,
        item=site.kind == "item",
    )


class Report:
    """What one ``apply`` did, and the references it holds until it is reverted (once).

    ``installed`` counts new installs, ``skipped`` holds ``(name, reason)`` pairs. It stays
    readable after the block ends: ``entries`` then show count 0 and state "reverted".
    Its fields are the store's record of the apply, which only :mod:`patchreg._store` writes; its properties read
    them.
    """

    __slots__ = ("clean", "layers", "new_installs", "owner", "released", "set_name", "skips", "unwound", "waiting")

    owner: Any  # the Registry
    set_name: str
    new_installs: int
    skips: tuple[tuple[str, str], ...]
    layers: list[Layer]  # the installs this apply took a user of, in order
    waiting: Sequence[Pending]  # its lazy patches (a list when it has some)
    released: bool
    unwound: int  # how many layers, from the end, were released (an interrupted release resumes)
    #: every layer a planned clean install (a method bound to its holder, on an instance attribute absent
    #: before, held by weak reference; no lazy patch): its release checks only what can have changed since
    clean: bool

    @classmethod
    def make(cls, owner: Any, name: str, skipped: tuple[tuple[str, str], ...] = ()) -> Report:
        """An empty report of ``owner`` for the set ``name``. (No ``__init__``: the fast path makes its report with
        a bare ``Report()``, the cheapest allocation.)"""
        self = cls()
        self.owner = owner
        self.set_name = name
        self.skips = skipped
        self.layers = []
        self.waiting = ()
        self.released = False
        self.unwound = 0
        self.new_installs = 0
        self.clean = False
        return self

    @property
    def name(self) -> str:
        """The patch set's name."""
        return self.set_name

    @property
    def installed(self) -> int:
        """How many installs this apply made (shared ones count 0)."""
        return self.new_installs

    @property
    def skipped(self) -> tuple[tuple[str, str], ...]:
        """``(patch name, reason)`` for every patch this apply skipped."""
        return self.skips

    @property
    def entries(self) -> tuple[Installed, ...]:
        """The installs this apply held a reference on (new or shared).

        One this report released shows count 0 and state "reverted", though another user may still
        hold it; the others show the install's count (0 and "reverted" once its last user let go).
        """
        ledger = self
        live = len(ledger.layers) - ledger.unwound
        return tuple(entry(la, None if i < live else "reverted") for i, la in enumerate(ledger.layers))

    @property
    def pending(self) -> tuple[str, ...]:
        """Names of lazy patches still waiting for their module to be imported."""
        return tuple(p.patch.name for p in self.waiting if p.state == "pending")

    @property
    def held(self) -> int:
        """How many installs this apply still holds a reference on.

        An install released otherwise (``revert(patch)``, ``revert_all()``: its count is 0) is not held.
        """
        ledger = self
        if ledger.released:
            return 0
        return sum(1 for la in ledger.layers[: len(ledger.layers) - ledger.unwound] if la.count > 0)

    @property
    def reverted(self) -> bool:
        """True once this apply's references were released: through it, or by ``revert(patch)``/``revert_all()``.

        A report that took nothing (every patch skipped) is reverted only through itself.
        """
        ledger = self
        if ledger.released:
            return True
        if self.held or self.pending:
            return False
        return bool(ledger.layers) or any(p.state == "cancelled" for p in ledger.waiting)

    def __repr__(self) -> str:
        return f"<Report {self.name!r}: {self.installed} installed, {self.held} held, {len(self.skipped)} skipped>"

    def __str__(self) -> str:
        state = " (reverted)" if self.reverted else ""
        lines = [
            f"patch set {self.name!r}{state}: {self.installed} newly installed, {self.held} held, "
            f"{len(self.skipped)} skipped"
        ]
        rows = [(e.state, e.patch, f"{e.where} (count {e.count})") for e in self.entries]
        rows += [("pending", name, "installed when its module is imported") for name in self.pending]
        rows += [("skipped", name, reason) for name, reason in self.skipped]
        rows += [("verified" if d.ok else "review", name, d.text) for name, d in self.drift]
        for state, name, text in rows:  # within WIDTH columns: a long reason goes on under itself
            lead = f"  {state:<8} {name:<24} "
            first, *rest = wrap(text, max(WIDTH - len(lead), 40))
            lines += [lead + first, *(" " * len(lead) + part for part in rest)]
        return "\n".join(lines)

    @property
    def drift(self) -> tuple[tuple[str, Drift], ...]:
        """``(patch name, Drift)`` for each patch this apply installed that declares ``verified=``.

        ``Drift.ok`` is False when the upstream body is not one it was verified against: a warning
        to review the patch (it is installed all the same).
        """
        seen: dict[str, Drift] = {}
        for layer in self.layers:
            patch = layer.patch
            if patch.verified is not None and patch.name not in seen:
                seen[patch.name] = drift(patch.verified, patch)
        return tuple(seen.items())


class Pending:
    """A lazy patch waiting for its module to be imported.

    ``state``: ``"pending"``, then ``"installed"``, ``"skipped: <reason>"``, ``"failed: <error>"`` or ``"cancelled"``.
    """

    __slots__ = ("ledger", "module", "patch", "since", "state")

    def __init__(self, patch: Patch, ledger: Report) -> None:
        self.patch = patch
        self.ledger = ledger
        self.module: str = patch.where.module  # type: ignore[union-attr]
        self.since = time.time()
        self.state = "pending"

    def entry(self) -> Installed:
        patch = self.patch
        if patch.is_item:  # as an item's install reads: the mapping's import path, then the key
            holder, attr = str(patch.where), patch.key if isinstance(patch.key, str) else repr(patch.key)
        else:
            *owner, attr = patch.where.parts  # type: ignore[union-attr]
            holder = ".".join((self.module, *owner))  # as an install's holder reads: module, then qualname
        return Installed(
            patch.name, str(patch.where), holder, attr, patch.kind, 0, self.since, "pending", holder, patch.is_item
        )


class Checkpoint:
    """One moment of a registry (see :meth:`Registry.checkpoint`): the applies made since, while it lives."""

    __slots__ = ("__weakref__", "installs", "ledgers", "owner")

    def __init__(self, owner: Any, installs: int) -> None:
        self.owner = owner
        self.installs = installs  # how many installs there were (its repr); it holds none of them
        self.ledgers: list[Report] = []  # the applies made since, in order

    def __repr__(self) -> str:
        return f"<Checkpoint of {self.installs} install(s) in {self.owner.name!r}>"


#: Every live registry's store (:class:`patchreg._store.Store`, weakly): cross-registry ownership and a patch's backup
#: look through all of them. A store adds itself when it is made.
STORES: weakref.WeakSet[Any] = weakref.WeakSet()


def originals(patch: Patch) -> list[tuple[Any, Any]]:
    """``(holder, original)`` of every live install of ``patch`` in any registry, oldest first."""
    found: list[tuple[int, Any, Any]] = []
    with LOCK:
        for store in list(STORES):
            for stack in store.stacks.values():
                holder = stack.ref()
                if holder is not None:
                    found.extend((la.seq, holder, la.displaced()) for la in stack.layers if la.patch is patch)
    found.sort(key=lambda item: item[0])
    return [(holder, original) for _seq, holder, original in found]


ORIGINALS.append(originals)  # what a Patch's backup reads (the records cannot import this module, which imports them)


def top_owner(key: tuple[int, str], holder: Any, current: Any, skip: Any = None) -> tuple[Any, Stack, Layer] | None:
    """The topmost live layer, of any registry but ``skip``'s, that installed ``current`` on ``holder``'s attribute."""
    found: tuple[Any, Stack, Layer] | None = None
    for installs in list(STORES):
        if installs is skip:
            continue
        other = installs.stacks.get(key)
        if other is None or not other.layers or other.ref() is not holder:
            continue
        top = other.layers[-1]
        if top.count > 0 and top.owns(current) and (found is None or top.seq > found[2].seq):
            found = (installs, other, top)
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
