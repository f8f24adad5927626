"""The Registry, its blocks (``with registry.patched(...)``, :class:`Patched`) and :func:`decorate`.

``apply`` finds the plan of its target on its object (or resolves one, outside the lock: selectors and predicates
are user code), then has the state's one install loop take a user of each of its steps; ``revert`` (or the end of a
``patched`` block) has the one release loop release one, and the last user's release puts back exactly what was
there. Where each concept lives: state in :mod:`patchreg._state` (its records in :mod:`patchreg._ledger`), raw reads
and writes in :mod:`patchreg._namespace`, sites and refusals in :mod:`patchreg._checks`, plans and their guard in
:mod:`patchreg._plans`, introspection in :mod:`patchreg._explain`; lazy patches (a post-import hook) and the default
registry here.

A :class:`Patched` block can be entered again while it is active (nested, or from several threads): each thread
exits its own enters, innermost first. Misuse never raises a bare Python error and never leaves an install without
an owner:

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
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar, cast

import wrapt

from patchreg import _explain
from patchreg._checks import locate, report_skips
from patchreg._explain import Explanation
from patchreg._ledger import Checkpoint, Pending, Report
from patchreg._plans import make_plan, work
from patchreg._records import Installed, Patch, Target, patches_of
from patchreg._state import Book, consistent, release, take
from patchreg._targets import Miss, Site
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = [
    "TEST_PREFIX",
    "Checkpoint",
    "Explanation",
    "Patched",
    "Registry",
    "Target",
    "apply",
    "decorate",
    "patched",
    "registry",
    "revert",
]

log = logging.getLogger("patchreg")

F = TypeVar("F", bound=Callable[..., Any])
#: The prefix of the methods a decorated class has decorated (``unittest.mock.patch.TEST_PREFIX``'s).
TEST_PREFIX = "test"
T = TypeVar("T")
_thread = threading.get_ident


class Registry:
    """Applies and reverts patches; reference-counted, exact, thread-safe.

    ``apply`` installs what is not yet installed and counts a user for what is;
    ``revert`` (or the end of a ``patched`` block) releases one user, and the last
    user's release puts back exactly what was there.
    """

    __slots__ = ("__weakref__", "_book", "name")

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self._book = Book(self)  # its own state: plans, checkpoints, lazy patches

    # -- applying -------------------------------------------------------------------------

    def apply(
        self, target: Target, obj: Any = None, *, strict: bool = False, warn: bool | None = None, lazy: bool = False
    ) -> Report:
        """Install every patch of ``target`` whose predicate holds; return a :class:`Report`.

        A patch whose target is not found is skipped with the reason, and (``warn=None``, the default)
        logged as a warning once per patch and process; ``warn=True`` logs every skip that matters at
        every apply, ``warn=False`` none, ``strict=True`` raises instead. A predicate saying no (or *not
        needed here*) is a decision, not a surprise: it is only in the report.

        With ``lazy=True``, an import-path patch whose module is not imported yet is installed
        by a post-import hook when it is (its predicate evaluated then); reverting first cancels it.

        The resolution of a Patch or PatchSet on an object is kept (a plan) and re-used while cheap guards show
        that resolving again would find the same holders; every apply runs the same install loop over its steps.
        """
        if strict and warn is None:  # strict raises on a skip that matters: no warning about it as well
            warn = False
        book = self._book
        plan = None if lazy else book.plan_for(target, obj)
        for _attempt in range(_ATTEMPTS):
            if plan is not None and plan.holds(obj):
                steps, skipped = work(book, plan, obj, warn)
            else:  # resolve (outside the lock: selectors and predicates are user code)
                plan, steps, skipped = make_plan(book, target, obj, warn, lazy)
            if skipped and (strict or warn):
                report_skips(plan.name, list(skipped), strict, plan.patches)
            report = Report(self, plan.name, skipped)
            taken = take(book, steps, report, plan.waiting)
            if taken:
                break
            plan = None  # a holder changed between the resolution and the loop: resolve again
        else:
            msg = (
                f"Patch set {patches_of(target)[0]!r}: its targets changed while it was being applied, "
                f"{_ATTEMPTS} times in a row (another thread replacing them?); nothing was installed. Apply it again."
            )
            raise PatchError(msg)
        if plan.waiting:
            _register_hooks(book, report)
        if book.checkpoints or book.unnamed:
            self._applied(report, obj)
        return report

    def _applied(self, ledger: Report, obj: Any) -> None:
        """After an apply: note it in the live checkpoints, and name the instance stacks it made by path (a walk of
        ``obj``: user code). If that raises (an interrupt), the apply is reverted: its report never reaches the
        caller, so nothing of it may stay installed without an owner."""
        book = self._book
        try:
            if book.checkpoints:
                book.record(ledger)
            if book.unnamed:
                _explain.name_stacks(book, obj)
        except BaseException:
            self.revert(ledger)
            raise

    # -- reverting ------------------------------------------------------------------------

    def revert(self, target: Target | Report, obj: Any = None) -> int:
        """Release one user of each patch of ``target`` on ``obj``; return how many originals came back.

        Given a :class:`Report`, releases exactly what that apply took (once).
        """
        if isinstance(target, Report):
            if target.owner is not self:
                msg = f"Report {target!r} came from registry {target.owner.name!r}; revert it there."
                raise PatchDefinitionError(msg, target=target.name)
            return release(target)
        name, patches = patches_of(target)
        found = [_hits(patch, obj) for patch in patches]  # user code (selectors): outside the lock
        return self._book.release_of(Report(self, name, ()), patches, found)

    def revert_all(self) -> int:
        """Restore every original this registry displaced (top layers first); return how many.

        All or nothing: when one install cannot be released (someone patched over it), nothing is.
        """
        return self._book.release_everything()

    def checkpoint(self) -> Checkpoint:
        """Remember this moment, for :meth:`rollback`: every apply from now on is recorded while it lives."""
        return self._book.checkpoint()

    def rollback(self, checkpoint: Checkpoint) -> int:
        """Release every apply made since ``checkpoint`` that is not released yet, last first; return restores.

        All or nothing. Those applies' reports end released (a block exited later releases nothing
        again), and lazy patches of earlier applies that were installed since stay.
        """
        book = self._book
        if not isinstance(checkpoint, Checkpoint):
            msg = (
                f"rollback() takes what checkpoint() returned, got {checkpoint!r}; take one with registry.checkpoint()."
            )
            raise PatchDefinitionError(msg, target=checkpoint)
        if checkpoint.owner is not self:
            msg = f"Checkpoint came from registry {checkpoint.owner.name!r}; roll back there."
            raise PatchDefinitionError(msg)
        return book.rollback(checkpoint)

    def patched(self, target: Target, obj: Any = None, *, strict: bool = False) -> Patched[Report]:
        """A context manager (and decorator) that applies on entry and reverts on exit."""
        patches_of(target)  # fail at the call site on a bad target
        return Patched(self, target, obj, strict)

    # -- introspection --------------------------------------------------------------------

    def active(self) -> tuple[Installed, ...]:
        """Copies of every active install, in install order per attribute."""
        return _explain.active(self._book)

    def is_active(self, name: str | Patch, obj: Any = None) -> bool:
        """True when a patch named ``name`` (or that very Patch) is installed (on ``obj``, or what ``obj`` contains)."""
        if not isinstance(name, (str, Patch)):
            msg = f"is_active() takes a patch name or a Patch, got {name!r}; pass e.g. 'postprocess'."
            raise PatchDefinitionError(msg, target=name)
        wanted = (lambda p: p is name) if isinstance(name, Patch) else (lambda p: p.name == name)
        patches = {la.patch for la in self._book.live_layers() if wanted(la.patch)}
        for patch in patches:
            if obj is None or patch.is_global:
                return True
            found = _hits(patch, obj)
            if self._book.layers_of(patch, found):
                return True
            if any(la.stack.ref() is obj for la in self._book.layers_of(patch, None)):  # obj is the holder itself
                return True
        return False

    def explain(self, target: Target, obj: Any = None) -> Explanation:
        """What ``apply(target, obj)`` would do now, without doing it."""
        name, patches = patches_of(target)
        return _explain.explain(self._book, name, patches, obj)

    def summary(self) -> str:
        """A table of active installs: patch, target, holder, count, state, since."""
        return _explain.summary(self._book)

    def fingerprint(self) -> str:
        """A stable digest of :meth:`fingerprint_lines`: equal in two processes with the same patches active."""
        return _explain.fingerprint(self._book)

    def fingerprint_lines(self) -> list[str]:
        """What the fingerprint digests, sorted: installs (no ids or times), predicate answers, versions."""
        return _explain.fingerprint_lines(self._book)

    def __repr__(self) -> str:
        book = self._book
        layers, pending = consistent(lambda: (book.live_layers(), len(book.pending)))
        n = len({id(la.stack) for la in layers})
        waiting = f", {pending} pending (lazy)" if pending else ""
        return f"<patchreg.Registry {self.name!r}: {len(layers)} active install(s) on {n} attribute(s){waiting}>"


_ATTEMPTS = 3  # resolutions an apply tries while its targets change under it


# -- lazy patches: installed by a post-import hook when their module is imported --------------------------


def _register_hooks(book: Book, ledger: Report) -> None:
    """Register the post-import hooks of ``ledger``'s lazy patches (outside the lock: one may fire at once)."""
    for pending in ledger.waiting:
        wrapt.register_post_import_hook(functools.partial(_install_on_import, book, pending), pending.module)


