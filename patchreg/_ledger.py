"""The state's records: a stack (one attribute, or one key of a mapping, and the layers installed on it), a layer (one
patch installed there by one registry), the report of an apply, a lazy patch waiting for its import, a checkpoint.

Only :mod:`patchreg._state` writes them; reports, ``explain`` and the checks read them. On an instance a layer holds
neither what it installed nor the original strongly where that would keep the instance alive: a weak reference, or
an identity.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from patchreg._drift import Drift, drift
from patchreg._format import WIDTH, wrap
from patchreg._namespace import ABSENT, label, same
from patchreg._records import Installed, Patch
from patchreg._targets import identity

__all__ = [
    "GONE",
    "Checkpoint",
    "Layer",
    "Pending",
    "Plan",
    "Report",
    "Stack",
    "Step",
    "Strong",
    "WeakOriginal",
    "entry",
    "no_holder",
    "plan_key",
    "weak_or_id",
]

Ref = weakref.ReferenceType
GONE = object()  # a weakly held original that died (what kept it alive was removed by someone else)


def weak_or_id(obj: Any) -> Any:
    """How an instance's layer holds an object: a weak reference, or else its identity."""
    if not type(obj).__weakrefoffset__:  # (asked first: a refused weak reference raises, which is dear)
        return identity(obj)
    try:
        return Ref(obj)
    except TypeError:
        return identity(obj)


class WeakOriginal:
    """An original held weakly because the object installed over it keeps it alive."""

    __slots__ = ("ref",)

    def __init__(self, ref: weakref.ref[Any]) -> None:
        self.ref = ref


class Stack:
    """One attribute on one holder (held weakly), or one key of a mapping, and the layers of every registry on it.

    ``kind``: ``"module"``, ``"class"``, ``"instance"`` or ``"item"``; layers bottom first, each live (a released
    layer leaves its stack). A mapping that cannot be weakly referenced (a dict) is held strongly while the stack has
    layers.
    """

    __slots__ = ("__weakref__", "attr", "checked", "key", "kind", "layers", "path", "ref", "title")

    def __init__(
        self, ref: Callable[[], Any], attr: Any, kind: str, key: tuple[int, Any], title: str | None, checked: bool
    ) -> None:
        self.ref = ref
        self.checked = checked  # writes are read back (a custom __setattr__ or __setitem__ may store another)
        self.attr = attr
        self.kind = kind
        self.key = key
        self.title = title  # how an item's mapping is named (its import path), else None
        #: an instance's path from the object its first apply was given (``model.mtp.layers[0]``), once named
        self.path: str | None = None
        self.layers: list[Layer] = []

    @property
    def label(self) -> str:
        """How reports and messages name the holder: an item's mapping by its title, an instance by its path from the
        object passed (once named), else :func:`~patchreg._namespace.label`."""
        if self.title is not None:
            return self.title
        if self.path is not None:
            return self.path
        holder = self.ref()
        return "<dead object>" if holder is None else label(holder)

    @property
    def address(self) -> str:
        """The holder's type and address (an instance), dotted name, or a mapping's title: tells holders apart."""
        if self.title is not None:
            return self.title
        holder = self.ref()
        return "<dead object>" if holder is None else label(holder)

    @property
    def where(self) -> str:
        """``holder.attr`` (``mapping['key']`` for an item), as messages name it."""
        return f"{self.label}[{self.attr!r}]" if self.kind == "item" else f"{self.label}.{self.attr}"

    def current(self) -> Any:
        """What the holder's own namespace (or the mapping) stores there now; ``ABSENT`` for nothing."""
        holder = self.ref()
        if holder is None:
            return ABSENT
        if self.kind == "item":
            return holder.get(self.attr, ABSENT)
        return vars(holder).get(self.attr, ABSENT)


class Layer:
    """One patch installed on one stack by one registry, with its user count and the original it displaced.

    ``owns`` is an ``is`` test for the installed object that keeps no strong reference to an instance it was bound
    to (on an instance the installed object is held weakly, or by identity). ``uppers`` are the layers that call what
    this one installed (a wrap on a subclass or an instance of the class this one patched): this one is released
    after them.
    """

    patch: Patch
    stack: Stack
    owner: Any  # the registry's book (patchreg._state.Book)
    since: int  # time.time_ns() at install
    seq: int  # the install order across registries
    original: Any  # what patch.backup shows (read it through displaced()); None once restored
    installed: Any  # what was installed (on an instance: its weak reference or identity)
    __slots__ = ("count", "installed", "order", "original", "owner", "patch", "seq", "since", "stack", "uppers")
    count: int
    uppers: list[Layer] | None
    order: list[Any] | None  # a dict patch's mapping keys in their order before its first key was installed

    def displaced(self) -> Any:
        """The original this layer displaced (``GONE`` once a weakly held one died with what kept it)."""
        original = self.original
        if type(original) is not WeakOriginal:
            return original
        found = original.ref()
        return GONE if found is None else found

    def owns(self, current: Any) -> bool:
        """True when ``current`` is the very object this layer installed (an equal plain value for an item)."""
        installed = self.installed
        kind = self.stack.kind
        if kind != "instance":
            return current is installed or (kind == "item" and same(kind, current, installed))
        if type(installed) is Ref:
            mine = installed()  # None once what was installed is gone: then nothing there is ours
            return mine is not None and mine is current
        return bool(identity(current) == installed)


