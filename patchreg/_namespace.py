"""Every raw read and write of an attribute: the value stored along the MRO, a holder's own value,
the object to install (built, bound), the write, and the put-back.

Originals are read from ``vars()`` along the MRO, never through ``getattr`` (which binds
descriptors). ``kind`` is where the attribute lives: ``"module"``, ``"class"`` or ``"instance"``.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Mapping
from typing import Any

import wrapt

from patchreg._targets import class_attr

__all__ = [
    "ABSENT",
    "binding",
    "build",
    "checked_writes",
    "environ_problem",
    "holder_kind",
    "label",
    "own_value",
    "put_back",
    "reorder",
    "same",
    "stored_value",
    "write",
]


class _Absent:
    """Marks an attribute that was not in the namespace before a patch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


def environ_problem(key: Any, value: Any) -> str | None:
    """Why ``os.environ[key] = value`` cannot be set (None when it can): both must be str, the name non-empty and
    without ``=``, neither with a NUL (``os.putenv``'s rules, which would raise a bare TypeError or ValueError)."""
    if not isinstance(key, str) or not isinstance(value, str):
        return f"an environment variable's name and value must be str, got {key!r} = {value!r}"
    if not key or "=" in key or "\0" in key:
        return f"{key!r} is not an environment variable name (it must be non-empty, with no '=' and no NUL)"
    if "\0" in value:
        return f"the value {value!r} of environment variable {key!r} holds a NUL"
    return None


def holder_kind(holder: Any) -> str:
    """``"module"``, ``"class"`` or ``"instance"``: which namespace an install on ``holder`` writes."""
    if isinstance(holder, types.ModuleType):
        return "module"
    return "class" if isinstance(holder, type) else "instance"


def checked_writes(kind: str, holder: Any) -> bool:
    """Whether a write to ``holder``'s ``kind`` namespace must be read back: one through a mapping's ``__setitem__``,
    a module class's or a metaclass's ``__setattr__`` may store another object (an instance's own dict is written
    directly, a plain module's and a plain class's through ``setattr`` as they are)."""
    if kind == "instance":
        return False
    if kind == "module":
        return type(holder) is not types.ModuleType
    if kind == "class":
        return type(holder).__setattr__ is not type.__setattr__  # type: ignore[comparison-overlap]
    return True


def label(holder: Any) -> str:
    """How messages and tables name a holder: a module's name, a class's dotted name, ``Type@0xaddr``."""
    if isinstance(holder, types.ModuleType):
        return holder.__name__
    if isinstance(holder, type):
        return f"{holder.__module__}.{holder.__qualname__}"
    return f"{type(holder).__name__}@{id(holder):#x}"


def own_value(holder: Any, attr: Any) -> Any:
    """What ``holder``'s own namespace stores for ``attr`` (``ABSENT`` if nothing, or if it has no namespace of its
    own: ``__slots__``)."""
    ns = getattr(holder, "__dict__", None)
    return ns.get(attr, ABSENT) if isinstance(ns, Mapping) else ABSENT


def same(kind: str, a: Any, b: Any) -> bool:
    """Whether ``a`` is ``b``; for mapping items, also an equal str, bytes or number (``os.environ`` hands out
    a new str on every read)."""
    return a is b or (kind == "item" and type(a) is type(b) and type(a) in _PLAIN and a == b)


_PLAIN = (str, bytes, int, float, bool)


def stored_value(holder: Any, attr: str) -> Any:
    """The attribute as stored: from ``vars`` along the MRO for classes, ``vars`` otherwise."""
    if isinstance(holder, type):
        return class_attr(holder, attr, ABSENT)
    if isinstance(holder, types.ModuleType):
        return vars(holder).get(attr, ABSENT)
    value = vars(holder).get(attr, ABSENT)
    return value if value is not ABSENT else class_attr(type(holder), attr, ABSENT)


def binding(
    how: str, replacement: Any, kind: str, holder: Any, attr: Any, original: Any, prepend: str | None = None
) -> tuple[Any, Callable[[Any], Any] | None]:
    """How a patch of kind ``how`` makes what it installs over ``original``: the one rule of binding.

    ``(value, None)``: install ``value`` as it is (a value or an item, ``prepend``-ed in front of the str there; a
    replacement adapted to the class attribute it shadows; a FunctionWrapper of a module's or class's function);
    ``(None, make)``: ``make(holder)`` builds it at each install (a function bound to an instance, a wrap of what the
    instance gets), so that nothing kept for later installs holds the instance. A plan keeps the answer for later
    installs over the same original; ``ABSENT`` as the value deletes (a delete patch, a key a dict patch clears).
    """
    if how == "delete":
        return ABSENT, None
    if how == "dict":  # one key of a whole-mapping patch: its value, or absent (a key cleared)
        return replacement.get(attr, ABSENT), None
    if how in ("value", "item"):
        if prepend is not None and original is not ABSENT:  # (a value that is not a str was refused before)
            return replacement + prepend + original, None
        return replacement, None
    if how == "wrap":
        if kind == "instance":
            return None, functools.partial(_wrap_own, attr, replacement)
        return wrapt.FunctionWrapper(stored_value(holder, attr), replacement), None
    if kind == "instance":
        return _bind_like(replacement, holder, attr, original)
    value: Any = replacement
    if kind == "class":
        raw = class_attr(holder, attr, ABSENT)
        if isinstance(value, types.FunctionType) and isinstance(raw, (staticmethod, classmethod)):
            return type(raw)(value), None
        set_name = getattr(type(value), "__set_name__", None)
        if set_name is not None:  # as class creation would (cached_property needs it)
            set_name(value, holder, attr)
    return value, None