def _install_on_import(book: Book, pending: Pending, module: Any) -> None:
    """Post-import hook of a lazy patch: install it now (resolved now) unless it was cancelled; never breaks the
    user's import statement."""
    if pending.state != "pending":
        return
    try:
        _plan, steps, skipped = make_plan(book, pending.patch, None, lazy=True, name=pending.ledger.set_name)
        if not book.take_on_import(pending, steps, skipped):
            return
    except Exception as exc:  # never break the user's import statement
        book.failed_on_import(pending, exc)
        log.error("patchreg: lazy patch %s on import of %s failed: %s", pending.patch.name, pending.module, exc)
        return
    if skipped:
        log.warning(
            "patchreg: lazy patch %s skipped on import of %s: %s", pending.patch.name, pending.module, skipped[0][1]
        )


def _hits(patch: Patch, obj: Any) -> list[Site] | None:
    """The selector's holders on ``obj`` (None: every holder of the patch)."""
    if patch.is_global or obj is None:
        return None
    found = locate(patch, obj)
    return [] if isinstance(found, Miss) else found


class Patched(Generic[T]):
    """``with registry.patched(set, obj) as report:`` or ``@registry.patched(set)``.

    A patch set's own block (``mtp_patched``) subclasses it and overrides :meth:`value` (what the ``with``
    statement binds, from the apply's report), :meth:`open` (an enter's apply), :meth:`close` (after the exit
    reverted) and :meth:`fresh` (the block each call of a decorated function enters). Every enter is an apply
    (:meth:`Registry.apply`, which re-uses the plan of the same target on the same object); every exit a revert of
    the report it returned.
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
        """Apply for one enter: the report the exit reverts."""
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
        self.registry.revert(entry[1])  # if this raises, the entry stays: the exit can be retried
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

    A class stays a class, as with ``mock.patch``: each of its own methods whose name starts with
    :data:`TEST_PREFIX` (``"test"``, as ``unittest.mock.patch.TEST_PREFIX``) is decorated; nothing else changes
    (``setUp`` and helpers run unpatched).
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
    if isinstance(func, type):
        for name, member in list(vars(func).items()):
            if name.startswith(TEST_PREFIX) and inspect.isfunction(member):
                setattr(func, name, decorate(member, block))
        return func
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


# -- the default registry and the module-level functions that use it -----------------------------------

#: The process-wide default registry.
registry = Registry("default")


def apply(
    target: Target, obj: Any = None, *, strict: bool = False, warn: bool | None = None, lazy: bool = False
) -> Report:
    """``registry.apply`` on the default registry."""
    return registry.apply(target, obj, strict=strict, warn=warn, lazy=lazy)


def revert(target: Target | Report, obj: Any = None) -> int:
    """``registry.revert`` on the default registry."""
    return registry.revert(target, obj)


def patched(target: Target, obj: Any = None, *, strict: bool = False) -> Patched[Report]:
    """``registry.patched`` on the default registry."""
    return registry.patched(target, obj, strict=strict)