class Step(NamedTuple):
    """One install a plan makes: ``patch`` on ``stack``, made by the binding rule for what the holder stored when
    planned (``found``): ``value`` as it is, or ``make(holder)``.

    On an instance the step holds while the holder is still of the class ``cls``, which still stores the attribute
    as read (``view[attr] is raw``, the MRO unchanged, no class before the owner defining it: ``above``). What the
    binding made is installed again while the holder stores ``found`` (on an instance a weak reference or an
    identity, as a layer holds it) and the class attribute it binds or wraps is still ``raw`` (``view``: None where it
    read none); else the rule runs again. ``order``: a dict patch's mapping keys, in their order when resolved;
    ``calls``: a wrap on an instance or a class, which may call what the class attribute it inherits holds.
    """

    patch: Patch
    stack: Stack
    found: Any
    value: Any
    make: Callable[[Any], Any] | None
    cls: type | None
    mro: tuple[type, ...]
    view: Any  # a class's vars() view, or None
    raw: Any
    above: tuple[Any, ...]
    order: list[Any] | None
    calls: bool  # a wrap on an instance or a class: it may call what a class attribute it inherits holds


class Strong:
    """A strong reference with a weak reference's call: for a mapping (a dict) that has no weak references."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def no_holder() -> None:
    """The reference of a stack whose mapping it let go."""
    return None


def plan_key(target: object, obj: Any) -> tuple[int, ...]:
    """The key of a plan: the identities of the target and of the object (or -1, then each chunk's)."""
    if isinstance(obj, (list, tuple)):
        return (identity(target), -1, *map(identity, obj))
    return (identity(target), identity(obj))


class Plan:
    """What resolving a Patch or PatchSet on an object found: the steps an apply takes, the skips, and the patches
    resolved again at every apply (``again``: misses, creations, items, deletions, walks a guard cannot follow).

    A plan kept by a registry is re-used while ``holds(obj)`` says resolving again would find the same holders and
    no ``refresh()`` ran since (``gen``). It holds its target, its object and their holders weakly (their classes and
    modules strongly): it never keeps its object alive, and goes with it.
    """

    __slots__ = (
        "__weakref__",
        "again",
        "book",
        "gen",
        "holds",
        "key",
        "name",
        "obj",
        "parts",
        "patches",
        "refs",
        "skipped",
        "steps",
        "target",
        "waiting",
    )

    name: str
    patches: tuple[Patch, ...]
    steps: list[Step]
    skipped: tuple[tuple[str, str], ...]
    again: tuple[Patch, ...]
    parts: tuple[tuple[Patch, list[Step] | None], ...]  # per patch found: its steps, or None (resolved again)
    waiting: tuple[Patch, ...]  # lazy patches whose module is not imported yet
    holds: Callable[[Any], bool]
    gen: int
    key: tuple[int, ...]
    book: Any  # a weak reference to the registry's book that keeps it
    refs: tuple[weakref.ref[Any], ...]  # the target's, then each chunk's
    target: Callable[[], Any]  # refs[0]
    obj: Callable[[], Any]  # the one object's weak reference (made for chunks or None: never the object)

    def matches(self, target: object, obj: Any) -> bool:
        """True when this plan was made for ``target`` on ``obj`` (the same objects, not equal ones)."""
        refs = self.refs
        if refs[0]() is not target:
            return False
        chunks = len(self.key) > 1 and self.key[1] == -1  # (made for a list or tuple of chunks)
        if isinstance(obj, (list, tuple)):
            return chunks and len(refs) == len(obj) + 1 and all(r() is c for r, c in zip(refs[1:], obj, strict=True))
        return not chunks and ((obj is None and len(refs) == 1) or (len(refs) == 2 and refs[1]() is obj))

    def forget(self, _dead: object = None) -> None:
        """Drop this plan from its registry (its target or object died)."""
        book = self.book()
        if book is not None:
            book.forget(self)


def entry(layer: Layer, state: str | None = None) -> Installed:
    """An :class:`Installed` copy of one install (its layer); ``state="reverted"`` shows it released (count 0)."""
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
    """What one ``apply`` did, and the users it holds until it is reverted (once).

    ``installed`` counts new installs, ``skipped`` holds ``(name, reason)`` pairs. It stays readable after the block
    ends: ``entries`` then show count 0 and state "reverted". What it shows is built when it is read, from the
    layers it took and the plan it ran (only :mod:`patchreg._state` writes its fields).
    """

    __slots__ = ("layers", "new_installs", "owner", "released", "repeats", "set_name", "skips", "unwound", "waiting")

    def __init__(self, owner: Any, name: str, skipped: tuple[tuple[str, str], ...]) -> None:
        self.owner = owner  # the Registry
        self.set_name = name
        self.skips = skipped
        self.layers: list[Layer] = []  # the installs this apply took a user of, in order
        self.waiting: Sequence[Pending] = ()  # its lazy patches (a list when it has some)
        self.released = False
        self.unwound = 0  # how many layers, from the end, were released (an interrupted release resumes)
        self.new_installs = 0
        self.repeats = False  # a layer is twice in layers (a site twice in one apply)

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
        """The installs this apply held a user of (new or shared).

        One this report released shows count 0 and state "reverted", though another user may still hold it; the
        others show the install's count (0 and "reverted" once its last user let go).
        """
        live = len(self.layers) - self.unwound
        return tuple(entry(la, None if i < live else "reverted") for i, la in enumerate(self.layers))

    @property
    def pending(self) -> tuple[str, ...]:
        """Names of lazy patches still waiting for their module to be imported."""
        return tuple(p.patch.name for p in self.waiting if p.state == "pending")

    @property
    def held(self) -> int:
        """How many installs this apply still holds a user of (one released otherwise, by ``revert(patch)`` or
        ``revert_all()``, is not held)."""
        if self.released:
            return 0
        return sum(1 for la in self.layers[: len(self.layers) - self.unwound] if la.count > 0)

    @property
    def reverted(self) -> bool:
        """True once this apply's users were released: through it, or by ``revert(patch)``/``revert_all()``.

        A report that took nothing (every patch skipped) is reverted only through itself.
        """
        if self.released:
            return True
        if self.held or self.pending:
            return False
        return bool(self.layers) or any(p.state == "cancelled" for p in self.waiting)

    @property
    def drift(self) -> tuple[tuple[str, Drift], ...]:
        """``(patch name, Drift)`` for each patch this apply installed that declares ``verified=``.

        ``Drift.ok`` is False when the upstream body is not one it was verified against: a warning to review the
        patch (it is installed all the same).
        """
        seen: dict[str, Drift] = {}
        for layer in self.layers:
            patch = layer.patch
            if patch.verified is not None and patch.name not in seen:
                seen[patch.name] = drift(patch.verified, patch)
        return tuple(seen.items())

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


class Pending:
    """A lazy patch waiting for its module to be imported.

    ``state``: ``"pending"``, then ``"installed"``, ``"skipped: <reason>"``, ``"failed: <error>"`` or ``"cancelled"``.
    """

    __slots__ = ("book", "ledger", "module", "patch", "since", "state")

    def __init__(self, patch: Patch, ledger: Report, book: Any) -> None:
        self.patch = patch
        self.ledger = ledger
        self.book = book  # the registry's book, whose pending list holds it
        self.module: str = patch.where.module  # type: ignore[union-attr]
        self.since = time.time()
        self.state = "pending"

    def entries(self) -> list[Installed]:
        """How the installs it waits to make read: one per attribute, or one per key of a mapping (a dict patch: each
        key it sets; with ``clear=True`` the keys it clears are only known at its import)."""
        patch = self.patch
        if patch.is_item:  # as an item's install reads: the mapping's import path, then the key
            keys = list(patch.replacement) if patch.kind == "dict" else [patch.key]
            places = [(str(patch.where), k if isinstance(k, str) else repr(k)) for k in keys]
        else:
            *owner, attr = patch.where.parts  # type: ignore[union-attr]
            places = [(".".join((self.module, *owner)), attr)]  # as an install's holder reads: module, then qualname
        target, kind, item = str(patch.where), patch.kind, patch.is_item
        return [Installed(patch.name, target, h, a, kind, 0, self.since, "pending", h, item) for h, a in places]


class Checkpoint:
    """One moment of a registry (see :meth:`Registry.checkpoint`): the applies made since, while it lives."""

    __slots__ = ("__weakref__", "installs", "ledgers", "owner")

    def __init__(self, owner: Any, installs: int) -> None:
        self.owner = owner
        self.installs = installs  # how many installs there were (its repr); it holds none of them
        self.ledgers: list[Report] = []  # the applies made since, in order

    def __repr__(self) -> str:
        return f"<Checkpoint of {self.installs} install(s) in {self.owner.name!r}>"