def build(
    how: str, replacement: Any, kind: str, holder: Any, attr: Any, original: Any, prepend: str | None = None
) -> Any:
    """What a patch of kind ``how`` installs on ``holder`` over ``original`` now (:func:`binding`, made)."""
    value, make = binding(how, replacement, kind, holder, attr, original, prepend)
    return value if make is None else make(holder)


def _wrap_own(attr: str, wrapper: Any, holder: Any) -> Any:
    """A wrap of what ``holder.attr`` gives (its class's function bound to it, or its own)."""
    return wrapt.FunctionWrapper(getattr(holder, attr), wrapper)


def _read_own(attr: str, holder: Any) -> Any:
    """What ``holder``'s own namespace stores for ``attr``: the very object installed again."""
    return vars(holder)[attr]


def _get(value: Any, holder: Any) -> Any:
    return value.__get__(holder, type(holder))


def _bind_like(value: Any, holder: Any, attr: str, original: Any) -> tuple[Any, Callable[[Any], Any] | None]:
    """:func:`binding` on an instance: ``value`` bound to it the way the attribute it shadows is bound (method,
    static, class)."""
    cls = type(holder)
    binds = hasattr(value, "__get__")
    make: Callable[[Any], Any] = value.__get__ if type(value) is types.FunctionType else functools.partial(_get, value)
    if original is not ABSENT:  # something already in vars(instance): bind only if it is our method
        bound = getattr(original, "__self__", None) is holder and callable(original)
        if bound and getattr(original, "__func__", None) is value:  # the same replacement, bound the same way
            return None, functools.partial(_read_own, attr)  # (the same patch through another registry): it again
        return (None, make) if bound and binds else (value, None)
    raw = class_attr(cls, attr, ABSENT)
    if type(raw) is types.FunctionType:
        return (None, make) if binds else (value, None)
    if isinstance(raw, staticmethod):
        return (value.__get__(holder, cls) if isinstance(value, staticmethod) else value), None
    if isinstance(raw, classmethod):
        return (
            types.MethodType(value, cls) if isinstance(value, types.FunctionType) else value.__get__(holder, cls)
        ), None
    if raw is not ABSENT and hasattr(type(raw), "__get__") and callable(raw) and binds:
        return None, make
    return value, None


def write(kind: str, holder: Any, attr: Any, value: Any) -> None:
    """Store ``value``: into ``vars(instance)`` directly, through ``setattr`` on classes and modules, as an item;
    ``ABSENT``: delete it (a delete patch)."""
    if value is ABSENT:
        put_back(kind, holder, attr, ABSENT)
    elif kind == "item":
        holder[attr] = value
    elif kind == "instance":
        vars(holder)[attr] = value
    else:
        setattr(holder, attr, value)


def put_back(kind: str, holder: Any, attr: Any, original: Any, *, raw: bool = False) -> None:
    """Write ``original`` back (``ABSENT``: remove the attribute, or the item, if it is there).

    ``raw``: past any ``__setattr__``/``__delattr__`` of a metaclass or module class, or a dict subclass's
    ``__setitem__`` (to undo a write one changed).
    """
    if kind == "item":
        if raw and isinstance(holder, dict):  # past a dict subclass's own __setitem__ / pop
            if original is ABSENT:
                dict.pop(holder, attr, None)
            else:
                dict.__setitem__(holder, attr, original)
        elif original is ABSENT:
            holder.pop(attr, None)
        else:
            holder[attr] = original
    elif kind == "instance" or (raw and kind == "module"):
        if original is ABSENT:
            vars(holder).pop(attr, None)
        else:
            vars(holder)[attr] = original
    elif original is not ABSENT:
        (type.__setattr__ if raw else setattr)(holder, attr, original)
    elif attr in vars(holder):
        (type.__delattr__ if raw else delattr)(holder, attr)


def reorder(mapping: Any, order: list[Any]) -> None:
    """Put ``mapping``'s keys back in ``order`` (keys added since go after them, in their order); values untouched.

    What a whole-mapping patch's restore needs after putting its keys back one by one (an ``OrderedDict`` compares
    by order). ``os.environ`` stays as it is: moving a variable would unset and set it again.
    """
    if mapping is os.environ:
        return
    keys = list(mapping)
    known = set(order)
    want = [k for k in order if k in mapping] + [k for k in keys if k not in known]
    if keys == want:
        return
    move = getattr(mapping, "move_to_end", None)
    for key in want:
        if callable(move):
            move(key)
        elif isinstance(mapping, dict):  # past a dict subclass's own __setitem__ / pop: the same objects, moved
            dict.__setitem__(mapping, key, dict.pop(mapping, key))
        else:
            mapping[key] = mapping.pop(key)
