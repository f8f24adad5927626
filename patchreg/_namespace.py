"""Every raw read and write of an attribute: the value stored along the MRO, a holder's own value,
the object to install (built, bound), the write, and the put-back.

Originals are read from ``vars()`` along the MRO, never through ``getattr`` (which binds
descriptors). ``kind`` is where the attribute lives: ``"module"``, ``"class"`` or ``"instance"``.
"""

from __future__ import annotations

import types
from typing import Any

import wrapt

from patchreg._targets import class_attr

__all__ = [
    "ABSENT",
    "bind_like",
    "build",
    "environ_problem",
    "holder_kind",
    "label",
    "own_value",
    "put_back",
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


def label(holder: Any) -> str:
    """How messages and tables name a holder: a module's name, a class's dotted name, ``Type@0xaddr``."""
    if isinstance(holder, types.ModuleType):
        return holder.__name__
    if isinstance(holder, type):
        return f"{holder.__module__}.{holder.__qualname__}"
    return f"{type(holder).__name__}@{id(holder):#x}"


def own_value(holder: Any, attr: Any, kind: str = "") -> Any:
    """What ``holder``'s own namespace stores for ``attr`` (``ABSENT`` if nothing); ``kind="item"``: the mapping's item."""
    if kind == "item":
        return holder.get(attr, ABSENT)
    return vars(holder).get(attr, ABSENT)


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


def build(
    replacement: Any, how: str, kind: str, holder: Any, attr: Any, original: Any, prepend: str | None = None
) -> Any:
    """The object to install for a patch of kind ``how``: a value or an item as it is (``prepend``: in front of the
    str there, joined by it), a replacement bound or re-wrapped as needed, a FunctionWrapper for a wrap."""
    if how == "delete":
        return ABSENT
    if how == "dict":  # one key of a whole-mapping patch: its value, or absent (a key cleared)
        return replacement.get(attr, ABSENT)  # what the attribute (or key) holds while the patch is applied: nothing
    if how in ("value", "item"):
        if prepend is not None and isinstance(original, str):
            return replacement + prepend + original
        return replacement
    if how == "wrap":
        if kind == "instance":
            return wrapt.FunctionWrapper(getattr(holder, attr), replacement)
        return wrapt.FunctionWrapper(stored_value(holder, attr), replacement)
    value: Any = replacement
    if kind == "instance":
        return bind_like(value, holder, attr, original)
    if kind == "class":
        raw = class_attr(holder, attr, ABSENT)
        if isinstance(value, types.FunctionType) and isinstance(raw, (staticmethod, classmethod)):
            return type(raw)(value)
        set_name = getattr(type(value), "__set_name__", None)
        if set_name is not None:  # as class creation would (cached_property needs it)
            set_name(value, holder, attr)
    return value


def bind_like(value: Any, holder: Any, attr: str, original: Any) -> Any:
    """Bind ``value`` to ``holder`` the way the attribute it shadows is bound (method, static, class)."""
    cls = type(holder)
    if original is not ABSENT:  # something already in vars(instance): bind only if it is our method
        bound = getattr(original, "__self__", None) is holder and callable(original)
        if bound and getattr(original, "__func__", None) is value:  # the same replacement, bound the same way
            return original  # (the same patch through another registry): install that very object again
        return value.__get__(holder, cls) if bound and hasattr(value, "__get__") else value
    raw = class_attr(cls, attr, ABSENT)
    if type(raw) is types.FunctionType:
        return value.__get__(holder, cls) if hasattr(value, "__get__") else value
    if isinstance(raw, staticmethod):
        return value.__get__(holder, cls) if isinstance(value, staticmethod) else value
    if isinstance(raw, classmethod):
        return types.MethodType(value, cls) if isinstance(value, types.FunctionType) else value.__get__(holder, cls)
    if raw is not ABSENT and hasattr(type(raw), "__get__") and callable(raw) and hasattr(value, "__get__"):
        return value.__get__(holder, cls)
    return value


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
