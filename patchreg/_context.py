"""Blocks: ``with registry.patched(...)``, ``@registry.patched(...)`` and :func:`decorate`.

A :class:`Patched` block can be entered again while it is active (nested, or from several threads):
each thread exits its own enters, innermost first. Misuse never raises a bare Python error and never
leaves an install without an owner:

- a second exit of a block with nothing open (mock's ``_patch`` allows it too) is a no-op;
- an exit of a block never entered is a :class:`PatchError`;
- an exit on a thread that has nothing open on the block while another thread does is a
  :class:`PatchError`, and the install stays with the thread that entered (its exit, or
  ``registry.revert(report)`` from anywhere, releases it). A block made for one call of a decorated
  generator or coroutine is the exception: it has one enter, which its exit releases on whichever
  thread resumed it last.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from patchreg._records import Report, patches_of
from patchreg._store import LOCK, Ledger
from patchreg.exceptions import PatchDefinitionError, PatchError

if TYPE_CHECKING:
    from patchreg._registry import Registry, Target

__all__ = ["Patched", "decorate"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_thread = threading.get_ident
_acquire, _release = LOCK.acquire, LOCK.release  # bound once: a block pays for no method lookup


class Patched(Generic[T]):
    """``with registry.patched(set, obj) as report:`` or ``@registry.patched(set)``.

    A patch set's own block (``mtp_patched``) subclasses it and overrides :meth:`open` (what an enter
    applies and what the ``with`` statement binds), :meth:`close` (after the exit reverted) and
    :meth:`fresh` (the block each call of a decorated function enters).
    """

    #: no __dict__: a block is made per step. The first enter not exited yet is held in three fields (no list and
    #: no tuple per enter: a block entered once per step pays for neither); enters made while it is open, in order
    #: after it, in ``_more``.
    __slots__ = ("_by", "_more", "_one_call", "_report", "_value", "obj", "registry", "strict", "target")

    def __init__(self, registry: Registry, target: Target, obj: Any = None, strict: bool = False) -> None:
        self.registry = registry
        self.target = target
        self.obj = obj
        self.strict = strict
        #: the thread of the first open enter; 0 once entered with that enter exited, None before any enter (then an
        #: exit is a misuse, after it a no-op). Its report and value in _report and _value
        self._by: int | None = None
        self._report: Report | None = None
        self._value: T | None = None
        #: the later enters not exited yet, as (thread, report, value) in order (each thread exits its own last one);
        #: None until an enter finds the first one open
        self._more: list[tuple[int, Report, T]] | None = None
        self._one_call = False  # made by a decorated function for one call: its one enter may exit elsewhere

    def open(self) -> tuple[Report, T]:
        """Apply for one enter: ``(the report the exit reverts, what the with statement binds)``."""
        report = self.registry.apply(self.target, self.obj, strict=self.strict)
        return report, cast(T, report)

    def close(self, value: T) -> None:
        """Called after an exit reverted what :meth:`open` applied; ``value`` is what the enter returned."""

    def fresh(self) -> Patched[T]:
        """A new block like this one: what each call of a function decorated with this block enters."""
        return cast(Patched[T], Patched(self.registry, self.target, self.obj, self.strict))

    @property
    def open_count(self) -> int:
        """How many enters of this block are not exited yet, on every thread."""
        return (1 if self._by else 0) + len(self._more or ())

    def __enter__(self) -> T:
        report, value = self.open()
        me = _thread()
        _acquire()  # two threads' enters must not both take the first place (warm here: the apply just took it)
        try:
            if not self._by and not self._more:  # the first place is free, and no later enter is open
                self._report = report
                self._value = value
                self._by = me
            else:
                if self._more is None:
                    self._more = []
                self._more.append((me, report, value))
        finally:
            _release()
        return value

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        me = _thread()
        if self._by == me and not self._more:  # the common case: this thread's one enter
            report, value, entry = self._report, self._value, None
        else:
            found = self._innermost(me)
            if found is None:
                return  # a second exit: nothing is open, nothing to do (as mock's)
            report, value, entry = found
        registry = self.registry
        if type(report) is Ledger and report.owner is registry:  # registry.revert(report), inline: this block's own
            _acquire()
            try:
                registry._installs.release(report)  # if this raises, the enter stays open: the exit can be retried
            finally:
                _release()
        else:
            registry.revert(cast(Report, report))  # a subclass's open() returned another registry's report: refused
        if entry is None:  # the first place is free again (its thread last: an enter takes it only once it reads 0)
            self._report = self._value = None
            self._by = 0
        else:
            self._more.remove(entry)  # type: ignore[union-attr]  # one C call (atomic), by identity: this very tuple
        self.close(cast(T, value))

    def _innermost(self, me: int) -> tuple[Report | None, T | None, tuple[int, Report, T] | None] | None:
        """The enter an exit on thread ``me`` ends: its innermost one as (report, value, its entry in ``_more`` or
        None for the first place), or (misuse) a refusal; None: nothing open."""
        more = self._more or []
        for entry in reversed(more):
            if entry[0] == me:
                return entry[1], entry[2], entry
        if self._by == me:
            return self._report, self._value, None
        if not self._by and not more:  # nothing open anywhere
            if self._by is None:
                return self._misused(me)
            return None
        return self._misused(me)

    def _misused(self, thread: int) -> tuple[Report | None, T | None, tuple[int, Report, T] | None]:
        """An exit on ``thread``, which has nothing open here: whose enter it exits (a decorated generator's one
        enter, finished on another thread), or a refusal."""
        if self._by is None:
            msg = (
                f"{self!r} was exited without being entered; use it as 'with {self!r}:' (or as a decorator), "
                "which enters it first. Nothing was changed."
            )
            raise PatchError(msg, target=self._name())
        more = self._more or []
        if self._one_call and self.open_count == 1:  # a decorated generator or coroutine finished on another thread
            return (self._report, self._value, None) if self._by else (more[0][1], more[0][2], more[0])
        threads = ([self._by] if self._by else []) + [k for k, _r, _v in more]
        msg = (
            f"{self!r} was exited on thread {thread}, which did not enter it; it is open on thread(s) "
            f"{sorted(set(threads))}. Exit a block on the thread that entered it, or revert the "
            "report its enter returned with registry.revert(report), which works from any thread. Nothing was "
            "changed."
        )
        raise PatchError(msg, target=self._name())

    def _name(self) -> str:
        return patches_of(self.target)[0]

    def __call__(self, func: F) -> F:
        return decorate(func, self._for_one_call)

    def _for_one_call(self) -> Patched[T]:
        block = self.fresh()
        block._one_call = True
        return block

    def __repr__(self) -> str:
        return f"<patched {self._name()!r} via {self.registry.name!r}>"


def decorate(func: F, block: Callable[[], AbstractContextManager[Any]]) -> F:
    """``func`` run inside a fresh ``block()`` per call (what ``@registry.patched(...)`` and ``@mtp_patched`` do).

    A coroutine function stays one and keeps the block across its awaits; a generator function (sync
    or async) keeps it from its first step to its end, across its yields. Anything else: for the call.
    """
    if not callable(func):
        msg = f"decorate() takes the function to run inside the block, got {func!r}; pass a function or method."
        raise PatchDefinitionError(msg, target=repr(func))
    if isinstance(block, Patched) or not callable(block):
        msg = (
            f"decorate() takes a factory that makes a fresh block for each call, got {block!r}; pass "
            "'lambda: registry.patched(...)', or decorate with the block itself ('@registry.patched(...)')."
        )
        raise PatchDefinitionError(msg, target=repr(block))
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
