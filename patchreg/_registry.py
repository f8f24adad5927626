"""The Registry: installs patches, counts their users, restores the originals exactly.

It is the only owner of patch state. Namespaces are written directly (``vars(instance)``)
or through ``setattr``/``delattr`` (classes, modules); originals are read raw from
``vars()`` along the MRO, never through ``getattr``, which would bind descriptors.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
import wrapt

from patchreg._format import table
from patchreg._predicates import distributions, on_refresh
from patchreg._records import ABSENT, Installed, Patch, PatchSet, Report
from patchreg._targets import Miss, Site
from patchreg.exceptions import (
    PatchConflictError,
    PatchDefinitionError,
    PatchOwnershipError,
    TargetNotFoundError,
    UnpatchableTargetError,
)

__all__ = ["Checkpoint", "Explanation", "Registry"]

log = logging.getLogger("patchreg")

#: One lock for every registry: they all write the same namespaces.
_LOCK = threading.RLock()
if hasattr(os, "register_at_fork"):  # a fork waits out any apply/revert in flight; the child's lock is free
    os.register_at_fork(before=_LOCK.acquire, after_in_parent=_LOCK.release, after_in_child=_LOCK.release)
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE

F = TypeVar("F", bound=Callable[..., Any])
Target = Patch | PatchSet | Iterable[Patch]


class _Layer:
    """One patch installed on one site, with its user count.

    ``owns`` is an ``is`` test for the installed object that keeps no strong reference to
    an instance it was bound to: bound methods are recognised by id and function, other
    objects on instances through a weak reference.
    """

    __slots__ = ("count", "func", "installed", "patch", "since", "site")

    def __init__(self, patch: Patch, site: _Site, installed: Any, since: float) -> None:
        self.patch = patch
        self.site = site
        self.count = 1
        self.since = since
        self.func: Any = None
        if site.kind != "instance":
            self.installed: Any = installed
        elif type(installed) is types.MethodType:
            self.installed, self.func = id(installed), installed.__func__
        else:
            try:
                self.installed = weakref.ref(installed)
            except TypeError:
                self.installed = id(installed)

    def owns(self, current: Any) -> bool:
        """True when ``current`` is the very object this layer installed."""
        if self.site.kind != "instance":
            return current is self.installed
        if self.func is not None:
            return id(current) == self.installed and getattr(current, "__func__", None) is self.func
        if type(self.installed) is int:
            return id(current) == self.installed
        return self.installed() is current


class _Site:
    """One attribute on one holder, and the stack of our layers on it (bottom first)."""

    __slots__ = ("attr", "key", "kind", "layers", "ref")

    def __init__(self, holder: Any, attr: str, kind: str, on_death: Callable[[Any], None]) -> None:
        self.ref = weakref.ref(holder, on_death)
        self.attr = attr
        self.kind = kind
        self.key = (id(holder), attr)
        self.layers: list[_Layer] = []

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


def _kind_of(holder: Any) -> str:
    if isinstance(holder, types.ModuleType):
        return "module"
    return "class" if isinstance(holder, type) else "instance"


class _Claim:
    """The layers one ``apply`` took a reference on (and its lazy patches); released once.

    ``layers`` is kept for reporting; ``done`` counts how many, from the end, were released
    (a release interrupted half-way is retried for the rest only).
    """

    __slots__ = ("done", "installed", "layers", "name", "owner", "pending", "released", "skipped")

    def __init__(self, owner: Registry, name: str) -> None:
        self.owner = owner
        self.name = name
        self.layers: list[_Layer] = []
        self.pending: list[_Pending] = []
        self.released = False
        self.done = 0
        self.installed = 0
        self.skipped: tuple[tuple[str, str], ...] = ()

    def held(self) -> int:
        return 0 if self.released else len(self.layers) - self.done

    def entries(self) -> tuple[Installed, ...]:
        live = len(self.layers) - self.done
        return tuple(_installed(la, None if i < live else "reverted") for i, la in enumerate(self.layers))


class _Pending:
    """A lazy patch waiting for its module to be imported."""

    __slots__ = ("claim", "module", "patch", "since", "state")

    def __init__(self, patch: Patch, claim: _Claim) -> None:
        self.patch = patch
        self.claim = claim
        self.module: str = patch.where.module  # type: ignore[union-attr]
        self.since = time.time()
        self.state = "pending"

    def entry(self) -> Installed:
        patch = self.patch
        holder, _, attr = str(patch.where).rpartition(".")
        return Installed(patch.name, str(patch.where), holder, attr, patch.kind, 0, self.since, "pending")


def _installed(layer: _Layer, state: str | None = None) -> Installed:
    patch, site = layer.patch, layer.site
    if state is None:
        state = "active" if layer.count > 0 else "reverted"
    return Installed(
        patch=patch.name,
        target=str(patch.where),
        holder=site.label,
        attr=site.attr,
        kind=patch.kind,
        count=layer.count,
        since=layer.since,
        state=state,
    )


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
    if isinstance(target, (list, tuple)) and all(isinstance(p, Patch) for p in target):
        return "patches", PatchSet("patches", target).patches  # the same checks as a set (unique names)
    msg = f"Expected a Patch or a PatchSet, got {target!r}; build one with Patch(...) or PatchSet(name, patches)."
    raise PatchDefinitionError(msg)


class Registry:
    """Applies and reverts patches; reference-counted, exact, thread-safe.

    ``apply`` installs what is not yet installed and counts a user for what is;
    ``revert`` (or the end of a ``patched`` block) releases one user, and the last
    user's release puts back exactly what was there.
    """

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self._sites: dict[tuple[int, str], _Site] = {}
        self._dead: list[Any] = []
        self._pending: list[_Pending] = []

    # -- applying -------------------------------------------------------------------------

    def apply(
        self, target: Target, obj: Any = None, *, strict: bool = False, warn: bool = False, lazy: bool = False
    ) -> Report:
        """Install every patch of ``target`` whose predicate holds; return a :class:`Report`.

        With ``lazy=True``, an import-path patch whose module is not imported yet is installed
        by a post-import hook when it is (its predicate evaluated then); reverting first cancels it.
        """
        name, patches = _patches(target)
        waiting = [p for p in patches if p.is_global and p.where.module not in sys.modules] if lazy else []  # type: ignore[union-attr]
        plan, skipped = self._plan(tuple(p for p in patches if p not in waiting) if waiting else patches, obj)
        if skipped and (strict or warn):
            self._report_skips(name, skipped, strict)
        claim = _Claim(self, name)
        if skipped:
            claim.skipped = tuple(skipped)
        with _LOCK:
            if self._dead:
                self._purge()
            claim.installed = self._take_all(plan, claim)
            if waiting:
                claim.pending = [_Pending(p, claim) for p in waiting]
                self._pending.extend(claim.pending)
        for pending in claim.pending:
            wrapt.register_post_import_hook(functools.partial(self._fire, pending), pending.module)
        return Report(claim)

    def _take_all(self, plan: list[tuple[Patch, list[Site]]], claim: _Claim) -> int:
        installed = 0
        now = time.time()
        try:
            for patch, sites in plan:
                for site in sites:
                    installed += self._take(patch, site, claim, now)
        except BaseException:
            self._release(claim)
            raise
        return installed

    def _fire(self, pending: _Pending, module: Any) -> None:
        """Post-import hook of a lazy patch: install it now unless it was cancelled."""
        if pending.state != "pending":
            return
        try:
            plan, skipped = self._plan((pending.patch,), None)
            with _LOCK:
                if pending.state != "pending":
                    return
                self._pending.remove(pending)
                pending.state = "skipped: " + skipped[0][1] if skipped else "installed"
                self._take_all(plan, pending.claim)
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
        self, patches: tuple[Patch, ...], obj: Any
    ) -> tuple[list[tuple[Patch, list[Site]]], list[tuple[str, str]]]:
        """Evaluate predicates and resolve targets, outside the lock; changes nothing."""
        plan, skipped = [], []
        for patch in patches:
            answer = patch.when.evaluate()
            if not answer.ok:
                skipped.append((patch.name, answer.reason))
                continue
            found = patch.where.resolve(obj)
            if isinstance(found, Miss):
                skipped.append((patch.name, found.reason))
                continue
            for site in found:
                _check_patchable(patch, site.holder, site.attr)
            plan.append((patch, found))
        return plan, skipped

    def _report_skips(self, name: str, skipped: list[tuple[str, str]], strict: bool) -> None:
        for patch_name, reason in skipped:
            log.warning("patchreg: %s.%s skipped: %s", name, patch_name, reason)
        if strict:
            lines = "; ".join(f"{n}: {r}" for n, r in skipped)
            msg = (
                f"Patch set {name!r} applied with strict=True, but {len(skipped)} patch(es) would be skipped: {lines}."
            )
            raise TargetNotFoundError(msg, target=name)

    def _take(self, patch: Patch, found: Site, claim: _Claim, now: float) -> int:
        """Count a user of ``patch`` on ``found``, installing it if it is the first; 1 if installed.

        Sites stay in the registry while their holder lives (weakly), so re-applying is cheap.
        """
        holder, attr = found
        key = (id(holder), attr)
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
                    claim.layers.append(layer)
                    return 0
            _check_compatible(patch, site)
        self._install(patch, site, holder, claim, now)
        return 1

    def _install(self, patch: Patch, site: _Site, holder: Any, claim: _Claim, now: float) -> None:
        original = site.current()
        value = _build(patch, site, holder, original)
        try:
            _write(site, holder, value)
        except (TypeError, AttributeError) as exc:
            msg = f"Cannot set {site.label}.{site.attr} for patch {patch.name!r}: {exc}. Patch the code that uses it instead."
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target) from exc
        patch.backup.push(holder, original)
        layer = _Layer(patch, site, value, now)
        site.layers.append(layer)
        claim.layers.append(layer)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("patchreg: installed %s on %s.%s", patch.name, site.label, site.attr)

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
            if target.claim.owner is not self:
                msg = f"Report {target!r} came from registry {target.claim.owner.name!r}; revert it there."
                raise PatchDefinitionError(msg, target=target.name)
            with _LOCK:
                return self._release(target.claim)
        _name, patches = _patches(target)
        hits = [(patch, self._hits(patch, obj)) for patch in patches]  # user code (selectors): outside the lock
        claim = _Claim(self, _name)
        with _LOCK:
            self._purge()
            self._cancel(p for p in self._pending if p.patch in patches)
            for patch, found in hits:
                for site in self._sites_of(patch, found):
                    claim.layers.extend(la for la in site.layers if la.patch is patch and la.count > 0)
            return self._release(claim)

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
            site = self._sites.get((id(hit.holder), hit.attr))
            if site is not None and site.ref() is hit.holder:
                sites.append(site)
        return sites

    def _release(self, claim: _Claim) -> int:
        """Drop one user per layer of ``claim`` (last taken first); all or nothing."""
        if claim.released:
            return 0
        self._cancel(claim.pending)
        taken = claim.layers
        todo = len(taken) - claim.done
        layers = [la for la in reversed(taken[:todo]) if la.count > 0 and la.site.ref() is not None]
        _check_release(layers)
        restored = 0
        for i in range(todo - 1, -1, -1):  # last taken first
            layer = taken[i]
            if layer.count > 0 and layer.site.ref() is not None:
                if layer.count == 1:  # restore before forgetting: an interrupt loses nothing
                    self._uninstall(layer)
                    restored += 1
                layer.count -= 1
            claim.done += 1  # a retry after an interrupt releases only the rest
        claim.released = True
        return restored

    def _uninstall(self, layer: _Layer) -> None:
        site = layer.site
        holder = site.ref()
        original = layer.patch.backup.get(holder)
        if original is ABSENT:
            _delete(site, holder)
        else:
            _write(site, holder, original)
        layer.patch.backup.pop(holder)
        site.layers.pop()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("patchreg: restored %s.%s (%s)", site.label, site.attr, layer.patch.name)

    def revert_all(self) -> int:
        """Restore every original this registry displaced (top layers first); return how many."""
        restored = 0
        with _LOCK:
            self._purge()
            self._cancel(self._pending)
            for site in list(self._sites.values()):
                while site.layers and site.ref() is not None:
                    layer = site.layers[-1]
                    _check_release([layer] * layer.count)
                    self._uninstall(layer)
                    layer.count = 0
                    restored += 1
        return restored

    def checkpoint(self) -> Checkpoint:
        """Remember the current users of every install, for :meth:`rollback`."""
        with _LOCK:
            self._purge()
            counts = {la: la.count for s in self._sites.values() for la in s.layers}
            return Checkpoint(self, counts, frozenset(self._pending))

    def rollback(self, checkpoint: Checkpoint) -> int:
        """Release every user added since ``checkpoint`` (and cancel newer lazy patches); return restores."""
        if checkpoint.owner is not self:
            msg = f"Checkpoint came from registry {checkpoint.owner.name!r}; roll back there."
            raise PatchDefinitionError(msg)
        claim = _Claim(self, "rollback")
        with _LOCK:
            self._purge()
            self._cancel(p for p in self._pending if p not in checkpoint.pending)
            for site in self._sites.values():
                for layer in site.layers:  # bottom first: the release runs top first
                    claim.layers.extend([layer] * (layer.count - checkpoint.counts.get(layer, 0)))
            return self._release(claim)

    def patched(self, target: Target, obj: Any = None, *, strict: bool = False) -> Patched:
        """A context manager (and decorator) that applies on entry and reverts on exit."""
        _patches(target)  # fail at the call site on a bad target
        return Patched(self, target, obj, strict)

    # -- introspection --------------------------------------------------------------------

    def active(self) -> tuple[Installed, ...]:
        """Copies of every active install, in install order per attribute."""
        with _LOCK:
            self._purge()
            live = [_installed(la) for s in self._sites.values() if s.ref() is not None for la in s.layers]
            return (*live, *(p.entry() for p in self._pending))

    def is_active(self, name: str, obj: Any = None) -> bool:
        """True when a patch named ``name`` is installed (on ``obj``, or what ``obj`` contains)."""
        with _LOCK:
            self._purge()
            patches = {la.patch for s in self._sites.values() for la in s.layers if la.patch.name == name}
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
        try:
            found = patch.where.resolve(obj)
        except UnpatchableTargetError as exc:
            return [(patch.name, "-", "error", str(exc))]
        if isinstance(found, Miss):
            return [(patch.name, "-", "skip", found.reason)]
        return [(patch.name, _label(hit.holder) + "." + hit.attr, *self._would(patch, hit)) for hit in found]

    def _would(self, patch: Patch, hit: Site) -> tuple[str, str]:
        with _LOCK:
            site = self._sites.get((id(hit.holder), hit.attr))
            if site is not None and site.ref() is hit.holder:
                for layer in site.layers:
                    if layer.patch is patch:
                        return "share", f"already installed (count {layer.count}); {answer_reason(patch)}"
                try:
                    _check_compatible(patch, site)
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
        rows = [
            (e.patch, e.target, f"{e.holder}.{e.attr}", str(e.count), e.state, f"{now - e.since:.1f}s ago")
            for e in self.active()
        ]
        if not rows:
            return f"registry {self.name!r}: nothing active"
        return f"registry {self.name!r}: {len(rows)} active install(s)\n" + table(
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
        return f"<patchreg.Registry {self.name!r}: {n} active install(s) on {len(sites)} attribute(s)>"


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def answer_reason(patch: Patch) -> str:
    """The reason of a patch's (cached) predicate answer."""
    return patch.when.evaluate().reason


