"""Layers: one patch installed on one attribute, and how it holds what it installed and displaced.

A layer is the store's record of an install (:mod:`patchreg._store` makes, counts and releases them; reports,
``explain`` and the checks read them). On an instance it holds neither what it installed nor the original
strongly where that would keep the instance alive: a weak reference, or an identity.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from patchreg._namespace import ABSENT, same
from patchreg._records import Patch
from patchreg._targets import identity

if TYPE_CHECKING:
    from patchreg._store import InstallStack

__all__ = ["GONE", "Layer", "Ref", "WeakOriginal", "weak_or_id"]

Ref = weakref.ReferenceType


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
    stack: InstallStack
    count: int  # users (0 once released)
    since: int  # time.time_ns() at install (an int: the float of time.time() is dearer in cold caches)
    seq: int  # the store's SEQUENCE at install: the install order across registries (a patch's backup stacks by it)
    original: Any  # what patch.backup shows (read it through displaced()); dropped once restored
    installed: Any  # what was installed: on an instance, its weak reference (weak_or_id)

    @classmethod
    def make(cls, patch: Patch, stack: InstallStack, installed: Any, since: int, seq: int, original: Any) -> Layer:
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
        kept = WeakOriginal()
        try:
            kept.ref = Ref(original)
        except TypeError:
            return original
        return kept


GONE = object()  # a weakly held original that died (what kept it alive was removed by someone else)


def weak_or_id(installed: Any) -> Any:
    """How an instance layer holds what it installed: a weak reference, or else its identity."""
    try:
        return Ref(installed)
    except TypeError:
        return identity(installed)
