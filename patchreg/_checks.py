"""Where a patch can go and what refuses it: its sites on an object, patchability and mapping checks, skips and
their messages; each refuses before any change, and writes nothing."""

from __future__ import annotations

import functools
import logging
import os
import types
from collections.abc import Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

from patchreg._namespace import ABSENT, environ_problem, label, own_value, same, stored_value
from patchreg._predicates import DISABLED_REASON as DISABLED
from patchreg._targets import ImportPath, Miss, Site, class_attr
from patchreg.exceptions import (
    PatchDefinitionError,
    PatchError,
    TargetNotFoundError,
    UnpatchableTargetError,
)

if TYPE_CHECKING:
    from patchreg._records import Patch

__all__ = [
    "check_mapping",
    "check_patchable",
    "conflict",
    "covered",
    "locate",
    "name_patch",
    "needed",
    "not_ours",
    "report_skips",
    "resolve",
    "stored_another",
    "wrapped_over",
    "warn_not_found",
]

log = logging.getLogger("patchreg")
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE


def check_patchable(patch: Patch, holder: Any, attr: Any) -> None:
    """Refuse, before any change, what cannot be installed and restored exactly."""
    if patch.is_item:
        check_mapping(patch, holder)
        return
    if isinstance(holder, type) and holder.__flags__ & _IMMUTABLE_TYPE:
        msg = (
            f"Cannot patch {holder.__qualname__}.{attr} (target {str(patch.where)!r}): {holder.__qualname__} is an "
            "immutable built-in type; patch the Python code that calls it, or a subclass."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    if not isinstance(holder, (type, types.ModuleType)):
        if not isinstance(getattr(holder, "__dict__", None), dict):
            msg = (
                f"Cannot patch {attr!r} on a {type(holder).__qualname__} instance (target {str(patch.where)!r}): it "
                "has no __dict__ (__slots__); patch the class with an import path instead."
            )
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
        _check_instance_class(patch, type(holder), attr)
    if patch.kind == "wrap":
        _check_wrappable(patch, holder, attr)


def check_mapping(patch: Patch, mapping: Any) -> None:
    """An item patch's target must hold a mutable mapping (a dict, ``os.environ``); whatever reaches ``os.environ``
    (by any import path) must be a valid name and str value there, and a ``prepend=`` joins only onto a str."""
    if not isinstance(mapping, MutableMapping):
        msg = (
            f"Cannot set key {patch.key!r} of {str(patch.where)!r} (patch {patch.name!r}): it holds a "
            f"{type(mapping).__qualname__}, not a mutable mapping; kind='item' patches a dict or os.environ, "
            "point the target at one."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    if mapping is os.environ:
        _check_environ(patch)
    if patch.prepend is not None:
        there = mapping.get(patch.key, ABSENT)
        if there is not ABSENT and not isinstance(there, str):
            msg = (
                f"Cannot prepend to {patch.where!s}[{patch.key!r}] (patch {patch.name!r}): it holds "
                f"{there!r}, not a str, so joining {patch.replacement!r} in front of it with {patch.prepend!r} "
                "would drop it; give a str there, or set the value without prepend=."
            )
            raise UnpatchableTargetError(msg, patch=patch, target=patch.target)


def _check_environ(patch: Patch) -> None:
    """Every key and value a patch writes into ``os.environ`` obeys ``os.putenv``'s rules (which would raise a bare
    ValueError or OSError), whatever import path reached it."""
    if patch.kind == "dict":
        pairs = list(patch.replacement.items())
    else:
        value = "" if patch.kind == "delete" else patch.replacement
        pairs = [(patch.key, value if patch.prepend is None else f"{value}{patch.prepend}")]
    for key, value in pairs:
        problem = environ_problem(key, value)
        if problem is not None:
            msg = f"Patch {patch.name!r} on {str(patch.where)!r}: {problem}; give os.environ a valid name and a str value."
            raise PatchDefinitionError(msg, patch=patch, target=patch.target)


def _check_instance_class(patch: Patch, cls: type, attr: str) -> None:
    if not cls.__weakrefoffset__:
        msg = (
            f"Cannot patch {attr!r} on a {cls.__qualname__} instance (target {str(patch.where)!r}): it does not "
            "support weak references, so patchreg could not let it be freed; add '__weakref__' to its __slots__."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    raw = class_attr(cls, attr, ABSENT)
    if raw is not ABSENT and hasattr(type(raw), "__set__"):
        msg = (
            f"Cannot patch {attr!r} on a {cls.__qualname__} instance (target {str(patch.where)!r}): the class "
            f"defines it as a data descriptor ({type(raw).__name__}), which an instance attribute cannot shadow; "
            f"patch the class with '{cls.__module__}:{cls.__qualname__}.{attr}'."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)


def _check_wrappable(patch: Patch, holder: Any, attr: str) -> None:
    raw = stored_value(holder, attr)
    if isinstance(raw, (property, functools.cached_property)) or (raw is not ABSENT and not _callable_raw(raw)):
        msg = (
            f"Cannot wrap {label(holder)}.{attr} (patch {patch.name!r}): it is a {type(raw).__name__}, not a "
            "function; use kind='replace' with a replacement of the same kind."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)


def _callable_raw(raw: Any) -> bool:
    return callable(raw) or isinstance(raw, (staticmethod, classmethod))


def stored_another(
    patch: Patch, where: str, kind: str, stored: Any, original: Any, back: Any
) -> UnpatchableTargetError:
    """The refusal of an install on ``where`` whose write stored ``stored`` instead of the replacement (a custom
    ``__setattr__`` or ``__setitem__``), put back since (to ``original``; ``back``: what is there now)."""
    how = "a custom __setitem__" if kind == "item" else "a custom __setattr__"
    after = (
        "Nothing was changed"
        if same(kind, back, original)
        else f"It now holds {back!r}, which putting back the original {original!r} stored; check it"
    )
    msg = (
        f"Cannot patch {where} (patch {patch.name!r}): setting it stored {stored!r} instead "
        f"of the replacement ({how}), so patchreg could not tell its install from someone "
        f"else's or restore exactly. {after}; patch the code that uses it instead."
    )
    return UnpatchableTargetError(msg, patch=patch, target=patch.target)


def conflict(patch: Patch, other: Patch, where: str, registry: str) -> str:
    """Why ``patch`` cannot be installed on ``where`` over ``other`` (``registry``: its registry, when another's)."""
    if other.kind != "wrap":
        what = f"also replaces {where}"
    else:
        what = f"wraps {where}, and a replace installed over it would discard that wrapper"
    on = f" (in registry {registry!r})" if registry else ""
    if patch.kind == "replace" and other.kind in ("replace", "wrap"):  # two functions: a wrap stacks
        remedy = "revert one of them first, or make one a kind='wrap' patch (wraps stack)."
    else:  # a value, item, deletion or mapping: one holder at a time, nothing stacks on it
        remedy = (
            f"revert one of them first: a {patch.kind} patch does not stack (only kind='wrap' patches of a function "
            "do), so keep one of the two (leave the other out of its set, or name it in PATCHREG_DISABLE)."
        )
    return f"Patch {patch.name!r} replaces {where}, but patch {other.name!r}{on} {what}; {remedy}"


def covered(name: str, where: str, over: tuple[str, bool] | None) -> str:
    """Why patch ``name``'s install on ``where`` cannot be released: ``over`` (its name, and whether it is another
    registry's) was installed over it."""
    if over is None:  # (not on its stack any more: cannot happen for a live layer)
        return f"Cannot revert patch {name!r} on {where}: it is no longer installed there. Nothing was changed."
    top, foreign = over
    if foreign:
        return (
            f"Cannot revert patch {name!r} on {where}: patch {top!r} was installed over it through another "
            "registry; revert that one first (reverse order of applying). Nothing was changed."
        )
    return (
        f"Cannot revert patch {name!r} on {where} before patch {top!r}, which was installed over it; "
        "revert in reverse order of applying (exit the inner block first). Nothing was changed."
    )


def wrapped_over(name: str, where: str, upper: str, upper_where: str) -> str:
    """Why patch ``name``'s install on ``where`` cannot be released: patch ``upper`` wraps it from ``upper_where``."""
    return (
        f"Cannot revert patch {name!r} on {where}: patch {upper!r} was installed over it on {upper_where}, which "
        "wraps it; revert that one first (reverse order of applying). Nothing was changed."
    )


def not_ours(name: str, where: str, current: Any) -> str:
    """Why patch ``name``'s top install on ``where`` cannot be released: what it holds now (``current``) is neither
    what it installed nor its original."""
    if current is ABSENT:
        return (
            f"Cannot revert patch {name!r} on {where}: the attribute was deleted meanwhile (not by patchreg), so "
            f"putting the original back would undo that deletion. Put it back yourself (patch.backup.get(holder) "
            "is the original) or re-create the attribute, then revert again; nothing was changed."
        )
    return (
        f"Cannot revert patch {name!r} on {where}: the attribute now holds {current!r}, not what patchreg "
        "installed (someone patched over it). Undo that patch first; nothing was changed."
    )


def name_patch(exc: PatchError, patch: Patch) -> None:
    """Fill in which patch an error raised while applying ``patch`` was about, where its raiser could not tell."""
    if exc.patch is None:
        exc.patch = patch
        add_note = getattr(exc, "add_note", None)  # Python 3.11+: shown under the message in a traceback
        if add_note is not None:
            add_note(f"(while applying patch {patch.name!r}, target {str(patch.where)!r})")
    if exc.target is None:
        exc.target = patch.target


def needed(patch: Patch) -> bool:
    """Whether a skip of ``patch`` matters: a target that was not found, or a predicate that is not "not needed"."""
    answer = patch.when.evaluate()  # cached
    return answer.ok or answer.needed


#: The patches whose missing target was logged in this process: ``(name, target)``.
_NOT_FOUND_LOGGED: set[tuple[str, str]] = set()


def warn_not_found(patch: Patch, reason: str) -> None:
    """Log, once per patch and process, that ``patch`` was skipped because its target was not found.

    A predicate saying no, or *not needed here*, is a decision and stays quiet; a missing target is
    usually a typo or an upstream change. ``apply(..., warn=False)`` is for sets that expect it (a
    pipeline stage without the layers a patch targets); ``strict=True`` makes it an error.
    """
    key = (patch.name, str(patch.where))
    if key in _NOT_FOUND_LOGGED:
        return
    _NOT_FOUND_LOGGED.add(key)
    log.warning(
        "patchreg: patch %r skipped, its target %r was not found: %s. Check the target (or pass warn=False where "
        "its absence is expected; strict=True makes it an error). Logged once per patch and process.",
        patch.name,
        str(patch.where),
        reason,
    )


def report_skips(name: str, skipped: list[tuple[str, str]], strict: bool, patches: Iterable[Patch]) -> None:
    """Warn about (``strict``: refuse) the skips that matter: not those a predicate marks *not needed* here, nor
    those ``PATCHREG_DISABLE`` names (the operator's decision)."""
    by_name = {p.name: p for p in patches}
    skipped = [(n, r) for n, r in skipped if r != DISABLED and (n not in by_name or needed(by_name[n]))]
    if not skipped:
        return
    if not strict:  # strict raises instead: one of the two is enough
        for patch_name, reason in skipped:
            log.warning("patchreg: %s.%s skipped: %s", name, patch_name, reason)
        return
    lines = "; ".join(f"{n}: {r}" for n, r in skipped)
    msg = f"Patch set {name!r} applied with strict=True, but {len(skipped)} patch(es) would be skipped: {lines}."
    first = by_name.get(skipped[0][0])  # the error is about the first of them (the message names all)
    raise TargetNotFoundError(msg, patch=first, target=None if first is None else first.target)


def locate(patch: Patch, obj: Any) -> list[Site] | Miss:
    """Where ``patch`` installs on ``obj``: its target's sites (absent ones too with ``create``); for an item patch,
    ``(mapping, key)`` for each mapping the target names. A deletion's sites must each hold what it deletes in their
    own namespace (or mapping), or be held deleted by this patch already (a second user shares it): else there is
    nothing to delete, a skip."""
    if not patch.is_item:
        if patch.kind != "delete":
            return patch.where.resolve(obj, create=patch.create)
        found = patch.where.resolve(obj, create=True)
        if isinstance(found, Miss):
            return found
        for holder, attr in found:
            if own_value(holder, attr) is ABSENT and not _held(patch, holder, attr):
                return Miss(_nothing_there(patch, holder, attr))
        return found
    found = patch.where.resolve(obj)
    if isinstance(found, Miss):
        return found
    sites: list[Site] = []
    for holder, attr in found:
        mapping = getattr(holder, attr)
        check_mapping(patch, mapping)
        if patch.kind == "dict":  # every key it sets, then (clear=True) every other key there now or cleared by it
            keys = list(patch.replacement)
            if patch.clear:
                keys += [k for k in list(mapping) if k not in patch.replacement]
                keys += [
                    la.stack.attr
                    for la in patch.backup.layers()
                    if la.stack.ref() is mapping and la.stack.attr not in keys
                ]
            sites.extend(Site(mapping, key) for key in keys)
            continue
        if not patch.create and patch.key not in mapping and not _held(patch, mapping, patch.key):
            if patch.kind == "delete":
                return Miss(f"{patch.where}[{patch.key!r}] is not set: nothing to delete")
            return Miss(
                f"{patch.where}[{patch.key!r}] is not set; pass create=True to set it for the patch "
                "(deleted again on revert)"
            )
        sites.append(Site(mapping, patch.key))
    return sites


def _held(patch: Patch, holder: Any, attr: Any) -> bool:
    """Whether ``patch`` has a live install on ``holder``'s ``attr`` (a deletion a second user may share)."""
    return any(la.stack.ref() is holder and la.stack.attr == attr for la in patch.backup.layers())


def _nothing_there(patch: Patch, holder: Any, attr: str) -> str:
    """Why a deletion has nothing to delete on ``holder``: the attribute is absent, or not its own."""
    try:
        getattr(holder, attr)
    except Exception:  # AttributeError: absent; anything else: not there to delete either
        where = patch.where if isinstance(patch.where, ImportPath) else f"{label(holder)}.{attr}"
        return f"{where} does not exist: nothing to delete"
    return (
        f"{label(holder)}.{attr} is not in its own namespace (inherited, served by __getattr__, or an instance "
        "without a __dict__): nothing to delete there; point the patch at the class or module that holds it"
    )


def resolve(patch: Patch, obj: Any) -> list[Site] | str:
    """The sites of ``patch`` on ``obj``, checked patchable; a string says why there are none."""
    found = locate(patch, obj)
    if isinstance(found, Miss):
        return found.reason
    for holder, attr in found:
        check_patchable(patch, holder, attr)
    return found
