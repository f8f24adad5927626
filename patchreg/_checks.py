"""Patchability, compatibility and release checks, and their messages: each refuses before any change."""

from __future__ import annotations

import functools
import logging
import os
import types
from collections.abc import Iterable, MutableMapping
from typing import TYPE_CHECKING, Any

from patchreg._disable import REASON as DISABLED
from patchreg._namespace import ABSENT, environ_problem, label, same, stored_value
from patchreg._targets import class_attr
from patchreg.exceptions import (
    PatchConflictError,
    PatchDefinitionError,
    PatchError,
    PatchOwnershipError,
    TargetNotFoundError,
    UnpatchableTargetError,
)

if TYPE_CHECKING:
    from patchreg._records import Patch
    from patchreg._stacks import Layer, Report, Stack

__all__ = [
    "check_compatible",
    "check_mapping",
    "check_patchable",
    "check_release",
    "name_patch",
    "needed",
    "report_skips",
    "to_release",
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
    """An item patch's target must hold a mutable mapping (a dict, ``os.environ``)."""
    if not isinstance(mapping, MutableMapping):
        msg = (
            f"Cannot set key {patch.key!r} of {str(patch.where)!r} (patch {patch.name!r}): it holds a "
            f"{type(mapping).__qualname__}, not a mutable mapping; kind='item' patches a dict or os.environ, "
            "point the target at one."
        )
        raise UnpatchableTargetError(msg, patch=patch, target=patch.target)
    if mapping is os.environ and patch.kind != "dict":  # (a dict patch's keys and values are checked at definition)
        problem = environ_problem(patch.key, "" if patch.kind == "delete" else patch.replacement)
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


def check_compatible(patch: Patch, stack: Stack, other: Patch | None = None, where: str = "") -> None:
    """Two replaces on one attribute conflict; a replace over wraps would discard them.

    ``other`` is the patch on top (default: this registry's top layer on ``stack``); ``where`` names its registry.
    """
    if patch.kind == "wrap":
        return
    if other is None:
        if not stack.layers:
            return
        other = stack.layers[-1].patch
    if other.kind != "wrap":
        what = f"also replaces {stack.where}"
    else:
        what = f"wraps {stack.where}, and a replace installed over it would discard that wrapper"
    if patch.kind == "replace" and other.kind in ("replace", "wrap"):  # two functions: a wrap stacks
        remedy = "revert one of them first, or make one a kind='wrap' patch (wraps stack)."
    else:  # a value, item, deletion or mapping: one holder at a time, nothing stacks on it
        remedy = (
            f"revert one of them first: a {patch.kind} patch does not stack (only kind='wrap' patches of a function "
            "do), so keep one of the two (leave the other out of its set, or name it in PATCHREG_DISABLE)."
        )
    msg = f"Patch {patch.name!r} replaces {stack.where}, but patch {other.name!r}{where} {what}; {remedy}"
    raise PatchConflictError(msg, patch=patch, target=patch.target)


def stored_another(patch: Patch, stack: Stack, stored: Any, original: Any) -> UnpatchableTargetError:
    """The refusal of an install whose write stored ``stored`` instead of the replacement (a custom ``__setattr__``
    or ``__setitem__``), put back since (``original``)."""
    kind = stack.kind
    how = "a custom __setitem__" if kind == "item" else "a custom __setattr__"
    back = stack.current()
    after = (
        "Nothing was changed"
        if same(kind, back, original)
        else f"It now holds {back!r}, which putting back the original {original!r} stored; check it"
    )
    msg = (
        f"Cannot patch {stack.where} (patch {patch.name!r}): setting it stored {stored!r} instead "
        f"of the replacement ({how}), so patchreg could not tell its install from someone "
        f"else's or restore exactly. {after}; patch the code that uses it instead."
    )
    return UnpatchableTargetError(msg, patch=patch, target=patch.target)


def name_patch(exc: PatchError, patch: Patch) -> None:
    """Fill in which patch an error raised while applying ``patch`` was about, where its raiser could not tell."""
    if exc.patch is None:
        exc.patch = patch
        add_note = getattr(exc, "add_note", None)  # Python 3.11+: shown under the message in a traceback
        if add_note is not None:
            add_note(f"(while applying patch {patch.name!r}, target {str(patch.where)!r})")
    if exc.target is None:
        exc.target = patch.target


def to_release(ledger: Report) -> list[Layer]:
    """The live layers ``ledger`` still holds a user of, in release order (last taken first)."""
    taken = ledger.layers
    return [la for la in reversed(taken[: len(taken) - ledger.unwound]) if la.count > 0 and la.stack.ref() is not None]


def check_release(layers: list[Layer]) -> None:
    """Verify every uninstall in ``layers`` can happen, in order, before any of them does."""
    counts: dict[Layer, int] = {}
    tops: dict[Stack, list[Layer]] = {}
    for layer in layers:
        have = counts.get(layer, layer.count)
        if have <= 0:  # its users were released already (e.g. by revert(patch)): _release skips it too
            continue
        left = counts[layer] = have - 1
        if left > 0:
            continue
        stack = layer.stack
        dependents = stack.dependents
        if dependents is not None and layer in dependents:
            live = [u for u in dependents[layer] if u.count > 0 and u.stack.ref() is not None]
            for upper in live:
                if counts.get(upper, upper.count) > 0:  # not released earlier in this same batch
                    how = (
                        "through another registry"
                        if upper.stack.ref() is stack.ref()
                        else f"on {upper.stack.label}, which wraps it"
                    )
                    msg = (
                        f"Cannot revert patch {layer.patch.name!r} on {stack.where}: patch "
                        f"{upper.patch.name!r} was installed over it {how}; revert that one first (reverse order "
                        "of applying). Nothing was changed."
                    )
                    raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        order = tops.get(stack)
        if order is None:
            order = tops[stack] = stack.layers[:]
            current = stack.current()
            if order[-1] is layer and not layer.releasable(current):
                raise PatchOwnershipError(_not_ours(layer, current), patch=layer.patch, target=layer.patch.target)
        if order[-1] is not layer:
            msg = (
                f"Cannot revert patch {layer.patch.name!r} on {stack.where} before patch "
                f"{order[-1].patch.name!r}, which was installed over it; revert in reverse order of applying "
                "(exit the inner block first). Nothing was changed."
            )
            raise PatchOwnershipError(msg, patch=layer.patch, target=layer.patch.target)
        order.pop()


def _not_ours(layer: Layer, current: Any) -> str:
    """Why the top layer cannot be released: what the attribute holds now is neither its install nor its original."""
    stack, name = layer.stack, layer.patch.name
    where = f"{stack.where}"
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
