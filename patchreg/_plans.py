"""Plans: what resolving a Patch or PatchSet on an object finds, as a flat list of steps the install loop runs.

Resolution (outside the lock: selectors, predicates and ``__getattr__`` are user code) evaluates each patch's
predicate, walks its target to the sites it names, refuses what cannot be installed and restored exactly, and makes a
:class:`~patchreg._ledger.Step` per site: its stack, what the binding rule makes there, and what it must find there.
A registry keeps the plan, and an apply of the same target on the same object re-uses it while one guard of every
walk it made holds (:func:`guard_check`): the first apply and the hundredth run the same install loop
(:func:`patchreg._state.take`) over the same kind of plan; a kept plan only saves the resolution. The patches a
guard cannot follow (misses, creations, mapping items, deletions, unguarded walks) are resolved again at every apply,
in their place among the others.
"""

from __future__ import annotations

import operator
import sys
import types
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from patchreg._checks import name_patch, resolve, warn_not_found
from patchreg._disable import SKIP as DISABLED
from patchreg._disable import off
from patchreg._ledger import Plan, Step, plan_key, weak_or_id
from patchreg._namespace import ABSENT, binding
from patchreg._predicates import REFRESHES
from patchreg._records import Patch, PatchSet, patches_of
from patchreg._state import Book, stack_for
from patchreg._targets import NOT_INSTANCES, UNSET, ImportPath, Selector, Site, by_values, class_attr
from patchreg.exceptions import PatchError

__all__ = ["Guards", "guard_check", "import_chain", "make_plan", "plannable", "trace", "work"]

#: a patch's part of a plan: its steps, fixed while the plan's guard holds, or None: resolved at every apply
Part = tuple[Patch, "list[Step] | None"]


def make_plan(
    book: Book, target: object, obj: Any, warn: bool | None = None, lazy: bool = False, name: str | None = None
) -> tuple[Plan, list[Step], tuple[tuple[str, str], ...]]:
    """Resolve ``target`` on ``obj`` now: the plan (kept by ``book`` when a guard can tell later whether resolving
    again would find the same), and this apply's steps and skips.

    With ``lazy``, an import-path patch whose module is not imported yet waits for it (``Plan.waiting``). A patch
    ``PATCHREG_DISABLE`` names is skipped as a predicate's no is (an essential one refuses: a PatchError); ``name``:
    the set's name it is judged under, when ``target`` is one patch of it (a lazy patch at its import).
    """
    own, patches = patches_of(target)
    name = own if name is None else name
    disabled = off(name, patches)
    waiting = tuple(p for p in patches if p.is_global and p.where.module not in sys.modules) if lazy else ()  # type: ignore[union-attr]
    waiting = tuple(p for p in waiting if id(p) not in disabled)
    plan = Plan()
    plan.name, plan.patches, plan.waiting, plan.gen = name, patches, waiting, REFRESHES[0]
    keep = not lazy and plannable(target, obj)
    parts: list[Part] = []  # the plan's own: None where resolved again at every apply
    steps: list[Step] = []
    skipped: list[tuple[str, str]] = []  # this apply's
    fixed: list[tuple[str, str]] = []  # the predicates' (the plan's: fixed until refresh())
    reads: list[tuple[Any, ...]] = []
    walks: list[tuple[Any, ...]] = []
    imports: list[tuple[str, Any, tuple[tuple[Any, str, Any], ...]]] = []
    for patch in patches:
        if patch in waiting:
            continue
        found = _resolve_one(book, patch, obj, warn, disabled)
        if isinstance(found, tuple):
            skipped.append(found)
            fixed.append(found)
        elif isinstance(found, str):  # a target not found: a skip this time, resolved again next time
            skipped.append((patch.name, found))
            parts.append((patch, None))
        else:
            steps.extend(found)
            guarded = keep and _guard(patch, obj, found, reads, walks, imports)
            parts.append((patch, found if guarded else None))
    plan.skipped, plan.parts = tuple(fixed), tuple(parts)
    plan.steps = [s for _p, own in parts for s in own or ()]
    plan.again = tuple(p for p, own in parts if own is None)
    plan.holds = guard_check((tuple(reads), tuple(walks)), tuple(imports))
    if keep and plan.gen == REFRESHES[0] and _weakly(plan, book, target, obj):
        book.keep(plan)
    return plan, steps, tuple(skipped)


