"""The default registry and the module-level functions that use it."""

from __future__ import annotations

from typing import Any

from patchreg._registry import Patched, Registry, Target
from patchreg._stacks import Report

__all__ = ["apply", "patched", "registry", "revert"]

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
