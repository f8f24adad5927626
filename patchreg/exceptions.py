"""The one exception root of patchreg, its subclasses, and the warning category."""

from __future__ import annotations

from typing import Any

__all__ = [
    "PatchConflictError",
    "PatchDefinitionError",
    "PatchError",
    "PatchOwnershipError",
    "PatchWarning",
    "PredicateError",
    "TargetNotFoundError",
    "UnpatchableTargetError",
]


class PatchError(Exception):
    """Root of every error patchreg raises; ``.patch`` and ``.target`` name what it was about."""

    def __init__(self, msg: str, *, patch: Any = None, target: Any = None) -> None:
        super().__init__(msg)
        self.patch = patch
        self.target = target


class PatchDefinitionError(PatchError, ValueError):
    """A Patch, PatchSet, selector or predicate was declared with an invalid field."""


class TargetNotFoundError(PatchError, LookupError):
    """A target could not be found (raised for skips when ``strict=True``)."""


class UnpatchableTargetError(PatchError, TypeError):
    """The target exists but cannot be patched and restored exactly (slots, immutable types, ...)."""


class PatchConflictError(PatchError):
    """Two patches want the same attribute in ways that cannot be combined."""


class PatchOwnershipError(PatchError):
    """The attribute no longer holds what patchreg installed; nothing was changed."""


class PredicateError(PatchError):
    """A predicate raised while it was evaluated; nothing was installed."""


class PatchWarning(UserWarning):
    """Warnings emitted by patchreg and by patch sets built on it."""