def work(
    book: Book, plan: Plan, obj: Any, warn: bool | None = None
) -> tuple[Sequence[Step], tuple[tuple[str, str], ...]]:
    """The steps and skips of an apply of a kept plan now: its steps, with the patches it resolves at every apply
    resolved again in their place."""
    if not plan.again:
        return plan.steps, plan.skipped
    steps: list[Step] = []
    skipped = list(plan.skipped)
    for patch, own in plan.parts:
        if own is not None:
            steps.extend(own)
            continue
        found = _resolve_one(book, patch, obj, warn)
        if isinstance(found, str):
            skipped.append((patch.name, found))
        elif not isinstance(found, tuple):
            steps.extend(found)
    return steps, tuple(skipped)


def _resolve_one(
    book: Book, patch: Patch, obj: Any, warn: bool | None, disabled: Collection[int] = ()
) -> list[Step] | str | tuple[str, str]:
    """One patch on ``obj``: its steps; a string says why its target has no site here; a pair is a predicate's skip."""
    try:
        answer = DISABLED if disabled and id(patch) in disabled else patch.when.evaluate()
        if not answer.ok:
            return (patch.name, answer.reason)
        found = resolve(patch, obj)
        if isinstance(found, str):
            if warn is None and patch.kind != "delete":  # nothing to delete: a no-op, as pytest's raising=False
                warn_not_found(patch, found)
            return found
        order = _order(patch, found)
        return [_step(book, patch, holder, attr, order) for holder, attr in found]
    except PatchError as exc:  # from a predicate, a selector or a check: say which patch it was about
        name_patch(exc, patch)
        raise


def _order(patch: Patch, found: list[Site]) -> list[Any] | None:
    """A dict patch's mapping keys in their order now (its restore puts them back in it)."""
    if patch.kind != "dict" or not found:
        return None
    return list(found[0].holder)


def _step(book: Book, patch: Patch, holder: Any, attr: Any, order: list[Any] | None) -> Step:
    """The step of ``patch`` on one site: its stack, what the binding rule makes over what is there now, and what it
    must find there later (on an instance: its class, which stores the attribute as read now)."""
    stack = stack_for(book, patch, holder, attr)
    kind = stack.kind
    found = stack.current()
    value, make = binding(patch.kind, patch.replacement, kind, holder, attr, found, patch.prepend)
    cls: type | None = None
    mro: tuple[type, ...] = ()
    above: tuple[Any, ...] = ()
    view: Any = None
    raw: Any = ABSENT
    if kind == "instance" or (kind == "class" and patch.kind == "wrap"):
        mro, above, view, raw = _class_read(type(holder) if kind == "instance" else holder, attr, kind)
        if kind == "instance":
            cls = type(holder)
            if found is not ABSENT:  # held as a layer holds it: never keeping the instance alive
                found = weak_or_id(found)
    calls = patch.kind == "wrap" and kind != "module"
    return Step(patch, stack, found, value, make, cls, mro, view, raw, above, order, calls)


def _class_read(cls: type, attr: str, kind: str) -> tuple[tuple[type, ...], tuple[Any, ...], Any, Any]:
    """``(MRO, namespaces above the owner, owner's namespace, value)``: ``attr`` as ``cls`` stores it (for a
    class's own install, as its bases do). The namespaces are the classes' live ``vars`` views: a step re-reads them
    without running any descriptor (``getattr`` on a class would, and cannot tell ``f`` from ``staticmethod(f)``)."""
    mro = cls.__mro__
    above: list[Any] = []
    for klass in mro[1:] if kind == "class" else mro:
        view = vars(klass)
        if attr in view:
            return mro, tuple(above), view, view[attr]
        above.append(view)
    return mro, (), vars(cls), ABSENT


def plannable(target: object, obj: Any) -> bool:
    """Whether an apply of ``target`` on ``obj`` may be kept as a plan."""
    return isinstance(target, (Patch, PatchSet)) and not isinstance(obj, (str, bytes, type, types.ModuleType))


