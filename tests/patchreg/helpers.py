"""Helpers for the engine's tests: namespace snapshots and small replacements."""

from __future__ import annotations

from typing import Any


def snapshot(obj: Any) -> dict[str, Any]:
    """A copy of ``vars(obj)``: same keys bound to the same objects."""
    return dict(vars(obj))


def assert_same_namespace(before: dict[str, Any], obj: Any) -> None:
    """Assert ``vars(obj)`` has exactly the keys of ``before``, bound to the same objects (``is``)."""
    after = vars(obj)
    assert set(after) == set(before), f"keys differ: +{set(after) - set(before)} -{set(before) - set(after)}"
    for key, value in before.items():
        assert after[key] is value, f"{key!r} is bound to a different object"


def plain(result: Any) -> Any:
    """A replacement that returns a marker, for any call signature."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        return result

    return replacement


def tagging_wrapper(tag: str) -> Any:
    """A wrap patch body that tags the wrapped result."""

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        return (tag, wrapped(*args, **kwargs))

    return wrapper
