"""Guards: the trace of a selector's walk on an object, and the check that a later walk would find the same.

A :class:`~patchreg._plans.Plan` keeps the guards of the resolution it remembers and checks them at
every apply (the hot path, with :meth:`patchreg._store.Store.take_planned`): while they hold, resolving
again would find the same holders. They hold only weak references.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

from patchreg._targets import NOT_INSTANCES, UNSET, Selector, Site, by_values, class_attr

__all__ = ["Guards", "guard_check", "trace"]

#: ``(reads, walks)``: reads are ``(holder ref or None for the previous read's value, holder type, name,
#: mapping name or None, value ref)``; walks are
#: ``(container ref, container type, how it is walked (_ITER, _VALUES, _MODULES), element refs)``.
Guards = tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]]


def trace(selector: Selector, obj: Any) -> tuple[list[Site], Guards] | None:
    """The sites on ``obj`` and the guards that tell cheaply whether a later resolution finds them again.

    None when the walk passes through something guards cannot follow (an unwrap, a class
    attribute or property, a plain list, an object without weak references): the caller
    then resolves every time. Guards hold only weak references.
    """
    chunks = obj if isinstance(obj, (list, tuple)) else (obj,)
    reads: list[tuple[Any, ...]] = []
    walks: list[tuple[Any, ...]] = []
    sites: list[Site] = []
    for chunk in chunks:
        holders = [chunk]
        for step in selector.steps[:-1]:
            nxt: list[Any] = []
            for holder in holders:
                value = _traced_get(holder, step.name, reads)
                if value is UNSET:
                    return None
                items = [value]
                for index in step.indices:
                    selected = _traced_select(items, index, walks)
                    if selected is None:
                        return None
                    items = selected
                nxt.extend(items)
            holders = nxt
        attr = selector.steps[-1].name
        for holder in holders:  # the attribute must come from the class (its type is checked at apply)
            if isinstance(holder, NOT_INSTANCES) or class_attr(type(holder), attr, UNSET) is UNSET:
                return None
        sites.extend(Site(holder, attr) for holder in holders)
    return sites, (tuple(reads), tuple(walks))


def guard_check(guards: Guards, obj: Any = None) -> Callable[[Any], bool]:
    """A function of the object applied on that is True while every read and walk of a trace would find the
    same objects again.

    It closes over the guards' weak references only. Each read's holder must still be of the class
    it had (a ``__class__ =`` can bring a property or another ``__getattr__``). A walk whose container
    is the value of the last read takes it from there rather than through its own reference. When the
    first read is on ``obj`` itself (not a chunk of it), the check takes it from its argument: the
    apply checked it is the plan's object.
    """
    reads, walks = guards
    if not reads and not walks:
        return _always
    last = reads[-1][4]() if reads else None
    walks = tuple(
        (None if last is not None and cref() is last else cref, cls, how, snapshot)
        for cref, cls, how, snapshot in walks
    )
    chain = _module_chain(reads, walks, obj is not None and reads[0][0] is not None and reads[0][0]() is obj)
    if chain is not None:
        return chain
    is_ = operator.is_

    def check(_obj: Any) -> bool:
        value: Any = None
        for href, cls, name, mapping, vref in reads:
            if href is not None:  # else a chain (model.mtp.layers): the holder is the value just read
                value = href()
            if type(value) is not cls:  # also a dead holder (None)
                return False
            ns = value.__dict__
            if mapping is None:
                value = ns.get(name)
            elif name in ns:
                return False
            else:
                inner = ns.get(mapping)
                value = inner.get(name) if isinstance(inner, dict) else None
            if value is None or value is not vref():
                return False
        for cref, cls, how, snapshot in walks:
            container = value if cref is None else cref()
            if type(container) is not cls:  # also a dead container (None)
                return False
            try:  # iter(): no __len__ call (list() would take it as a hint)
                if how == _MODULES:
                    elements = list(container.__dict__["_modules"].values())
                else:
                    elements = list(container.values()) if how else list(iter(container))
            except Exception:  # a container's own code: any failure means resolve again
                return False
            if len(elements) != len(snapshot) or not all(map(is_, elements, [r() for r in snapshot])):
                return False
        return True

    return check


def _always(_obj: Any) -> bool:
    return True


def _module_chain(
    reads: tuple[tuple[Any, ...], ...], walks: tuple[tuple[Any, ...], ...], on_obj: bool
) -> Callable[[Any], bool] | None:
    """:func:`guard_check`'s check for its common shape, whatever the length of the chain or of the walk; None for
    any other shape.

    The shape: a chain of reads each served from a dict in the holder's ``__dict__`` (``nn.Module._modules``),
    then one walk of the last value's ``_modules`` (``model.mtp.layers[*]``). What a resolution finds along
    it depends only on each value's class (checked: it decides how the next name is served, and a ``None``
    or a dead reference fails it), the names not shadowed in the instance dicts, and the elements at the
    end (compared), so the values on the way are not compared. A lookup that fails (a key gone, a dict
    replaced) means resolve again. ``on_obj``: the chain starts at the object applied on (the check's argument).
    """
    if len(walks) != 1 or not reads or reads[0][0] is None:
        return None
    cref, walked, how, snapshot = walks[0]
    if cref is not None or how != _MODULES or not snapshot:
        return None
    if any(href is not None or mapping is None for href, _c, _n, mapping, _v in reads[1:]) or reads[0][3] is None:
        return None
    first, top = reads[0][0], reads[0][1]
    classes = [cls for _h, cls, _n, _m, _v in reads[1:]] + [walked]
    steps = tuple((name, mapping, cls) for (_h, _c, name, mapping, _v), cls in zip(reads, classes, strict=True))
    n = len(snapshot)
    last = reads[-1][4]()
    modules = vars(last).get("_modules") if last is not None else None
    if type(modules) is not dict or len(modules) != n:
        return None
    #: each element under the key it had: a dict lookup per element, no walk of ``.values()`` and no list built
    #: (a dict whose keys were re-inserted in another order holds the same elements under the same keys)
    keyed = tuple(zip(modules, snapshot, strict=True))
    if not all(modules[key] is ref() for key, ref in keyed):
        return None

    def chain(obj: Any) -> bool:
        try:
            value = obj if on_obj else first()
            if type(value) is not top:
                return False
            for name, mapping, cls in steps:
                ns = value.__dict__
                if name in ns:
                    return False
                value = ns[mapping][name]
                if type(value) is not cls:
                    return False
            found = value.__dict__["_modules"]
            if len(found) != n:
                return False
            for key, ref in keyed:
                element = found.get(key)
                if element is None or element is not ref():
                    return False
            return True
        except Exception:  # a key gone, a dict replaced (a container's own code): resolve again
            return False

    return chain


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _traced_get(holder: Any, name: str, reads: list[tuple[Any, ...]]) -> Any:
    """``getattr(holder, name)`` where a guard can re-check it: from the instance ``__dict__``, or from
    one of the dicts in it (``nn.Module._modules``) when the class's ``__getattr__`` serves it."""
    cls = type(holder)
    ns = getattr(holder, "__dict__", None)
    if type(ns) is not dict or cls.__getattribute__ is not object.__getattribute__:  # type: ignore[comparison-overlap]
        return UNSET
    raw = class_attr(cls, name, UNSET)
    if raw is not UNSET and (name not in ns or hasattr(type(raw), "__set__")):
        return UNSET  # served by the class (a property, a descriptor): not followed
    mapping = None
    if name in ns:
        value = ns[name]
    else:
        value = getattr(holder, name, UNSET)
        if value is UNSET:
            return UNSET
        for key, inner in list(ns.items()):  # a copy: another thread may install into this __dict__ meanwhile
            if isinstance(inner, dict) and inner.get(name, UNSET) is value:
                mapping = key
                break
        else:
            return UNSET
    href, vref = _weak(holder), _weak(value)
    if href is None or vref is None:
        return UNSET
    if reads and reads[-1][4]() is holder:  # a chain (model.mtp.layers): the holder is the value just read
        href = None
    reads.append((href, cls, name, mapping, vref))
    return value


_ITER, _VALUES, _MODULES = 0, 1, 2  # how a guard walks a container: iter(), .values(), its _modules dict's values
#: torch's containers whose iteration (or .values()) is exactly their ``_modules`` dict's values
_MODULE_CONTAINERS = {
    ("ModuleList.__iter__", False),
    ("Sequential.__iter__", False),
    ("ModuleDict.values", True),
}


def _walks_modules(value: Any, by_values: bool, elements: list[Any]) -> bool:
    """Whether ``value`` is a torch container whose walk is its ``_modules`` dict's values (a guard reads that
    dict, a C-level walk, instead of calling the container's Python ``__iter__``)."""
    fn = getattr(type(value), "values" if by_values else "__iter__", None)
    if (getattr(fn, "__qualname__", None), by_values) not in _MODULE_CONTAINERS:
        return False
    if getattr(fn, "__module__", None) != "torch.nn.modules.container":
        return False
    modules = vars(value).get("_modules")
    return type(modules) is dict and all(map(operator.is_, modules.values(), elements))


def _traced_select(items: list[Any], index: str, walks: list[tuple[Any, ...]]) -> list[Any] | None:
    """:func:`_select` over weakly referenceable containers and elements, recording each walk.

    Each container is iterated once: the elements selected are the ones its guard recorded.
    """
    selected: list[Any] = []
    for value in items:
        if isinstance(value, (list, tuple, str, bytes)):
            return None
        mapping = by_values(value)
        try:
            elements = list(value.values() if mapping else value)
        except Exception:
            return None
        cref, snapshot = _weak(value), tuple(_weak(e) for e in elements)
        if cref is None or None in snapshot:
            return None
        how = _MODULES if _walks_modules(value, mapping, elements) else _VALUES if mapping else _ITER
        walks.append((cref, type(value), how, snapshot))
        if index == "*":
            selected.extend(elements)
            continue
        i = int(index)
        if not -len(elements) <= i < len(elements):
            return None
        selected.append(elements[i])
    return selected or None
