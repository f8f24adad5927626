"""Blocks: ``with registry.patched(...)``, ``@registry.patched(...)`` and :func:`decorate`.

A :class:`Patched` block can be entered again while it is active (nested, or from several threads):
each thread exits its own enters, innermost first. Misuse never raises a bare Python error and never
leaves an install without an owner:

- a second exit of a block with nothing open is a no-op (a choice: mock's ``patch`` raises ``AttributeError`` there on
  Python 3.11-3.13, its ``patch.dict`` does nothing);
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
from typing import Any, Generic, Protocol, TypeVar, cast

from patchreg._clean import release, take_clean
from patchreg._plans import Plan
from patchreg._records import Target, patches_of
from patchreg._stacks import Report
from patchreg._store import LOCK, Store
from patchreg._targets import identity
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = ["Patched", "decorate"]

F = TypeVar("F", bound=Callable[..., Any])


class Registry(Protocol):
    """What a block needs of its registry (a :class:`patchreg.Registry`; this module sits below it)."""

    name: str
    _installs: Store
    _plans: dict[tuple[int, ...], Plan]
    _last: Plan | None

    def apply(self, target: Target, obj: Any = None, *, strict: bool = False) -> Report: ...

    def revert(self, target: Target | Report, obj: Any = None) -> int: ...

    def _applied(self, ledger: Report, obj: Any) -> None: ...


T = TypeVar("T")
_thread = threading.get_ident
_acquire, _release = LOCK.acquire, LOCK.release  # bound once: a block pays for no method lookup


class Patched(Generic[T]):
    """``with registry.patched(set, obj) as report:`` or ``@registry.patched(set)``.

    A patch set's own block (``mtp_patched``) subclasses it and overrides :meth:`value` (what the ``with``
    statement binds, from the apply's report), :meth:`open` (an enter's apply the general way), :meth:`close`
    (after the exit reverted) and :meth:`fresh` (the block each call of a decorated function enters).

    An enter whose apply of ``target`` on ``obj`` has a plan of clean installs (what a block entered once
    per training step meets from its third enter) makes them itself (:func:`patchreg._clean.take_clean`);
    any other calls :meth:`open`. An override of :meth:`open` must therefore apply ``target`` with
    ``strict``, on ``obj`` or on what ``obj`` wraps (a plan is only found for the object an apply was made on).
    """

    __slots__ = ("_entered", "_one_call", "_open", "obj", "registry", "strict", "target")  # no __dict__: per step

    def __init__(self, registry: Registry, target: Target, obj: Any = None, strict: bool = False) -> None:
        self.registry = registry
        self.target = target
        self.obj = obj
        self.strict = strict
        #: the enters not exited yet, in order, as (thread, report, value): each thread exits its own last one.
        #: Made here, not at the first enter, where two threads' first enters would each make one
        self._open: list[tuple[int, Report, T]] = []
        self._entered = False  # once entered, an exit with nothing open is a no-op (before, a misuse)
        self._one_call = False  # made by a decorated function for one call: its one enter may exit elsewhere

    def open(self) -> Report:
        """Apply for one enter, the general way: the report the exit reverts."""
        return self.registry.apply(self.target, self.obj, strict=self.strict)

    def value(self, report: Report) -> T:
        """What the ``with`` statement binds for an enter whose apply returned ``report`` (default: the report)."""
        return cast(T, report)

    def close(self, value: T) -> None:
        """Called after an exit reverted what its enter applied; ``value`` is what the enter returned."""

    def fresh(self) -> Patched[T]:
        """A new block like this one: what each call of a function decorated with this block enters."""
        return cast(Patched[T], Patched(self.registry, self.target, self.obj, self.strict))

    @property
    def open_count(self) -> int:
        """How many enters of this block are not exited yet, on every thread."""
        return len(self._open)

    def __enter__(self) -> T:
        registry, obj, target = self.registry, self.obj, self.target
        plan = registry._last  # an RL loop enters the same block on the same model: checked first
        if plan is None or plan.target() is not target or plan.obj() is not obj:
            plan = registry._plans.get((identity(target), identity(obj)))  # this block's plan, if another came between
            if plan is not None and (plan.target() is not target or plan.obj() is not obj):
                plan = None
        report: Report | None = None
        if plan is not None and plan.bound is not None and not (self.strict and plan.skipped) and plan.holds(obj):
            report = take_clean(registry, registry._installs, plan)
        if report is not None:
            registry._last = plan
            installs = registry._installs
            if installs.checkpoints or installs.unnamed:  # (Registry.apply does this for the general way)
                registry._applied(report, obj)  # (which reverts the apply if it raises)
        else:
            report = self.open()
            if not isinstance(report, Report):  # a subclass written for the hooks before value() (0.1.0)
                _refuse_open(self, report)
        try:
            value = self.value(report)
        except BaseException:
            report.owner.revert(report)  # never an install without an owner
            raise
        self._entered = True
        self._open.append((_thread(), report, value))  # list.append: atomic, whichever thread enters
        return value

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        entered = self._open
        entry = entered[-1] if entered else None
        if entry is None or entry[0] != _thread():  # not the common case: this thread's last enter is the last one
            entry = self._innermost(entered)
            if entry is None:
                return  # a second exit: nothing is open, nothing to do (documented; mock.patch would raise)
        report, registry = entry[1], self.registry
        if type(report) is Report and report.owner is registry:  # registry.revert(report), inline: this block's own
            _acquire()
            try:
                release(registry._installs, report)  # if this raises, the entry stays: the exit can be retried
            finally:
                _release()
        else:
            registry.revert(report)  # a subclass's open() returned another registry's report: refused there
        entered.remove(entry)  # one C call (atomic), by identity: this very tuple
        self.close(entry[2])

    def _innermost(self, entered: list[tuple[int, Report, T]]) -> tuple[int, Report, T] | None:
        """The enter an exit on this thread ends: its innermost one, or (misuse) a refusal; None: nothing open."""
        key = _thread()
        if entered:
            for entry in reversed(entered):
                if entry[0] == key:
                    return entry
            return self._misused(key, entered)
        if self._entered:
            return None
        return self._misused(key, [])

    def _misused(self, thread: int, entered: list[tuple[int, Report, T]]) -> tuple[int, Report, T]:
        """An exit on ``thread``, which has nothing open here while ``entered`` is open elsewhere: whose enter
        it exits (a decorated generator's one enter, finished on another thread), or a refusal."""
        if not self._entered:
            msg = (
                f"{self!r} was exited without being entered; use it as 'with {self!r}:' (or as a decorator), "
                "which enters it first. Nothing was changed."
            )
            raise PatchError(msg, target=self._name())
        if self._one_call and len(entered) == 1:
            return entered[0]  # a decorated generator or coroutine finished on another thread than it began
        msg = (
            f"{self!r} was exited on thread {thread}, which did not enter it; it is open on thread(s) "
            f"{sorted({k for k, _r, _v in entered})}. Exit a block on the thread that entered it, or revert the "
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


def _refuse_open(block: Patched[Any], opened: Any) -> None:
    """An ``open()`` that returned something other than a Report: its apply reverted, and a PatchDefinitionError."""
    if isinstance(opened, tuple) and opened and isinstance(opened[0], Report):
        opened[0].owner.revert(opened[0])
    msg = (
        f"{type(block).__qualname__}.open() returned {type(opened).__name__}, not the Report of its apply; since "
        "patchreg 0.2, open() returns the report and value(report) says what the with statement binds. Nothing "
        "was left installed."
    )
    raise PatchDefinitionError(msg, target=block._name())


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
