"""The exceptions (patchreg.exceptions): one root, subclasses that carry the patch and target, never AttributeError."""

from __future__ import annotations

import pytest

from patchreg import (
    Patch,
    PatchConflictError,
    PatchDefinitionError,
    PatchError,
    PatchOwnershipError,
    PatchWarning,
    PredicateError,
    TargetNotFoundError,
    UnpatchableTargetError,
)

ERRORS = [
    PatchDefinitionError,
    TargetNotFoundError,
    UnpatchableTargetError,
    PatchConflictError,
    PatchOwnershipError,
    PredicateError,
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_error_is_a_patch_error_and_never_an_attribute_error(error: type[PatchError]) -> None:
    """Each error subclasses PatchError and not AttributeError (hasattr would swallow it)."""
    assert issubclass(error, PatchError) and not issubclass(error, AttributeError)


def test_an_error_carries_its_patch_and_target() -> None:
    """``.patch`` and ``.target`` are what the raiser passed (None when it could not tell)."""
    patch = Patch("p", "os:sep", "/", kind="value")
    exc = PatchConflictError("two replaces", patch=patch, target=patch.target)
    assert exc.patch is patch and exc.target == "os:sep" and str(exc) == "two replaces"
    assert PatchError("bare").patch is None


def test_a_definition_error_is_also_a_value_error() -> None:
    """A bad definition can be caught as ValueError too, as code that validates input expects."""
    with pytest.raises(ValueError):
        Patch("bad name!", "os:sep", "/", kind="value")
    assert issubclass(PatchWarning, UserWarning)