class Checkpoint:
    """The users of every install at one moment (see :meth:`Registry.checkpoint`)."""

    __slots__ = ("counts", "owner", "pending")

    def __init__(self, owner: Registry, counts: dict[_Layer, int], pending: frozenset[_Pending]) -> None:
        self.owner = owner
        self.counts = counts
        self.pending = pending

    def __repr__(self) -> str:
        return f"<Checkpoint of {len(self.counts)} install(s) in {self.owner.name!r}>"


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
        @functools.wraps(func)
        def patched_call(*args: Any, **kwargs: Any) -> Any:
            with Patched(self.registry, self.target, self.obj, self.strict):
                return func(*args, **kwargs)

        return patched_call  # type: ignore[return-value]

    def __repr__(self) -> str:
        name = _patches(self.target)[0]
        return f"<patched {name!r} via {self.registry.name!r}>"


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
        if not _verified(type(holder), attr):
            _check_instance_class(patch, type(holder), attr)
    if patch.kind == "wrap":
        _check_wrappable(patch, holder, attr)


#: Classes whose instances were found patchable for an attribute: id(cls) -> (weakref, {attr: raw
#: class attribute}). Cleared by patchreg.refresh() (after changing a class's descriptors).
_VERIFIED: dict[int, tuple[weakref.ref[type], dict[str, Any]]] = {}