def _guard(
    patch: Patch,
    obj: Any,
    steps: list[Step],
    reads: list[tuple[Any, ...]],
    walks: list[tuple[Any, ...]],
    imports: list[tuple[str, Any, tuple[tuple[Any, str, Any], ...]]],
) -> bool:
    """Add what tells cheaply whether resolving ``patch`` on ``obj`` again would find these steps' sites; False when
    nothing can (creations, items, deletions, walks a guard cannot follow): it is resolved at every apply."""
    if patch.create or patch.is_item or patch.kind in ("delete", "dict"):
        return False
    where = patch.where
    if isinstance(where, ImportPath):
        module = sys.modules.get(where.module)
        chain = import_chain(module, where.parts[:-1]) if module is not None else None
        if chain is None:
            return False
        if (where.module, module, chain) not in imports:
            imports.append((where.module, module, chain))
        return True
    traced = trace(where, obj)
    if traced is None or len(traced[0]) != len(steps):
        return False
    for (holder, attr), step in zip(traced[0], steps, strict=True):
        if holder is not step.stack.ref() or attr != step.stack.attr:
            return False
    reads.extend(traced[1][0])
    walks.extend(traced[1][1])
    return True


def _weakly(plan: Plan, book: Book, target: object, obj: Any) -> bool:
    """Hold the plan's target and object weakly (it goes with either); False when one cannot be weakly referenced."""
    chunks = list(obj) if isinstance(obj, (list, tuple)) else ([] if obj is None else [obj])
    try:
        plan.refs = (weakref.ref(target, plan.forget), *(weakref.ref(c, plan.forget) for c in chunks))
    except TypeError:
        return False
    plan.target = plan.refs[0]
    plan.obj = _no_object if obj is None else plan.refs[1] if len(chunks) == 1 and chunks[0] is obj else _not_one
    plan.key = plan_key(target, obj)
    plan.book = weakref.ref(book)
    return True


def _no_object() -> None:
    """A plan's object reference when it was made for no object."""
    return None


def _not_one() -> object:
    """A plan's object reference when it was made for chunks: never the object of a one-object apply."""
    return _NEVER


_NEVER = object()


# -- guards: the trace of a selector's walk, and the one check that a later walk finds the same ------------

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


def guard_check(
    guards: Guards, imports: tuple[tuple[str, Any, tuple[tuple[Any, str, Any], ...]], ...] = ()
) -> Callable[[Any], bool]:
    """A function of the object applied on that is True while every read and walk of a trace, and every import
    path's walk, would find the same objects again: the one guard of a plan.

    It closes over the guards' weak references only (an import path's modules and classes strongly). Each read's
    holder must still be of the class it had (a ``__class__ =`` can bring a property or another ``__getattr__``). A
    walk whose container is the value of the last read takes it from there rather than through its own reference.
    ``imports``: per import path, ``(module name, module, (holder, part, what it gave) per step)``: the module is
    still the one imported and each step still gives what it gave.
    """
    reads, walks = guards
    if not reads and not walks and not imports:
        return _always
    last = reads[-1][4]() if reads else None
    walks = tuple(
        (None if last is not None and cref() is last else cref, cls, how, snapshot)
        for cref, cls, how, snapshot in walks
    )
    is_ = operator.is_
    modules = sys.modules

    def check(_obj: Any) -> bool:
        for name, module, chain in imports:
            if modules.get(name) is not module:
                return False
            for holder, part, found in chain:
                if vars(holder).get(part) is not found:
                    return False
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


def import_chain(module: Any, parts: tuple[str, ...]) -> tuple[tuple[Any, str, Any], ...] | None:
    """What an import path's walk to its holder found, step by step, as :func:`guard_check` re-reads it (each step
    from the holder's own namespace); None when a step is served otherwise (a ``__getattr__``): resolve every time."""
    chain: list[tuple[Any, str, Any]] = []
    holder = module
    for part in parts:
        found = vars(holder).get(part, UNSET) if isinstance(getattr(holder, "__dict__", None), Mapping) else UNSET
        if found is UNSET:
            return None
        chain.append((holder, part, found))
        holder = found
    return tuple(chain)


def _always(_obj: Any) -> bool:
    return True


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
    """:func:`~patchreg._targets._select` over weakly referenceable containers and elements, recording each walk.

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
