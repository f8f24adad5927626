"""Patches turned off from the environment: ``PATCHREG_DISABLE``, read once per process.

The variable names patches (``set.patch``, as ``python -m patchreg show`` spells them, or a bare
``patch``) and whole sets, comma-separated. A patch it names is never installed in the process: every
resolution (an apply, a block's first enter, a lazy patch at its import, the bootstrap) skips it
with the reason :data:`REASON`, and ``explain`` and ``doctor`` say so. A plan remembers that skip as
it remembers a predicate's, so a block's planned enter pays nothing for it.

The variable is read when patchreg is imported and again by :func:`patchreg.refresh` (which also drops
every plan): nothing reads it per apply. A patch declared :func:`essential` to its sets (``mtp_patched``
cannot do without its ``_postprocess``) is not skipped: an apply that would install it refuses instead,
naming the variable, rather than silently running upstream's code.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Mapping, Sequence

from patchreg._predicates import DISABLED_REASON, ENV_DISABLE, REFRESHES, Answer, disabled_names
from patchreg._records import Patch
from patchreg.exceptions import PatchDefinitionError, PatchError

__all__ = [
    "ENV_DISABLE",
    "REASON",
    "essential",
    "is_disabled",
    "is_essential",
    "names",
    "near",
    "off",
    "unmatched",
    "unmatched_text",
]

log = logging.getLogger("patchreg")

#: The skip reason of a disabled patch, in reports, ``explain`` and ``doctor``.
REASON = DISABLED_REASON
SKIP = Answer(False, REASON, needed=False)  # an operator's decision, not something missing here

_ESSENTIAL: dict[int, Patch] = {}  # by identity: the patches a set cannot run without
_NONE: frozenset[int] = frozenset()
_checked: set[str] = set()  # the sets whose names in the variable were checked, since it was last read
_checked_in = [REFRESHES[0]]  # the refresh generation of _checked (a refresh() reads the variable again)


def names() -> frozenset[str]:
    """The names this process read from ``PATCHREG_DISABLE`` (at import, or at the last ``refresh()``)."""
    return disabled_names()


def is_disabled(set_name: str, patch: Patch) -> bool:
    """Whether ``PATCHREG_DISABLE`` names ``patch`` of the set ``set_name``: ``set.patch``, ``patch`` or ``set``."""
    disabled = disabled_names()
    return bool(disabled) and (patch.name in disabled or set_name in disabled or f"{set_name}.{patch.name}" in disabled)


def off(set_name: str, patches: Iterable[Patch]) -> frozenset[int]:
    """The identities of the patches of ``patches`` that ``PATCHREG_DISABLE`` names (at once empty when it names
    nothing).

    Raises :class:`PatchError` naming the variable when one of them is :func:`essential`: the apply
    refuses rather than install the rest without it.
    """
    if not disabled_names():
        return _NONE
    patches = tuple(patches)
    if _checked_in[0] != REFRESHES[0]:  # read again since: check every set again
        _checked.clear()
        _checked_in[0] = REFRESHES[0]
    if set_name not in _checked:  # the set's first resolution since the variable was read
        _checked.add(set_name)
        _warn_unmatched(set_name, patches)
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


def unmatched(set_name: str, patch_names: Collection[str], disabled: Iterable[str] | None = None) -> dict[str, str]:
    """The names of ``PATCHREG_DISABLE`` (or ``disabled``) meant for set ``set_name`` that match none of its patches
    (``patch_names``), each with the name it may mean ("" when none is close).

    A name is meant for the set when it is ``set_name.<something>``, or ``<near set_name>.<one of its patches>``
    (a typo in the set's part); names of other sets and bare names are left alone: they are checked where every
    set is known (bootstrap, ``doctor --env``), so no other set has to be loaded here.
    """
    prefix = f"{set_name}."
    spelled = [f"{prefix}{p}" for p in patch_names]
    found: dict[str, str] = {}
    for name in disabled_names() if disabled is None else disabled:
        if name == set_name or name in patch_names or (name.startswith(prefix) and name[len(prefix) :] in patch_names):
            continue
        if name.startswith(prefix):
            found[name] = _closest(name, spelled)
            continue
        for patch in patch_names:
            head = name[: -len(patch) - 1]
            if name.endswith(f".{patch}") and abs(len(head) - len(set_name)) <= 2 and _closest(head, [set_name], 0.85):
                found[name] = f"{prefix}{patch}"
    return found


def unmatched_text(found: Mapping[str, str], what: str = "no known patch set or patch") -> str:
    """One warning for the names ``found`` maps to what they may mean: short, whatever the number of known names."""
    names = ", ".join(f"{n!r} (did you mean {m!r}?)" if m else repr(n) for n, m in found.items())
    return (
        f"{ENV_DISABLE} names {names}, which match(es) {what}: it turns nothing off. "
        "`python -m patchreg doctor --env` shows what the variable turns off."
    )


def near(unknown: Iterable[str], known: Sequence[str]) -> dict[str, str]:
    """Each of the ``unknown`` names with the known name it may mean ("" when none is close)."""
    return {name: _closest(name, known) for name in unknown}


def _closest(name: str, known: Sequence[str], cutoff: float = 0.75) -> str:
    import difflib  # (here: only a name that matches nothing needs it, and import patchreg stays as light)

    matches = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return matches[0] if matches else ""


def _warn_unmatched(set_name: str, patches: Sequence[Patch]) -> None:
    """Log the names meant for ``set_name`` that match none of its patches (at its first resolution)."""
    found = unmatched(set_name, [p.name for p in patches])
    if found:
        log.warning("patchreg: %s", unmatched_text(found, f"no patch of set {set_name!r} (applied here)"))