def _verified(cls: type, attr: str) -> bool:
    entry = _VERIFIED.get(id(cls))
    return entry is not None and attr in entry[1] and entry[0]() is cls


def _check_instance_class(patch: Patch, cls: type, attr: str) -> None:
    if not cls.__weakrefoffset__:
        msg = (
            f"Cannot patch {attr!r} on a {cls.__qualname__} instance (target {str(patch.where)!r}): it does not "
            "support weak references, so patchreg could not let it be freed; add '__weakref__' to its __slots__."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    raw = _class_raw(cls, attr)
    if raw is not ABSENT and hasattr(type(raw), "__set__"):
        msg = (
            f"Cannot patch {attr!r} on a {cls.__qualname__} instance (target {str(patch.where)!r}): the class "
            f"defines it as a data descriptor ({type(raw).__name__}), which an instance attribute cannot shadow; "
            f"patch the class with '{cls.__module__}:{cls.__qualname__}.{attr}'."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    entry = _VERIFIED.get(id(cls))
    if entry is None or entry[0]() is not cls:
        entry = _VERIFIED[id(cls)] = (weakref.ref(cls), {})
    entry[1][attr] = raw


def _forget_verified() -> None:
    _VERIFIED.clear()


on_refresh(_forget_verified)


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


def _check_compatible(patch: Patch, site: _Site) -> None:
    """Two replaces on one attribute conflict; a replace over wraps would discard them."""
    if patch.kind == "wrap" or not site.layers:
        return
    other = site.layers[-1].patch
    if other.kind == "replace":
        what = f"also replaces {site.label}.{site.attr}"
    else:
        what = f"wraps {site.label}.{site.attr}, and a replace installed over it would discard that wrapper"
    msg = (
        f"Patch {patch.name!r} replaces {site.label}.{site.attr}, but patch {other.name!r} {what}; "
        "revert one of them first, or make one a kind='wrap' patch (wraps stack)."
    )
    raise PatchConflictError(msg, patch=patch, target=patch.target)


def _check_release(layers: list[_Layer]) -> None:
    """Verify every uninstall in ``layers`` can happen, in order, before any of them does."""
    counts: dict[_Layer, int] = {}
    tops: dict[_Site, list[_Layer]] = {}
    for layer in layers:
        left = counts[layer] = counts.get(layer, layer.count) - 1
        if left > 0:
            continue
        site = layer.site
        stack = tops.get(site)
        if stack is None:
            stack = tops[site] = site.layers[:]
            current = site.current()
            if stack[-1] is layer and not layer.owns(current):
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
        return _class_raw(holder, attr)
    if isinstance(holder, types.ModuleType):
        return vars(holder).get(attr, ABSENT)
    value = vars(holder).get(attr, ABSENT)
    return value if value is not ABSENT else _class_raw(type(holder), attr)


def _class_raw(cls: type, attr: str) -> Any:
    for klass in cls.__mro__:
        ns = vars(klass)
        if attr in ns:
            return ns[attr]
    return ABSENT


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
        raw = _class_raw(holder, site.attr)
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
        return value.__get__(holder, cls) if bound and hasattr(value, "__get__") else value
    entry = _VERIFIED.get(id(cls))
    raw = entry[1].get(attr, ABSENT) if entry is not None and entry[0]() is cls else _class_raw(cls, attr)
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


def _delete(site: _Site, holder: Any) -> None:
    if site.kind == "instance":
        del vars(holder)[site.attr]
    else:
        delattr(holder, site.attr)
