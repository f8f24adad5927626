"""Helpers for the reliability suite: figures, namespace snapshots; the small replacements come from tests.patchreg."""

from __future__ import annotations

from typing import Any

from tests.patchreg.helpers import assert_same_namespace, plain
from tests.patchreg.helpers import tagging_wrapper as tagging

__all__ = ["FIGURES", "Figures", "Namespaces", "assert_same_namespace", "plain", "raising", "tagging"]

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


def raising(exc: BaseException) -> Any:
    """A replacement that raises ``exc`` when called."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return replacement
