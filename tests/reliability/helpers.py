"""Helpers for the reliability suite: namespace snapshots and small replacements."""

from __future__ import annotations

from typing import Any

#: The session's figures (cycles run, inputs tried, objects freed), by name.
FIGURES: dict[str, int] = {}


class Figures:
    """Adds named counts to the session's figures (``figures.add("threads.stress_cycles", 80_000)``)."""

    def add(self, key: str, value: int) -> None:
        """Add ``value`` to the figure ``key``."""
        FIGURES[key] = FIGURES.get(key, 0) + int(value)


class Namespaces:
    """Snapshots of several namespaces (``vars(obj)``) taken at construction."""

    def __init__(self, objects: list[Any]) -> None:
        self.before = [(obj, dict(vars(obj))) for obj in objects]

    def check(self) -> None:
        """Assert every namespace holds the same keys bound to the same objects as at the snapshot."""
        for obj, snap in self.before:
            assert_same_namespace(snap, obj)


def assert_same_namespace(before: dict[str, Any], obj: Any) -> None:
    """Assert ``vars(obj)`` has exactly the keys of ``before``, bound to the same objects (``is``)."""
    after = vars(obj)
    assert set(after) == set(before), f"keys differ on {obj!r}: +{set(after) - set(before)} -{set(before) - set(after)}"
    for key, value in before.items():
        assert after[key] is value, f"{obj!r}.{key} is bound to a different object"


def plain(result: Any) -> Any:
    """A replacement returning ``result`` for any call signature."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        return result

    return replacement


def tagging(tag: str) -> Any:
    """A wrap-patch body that tags the wrapped result."""

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return (tag, wrapped(*args, **kwargs))

    return wrapper


def raising(exc: BaseException) -> Any:
    """A replacement that raises ``exc`` when called."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return replacement
