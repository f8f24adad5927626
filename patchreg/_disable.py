"""Patches turned off from the environment: ``PATCHREG_DISABLE``, read once per process.

The variable names patches (``set.patch``, as ``python -m patchreg show`` spells them, or a bare
``patch``) and whole sets, comma-separated. A patch it names is never installed in the process: every
resolution (an apply, a block's first enter, a lazy patch at its import, the bootstrap) skips it
with the reason :data:`REASON`, and ``explain`` and ``doctor`` say so. A plan remembers that skip as
it remembers a predicate's, so a block's planned enter pays nothing for it.

The variable is read when patchreg is imported and again after :func:`patchreg.refresh` (which also drops
every plan): nothing reads it per apply. A patch declared :func:`essential` to its sets (``mtp_patched``
cannot do without its ``_postprocess``) is not skipped: an apply that would install it refuses instead,
naming the variable, rather than silently running upstream's code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from patchreg._predicates import DISABLED_REASON, ENV_DISABLE, Answer, disabled_names
from patchreg._records import Patch
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = ["ENV_DISABLE", "REASON", "essential", "is_disabled", "is_essential", "names", "off", "read"]

#: The skip reason of a disabled patch, in reports, ``explain`` and ``doctor``.
REASON = DISABLED_REASON
SKIP = Answer(False, REASON, needed=False)  # an operator's decision, not something missing here

_ESSENTIAL: dict[int, Patch] = {}  # by identity: the patches a set cannot run without
_NONE: frozenset[int] = frozenset()


def read(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The names in ``PATCHREG_DISABLE`` (of ``environ``, default ``os.environ``), stripped, empty ones dropped."""
    return disabled_names(os.environ if environ is None else environ)


def names() -> frozenset[str]:
    """The names this process read from ``PATCHREG_DISABLE`` (when patchreg was imported, or at the last
    ``refresh()``, which also makes the plans that remember its skips stale)."""
    return disabled_names()


def is_disabled(set_name: str, patch: Patch) -> bool:
    """Whether ``PATCHREG_DISABLE`` names ``patch`` of the set ``set_name``: ``set.patch``, ``patch`` or ``set``."""
    disabled = names()
    return bool(disabled) and (patch.name in disabled or set_name in disabled or f"{set_name}.{patch.name}" in disabled)


def off(set_name: str, patches: Iterable[Patch]) -> frozenset[int]:
    """The identities of the patches of ``patches`` that ``PATCHREG_DISABLE`` names (at once empty when it names
    nothing).

    Raises :class:`PatchError` naming the variable when one of them is :func:`essential`: the apply
    refuses rather than install the rest without it.
    """
    if not names():
        return _NONE
    found = [p for p in patches if is_disabled(set_name, p)]
    for patch in found:
        if id(patch) in _ESSENTIAL:
            msg = (
                f"Patch {set_name}.{patch.name} is disabled by {ENV_DISABLE}={os.environ.get(ENV_DISABLE, '')!r}, "
                f"and {set_name!r} cannot run without it (its code would silently run upstream's instead); "
                f"nothing was installed. Remove {patch.name!r} / {set_name!r} from {ENV_DISABLE}, or do not "
                "apply this set (leave its block out) in this process."
            )
            raise PatchError(msg, patch=patch.name, target=str(patch.where))
    return frozenset(map(id, found))


def is_essential(patch: Patch) -> bool:
    """Whether ``patch`` was declared :func:`essential`."""
    return id(patch) in _ESSENTIAL


def essential(*patches: Patch) -> None:
    """Declare ``patches`` essential to every set holding them: an apply (or block) of a set whose essential patch
    ``PATCHREG_DISABLE`` names refuses with a :class:`PatchError` naming the variable, instead of installing the
    other patches without it."""
    for patch in patches:
        if not isinstance(patch, Patch):
            msg = f"essential() takes Patch records, got {patch!r}; pass the Patch objects of the set."
            raise PatchDefinitionError(msg, target=patch)
        _ESSENTIAL[id(patch)] = patch
