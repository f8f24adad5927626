"""Blocks: ``with registry.patched(...)``, ``@registry.patched(...)`` and :func:`decorate`."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from patchreg._records import Report, patches_of

if TYPE_CHECKING:
    from patchreg._registry import Registry, Target

__all__ = ["Patched", "decorate"]

F = TypeVar("F", bound=Callable[..., Any])


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
        name = patches_of(self.target)[0]
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
