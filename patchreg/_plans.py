"""Plans: what an apply of a Patch or PatchSet on one object resolved, re-used while its guards hold.

An apply of a Patch or PatchSet on an object is resolved fully the first time (selectors walked,
predicates evaluated, every check made); on the second apply of the same set on the same object a
:class:`Plan` is remembered from a trace of that resolution, and later applies re-use it while its
guards show that resolving again would find the same holders. The store keeps the plans and makes a plan's clean
installs in one pass (:meth:`patchreg._store.Store.take_planned`, the hot path).
"""

from __future__ import annotations

import logging
import sys
import types
import weakref
from collections.abc import Callable, Collection
from typing import Any

from patchreg._checks import check_mapping, check_patchable, name_patch, report_skips, warn_not_found
from patchreg._disable import SKIP as DISABLED
from patchreg._guards import Guards, guard_check, trace
from patchreg._namespace import ABSENT, bind_like, label, own_value
from patchreg._predicates import on_refresh
from patchreg._records import Patch, PatchSet
from patchreg._stacks import GLOBAL as _GLOBAL
from patchreg._stacks import METHOD as _METHOD
from patchreg._stacks import PLAIN as _PLAIN
from patchreg._stacks import WRAP as _WRAP
from patchreg._stacks import Layer, Owner, Report, inherited_layer, plan_key
from patchreg._store import LOCK, STORES, Stack, Store
from patchreg._targets import Miss, Site, identity
from patchreg.exceptions import PatchError

__all__ = [
    "Plan",
    "Trace",
    "Work",
    "locate",
    "plan_key",
    "take_plan",
    "resolve",
    "resolve_all",
]

log = logging.getLogger("patchreg")

#: One unit of an apply: (patch, holder, attribute).
Work = tuple[Patch, Any, str]
#: What an apply traced per patch for a plan: (patch, the predicate's skip reason, sites and guards).
Trace = tuple[Patch, "str | None", "tuple[list[Site], Guards | None] | None"]
SEEN_MAX = 4096  # first applies remembered (to plan on the second one) before the marks are dropped
generation = [0]  # bumped by refresh(): plans made before hold stale predicate answers


def _stale_plans() -> None:
    """refresh(): plans hold predicate answers, so every registry drops its plans (and a resolution that was
    under way when it ran does not make one: it compares the generation it began in)."""
    generation[0] += 1
    with LOCK:
        for store in list(STORES):
            store.forget_plans()


on_refresh(_stale_plans)


def plannable(target: object, obj: Any) -> bool:
    """Whether an apply of ``target`` on ``obj`` may be remembered as a plan."""
    return isinstance(target, (Patch, PatchSet)) and not isinstance(obj, (str, bytes, type, types.ModuleType))


def _traced(patch: Patch, obj: Any, found: list[Site]) -> tuple[list[Site], Guards | None] | None:
    """A selector's trace on ``obj`` when it agrees with ``found``; an import path's site with no guards (the plan
    guards the import instead, :func:`_import_guard`); None: resolve at every apply."""
    if patch.create or patch.is_item or patch.kind in ("delete", "dict"):
        return None
    if patch.is_global:
        return (found, None) if patch.kind in ("replace", "wrap", "value") else None
    traced = trace(patch.where, obj)  # type: ignore[arg-type]
    if traced is None or len(traced[0]) != len(found):
        return None
    for (holder, attr), hit in zip(traced[0], found, strict=True):
        if holder is not hit.holder or attr != hit.attr:
            return None
    return traced


class Plan:
    """One Patch or PatchSet resolved on one object, re-used while its guards hold.

    ``items`` per patch: ``(patch, skip reason, entries)``: a predicate's skip (valid until
    ``refresh()``), or entries ``(stack, holder type, class read, mode)`` of a traced selector (on an import
    path's module or class: ``(stack, None, (original, installed), mode)``),
    or None for a patch resolved at every apply (misses, creations, items, walks guards cannot follow).
    The class read (:func:`_class_read`) is the attribute as the holder's class stores it when planned:
    an entry is stale once the class stores something else (the method deleted, replaced, re-wrapped
    as a ``staticmethod``, or shadowed by a class earlier in the MRO). An import path's entry is stale once the path
    leads elsewhere (:func:`_import_guard`).
    The object and its holders are held weakly (their classes and modules strongly): a plan never keeps its
    object alive, and goes with it.
    """

    __slots__ = (
        "__weakref__",
        "fast",
        "holds",
        "items",
        "key",
        "name",
        "obj",
        "planned",
        "refs",
        "skipped",
        "store",
        "target",
    )

    planned: bool  #: every patch is planned (skipped, or its installs are entries): no resolution at an apply
    #: when every install can be made in one pass (:meth:`Store.take_planned`): per install (mode, stack, holder
    #: type (None on a module or class), the namespace read and what it stored when planned, attr, the replacement
    #: (mode _GLOBAL: the object to install), patch, stack.layers)
    fast: tuple[tuple[int, Stack, Any, Any, Any, str, Any, Patch, list[Layer]], ...] | None
    skipped: tuple[tuple[str, str], ...]  # the predicate skips
    #: the guards as one check of the object applied on: True while resolving again would find the same holders
    holds: Callable[[Any], bool]
    items: tuple[tuple[Patch, str | None, tuple[tuple[Stack, Any, Any, int], ...] | None], ...]
    key: tuple[int, ...]
    name: str
    store: weakref.ref[Store]  # the registry's store, which keeps it
    refs: tuple[weakref.ref[Any], ...]  # the target's, then each chunk's
    target: Callable[[], Any]  # refs[0]
    obj: Callable[[], Any]  # the one object's weak reference (for None: returns None; for chunks: never matches)

    @classmethod
    def remember(
        cls,
        installs: Store,
        target: object,
        obj: Any,
        name: str,
        traces: list[Trace],
        gen: int,
    ) -> Plan | None:
        """Keep a plan in ``installs`` (as the one used last) from the traces of an apply that just succeeded (under
        the lock: its sites exist, with this apply's layers on them); none when ``refresh()`` ran since the
        resolution began (``gen``: the generation it began in)."""
        if gen != generation[0]:
            installs.keep_plan(None)
            return None
        plan = cls()
        chunks = list(obj) if isinstance(obj, (list, tuple)) else ([] if obj is None else [obj])
        try:
            plan.refs = (weakref.ref(target, plan.forget), *(weakref.ref(c, plan.forget) for c in chunks))
        except TypeError:  # an object without weak references is resolved at every apply
            installs.keep_plan(None)
            return None
        plan.target = plan.refs[0]
        plan.obj = _no_object if obj is None else plan.refs[1] if len(chunks) == 1 and chunks[0] is obj else _not_one
        items: list[tuple[Patch, str | None, tuple[tuple[Stack, Any, Any, int], ...] | None]] = []
        reads: list[tuple[Any, ...]] = []
        walks: list[tuple[Any, ...]] = []
        guards: list[Guards] = []
        imports: list[tuple[str, Any, tuple[tuple[Any, str, Any], ...]]] = []
        for patch, reason, traced in traces:
            entries = None
            if traced is not None:
                sites, guard = traced
                entries = _entries(installs, patch, sites, guard is None)
                if entries is not None and guard is None:  # an import path: guard the import instead
                    imported = _import_guard(patch)
                    if imported is None:
                        entries = None
                    elif imported not in imports:
                        imports.append(imported)
                elif entries is not None and guard is not None and guard not in guards:  # one path, one guard
                    guards.append(guard)
                    reads.extend(guard[0])
                    walks.extend(guard[1])
            items.append((patch, reason, entries))
        plan.items = tuple(items)
        holds = guard_check((tuple(reads), tuple(walks)), obj if plan.obj is not _not_one else None)
        plan.holds = _with_imports(holds, tuple(imports)) if imports else holds
        plan.skipped = tuple((p.name, reason) for p, reason, _e in items if reason is not None)
        plan.planned = all(reason is not None or entries is not None for _p, reason, entries in items)
        plan.fast = _fast(items) if plan.planned else None
        plan.name, plan.key = name, plan_key(target, obj)
        plan.store = weakref.ref(installs)
        installs.keep_plan(plan)
        return plan

    def forget(self, _dead: object = None) -> None:
        """Drop this plan (its target or object died), also as the registry's last one (it holds classes)."""
        store = self.store()
        if store is not None:
            store.forget_plan(self)

    def matches(self, target: object, obj: Any) -> bool:
        """True when this plan was made for ``target`` on ``obj`` (the same objects, not equal ones)."""
        refs = self.refs
        if refs[0]() is not target:
            return False
        if len(refs) == 2 and refs[1]() is obj:
            return True
        if isinstance(obj, (list, tuple)):
            return len(refs) == len(obj) + 1 and all(r() is c for r, c in zip(refs[1:], obj, strict=True))
        return obj is None and len(refs) == 1

    def work(self, obj: Any, warn: bool | None = None) -> tuple[list[Work], list[tuple[str, str]]] | None:
        """The work and skips of an apply now, or None when the plan is stale (resolve again)."""
        if not self.holds(obj):
            return None
        work: list[Work] = []
        skipped: list[tuple[str, str]] = []
        for patch, reason, entries in self.items:
            if reason is not None:
                skipped.append((patch.name, reason))
            elif entries is None:
                found = resolve(patch, obj)
                if isinstance(found, str):
                    skipped.append((patch.name, found))
                    if warn is None and patch.kind != "delete":  # nothing to delete: a no-op, as pytest's raising=False
                        warn_not_found(patch, found)
                else:
                    work.extend((patch, holder, attr) for holder, attr in found)
            else:
                for stack, cls, seen, mode in entries:
                    holder, attr = stack.ref(), stack.attr
                    if cls is None:  # an import path's module or class (the plan's guards checked the import)
                        if holder is None:
                            return None
                        check_patchable(patch, holder, attr)
                        work.append((patch, holder, attr))
                        continue
                    if type(holder) is not cls or _class_changed(cls, attr, *seen):  # died, class swapped, or
                        return None  # the class's attribute changed (deleted, replaced, shadowed)
                    if not mode or attr in holder.__dict__:  # not the clean case: the checks of a first apply
                        check_patchable(patch, holder, attr)
                    work.append((patch, holder, attr))
        return work, skipped


def take_plan(owner: Owner, installs: Store, plan: Plan, obj: Any, strict: bool, warn: bool | None) -> Report | None:
    """Apply a plan whose every patch is planned; None when it turns out stale (nothing changed).

    A plan whose every install can be made in one pass (:attr:`Plan.fast`) installs the one-pass way
    (:meth:`Store.take_planned`) while it can; else (shared with an outer block, covered by another registry) each
    install is taken the general way.
    """
    if not plan.holds(obj):
        return None
    if plan.skipped and (strict or warn):
        report_skips(plan.name, list(plan.skipped), strict, [p for p, _r, _e in plan.items])
    if plan.fast is not None:
        ledger = installs.take_planned(owner, plan)
        if ledger is not None:
            return ledger
    with LOCK:
        if installs.dead:
            installs.purge()
        found = plan.work(obj)  # under the lock, as the takes: what it checked still holds when they run
        if found is None:
            return None
        ledger = Report.make(owner, plan.name, plan.skipped)
        installs.take_all(found[0], ledger)
        installs.keep_plan(plan)
    return ledger


def _class_read(cls: type, attr: str) -> tuple[tuple[type, ...], tuple[Any, ...], Any, Any]:
    """``(MRO, namespaces above the owner, owner's namespace, value)``: ``attr`` as ``cls`` stores it.

    The namespaces are the classes' live ``vars`` views: :func:`_class_changed` re-reads them without
    running any descriptor (``getattr`` on a class would, and cannot tell ``f`` from ``staticmethod(f)``).
    """
    mro = cls.__mro__
    above: list[Any] = []
    for klass in mro:
        view = vars(klass)
        if attr in view:
            return mro, tuple(above), view, view[attr]
        above.append(view)
    return mro, (), vars(cls), ABSENT


def _class_changed(cls: type, attr: str, mro: tuple[type, ...], above: tuple[Any, ...], view: Any, raw: Any) -> bool:
    """True when ``cls`` no longer stores ``attr`` as :func:`_class_read` found it."""
    if view.get(attr, ABSENT) is not raw:
        return True
    return bool(above) and (cls.__mro__ is not mro or any(attr in v for v in above))


def _no_object() -> None:
    """A plan's object reference when it was made for no object."""
    return None


def _not_one() -> object:
    """A plan's object reference when it was made for chunks: never the object of a one-object apply."""
    return _NEVER


_NEVER = object()  # what a plan made for chunks returns as its object: never the object of a one-object apply


def _entries(
    installs: Store, patch: Patch, sites: list[Site], imported: bool
) -> tuple[tuple[Stack, Any, Any, int], ...] | None:
    """The plan entries of ``patch``'s sites (this apply's stacks), or None: resolve it at every apply.

    ``imported``: the sites of an import path (a module or a class), whose entries hold no class read but what
    this apply's install there displaced and installed (:func:`_global_read`).
    """
    entries: list[tuple[Stack, Any, Any, int]] = []
    for holder, attr in sites:
        stack = installs.stacks.get((identity(holder), attr))
        if stack is None or stack.ref() is not holder:
            return None
        if imported:
            read = _global_read(patch, stack, holder)
            entries.append((stack, None, read, 0 if read is None else _GLOBAL))
            continue
        kind = type(holder)
        seen = _class_read(kind, attr)  # what an apply compares: the class attribute as stored
        if seen[3] is ABSENT:
            return None
        entries.append((stack, kind, seen, _mode(patch, stack, holder, seen[3])))
    return tuple(entries)


def _mode(patch: Patch, stack: Stack, holder: Any, raw: Any) -> int:
    """How a planned install on an instance is made (0: the general way, with the checks of a first apply)."""
    if stack.kind != "instance":
        return 0
    if patch.kind == "value":
        return _PLAIN
    if patch.kind == "wrap":  # a wrap of the class's function, bound as getattr binds it; not of another's install
        getter: Any = type(holder).__getattribute__
        plain = type(raw) is types.FunctionType and getter is object.__getattribute__
        return _WRAP if plain and inherited_layer(stack, holder) is None else 0
    if patch.kind != "replace":
        return 0
    value = patch.replacement
    bound = bind_like(value, holder, stack.attr, ABSENT)
    if bound is value:
        return _PLAIN
    if type(value) is types.FunctionType and type(bound) is types.MethodType and bound.__self__ is holder:
        return _METHOD
    return 0


def _global_read(patch: Patch, stack: Stack, holder: Any) -> tuple[Any, Any] | None:
    """``(original, installed)`` of this apply's install of ``patch`` on a module or class attribute, when a later
    apply may install that very object again in one pass: the only layer there, over an original the holder stores
    itself, written by a plain ``setattr`` (a module of the plain module type, a class whose metaclass keeps
    ``type``'s). None: the general way."""
    layers = stack.layers
    if len(layers) != 1 or layers[0].patch is not patch:
        return None
    if stack.kind == "module":
        plain = type(holder) is types.ModuleType
    else:
        plain = stack.kind == "class" and type(holder).__setattr__ is type.__setattr__  # type: ignore[comparison-overlap]
    layer = layers[0]
    original = layer.displaced()
    if not plain or original is ABSENT or vars(holder).get(stack.attr, ABSENT) is not layer.installed:
        return None
    return original, layer.installed


def _fast(
    items: list[tuple[Patch, str | None, tuple[tuple[Stack, Any, Any, int], ...] | None]],
) -> tuple[tuple[int, Stack, Any, Any, Any, str, Any, Patch, list[Layer]], ...] | None:
    """A planned apply's installs for :meth:`Store.take_planned`, when each can be made in one pass; else None."""
    fast: list[tuple[int, Stack, Any, Any, Any, str, Any, Patch, list[Layer]]] = []
    for patch, _reason, entries in items:
        for stack, kind, read, mode in entries or ():
            if not mode:
                return None
            if kind is None:  # a module's or class's: its namespace must still store the original
                fast.append((mode, stack, None, vars(stack.ref()), read[0], stack.attr, read[1], patch, stack.layers))
            elif read[1]:  # a class above the one that stores it could shadow it: checked the general way
                return None
            else:
                fast.append((mode, stack, kind, read[2], read[3], stack.attr, patch.replacement, patch, stack.layers))
    return tuple(fast) if fast else None


def _import_guard(patch: Patch) -> tuple[str, Any, tuple[tuple[Any, str, Any], ...]] | None:
    """What an import path's resolution found: ``(module name, module, (holder, part, what it gave) per step)``."""
    where: Any = patch.where
    module = sys.modules.get(where.module)
    if module is None:
        return None
    chain: list[tuple[Any, str, Any]] = []
    holder = module
    for part in where.parts[:-1]:
        try:
            found = getattr(holder, part)
        except Exception:  # a library's __getattr__ may raise anything: resolve at every apply
            return None
        chain.append((holder, part, found))
        holder = found
    return where.module, module, tuple(chain)


def _with_imports(
    holds: Callable[[Any], bool], imports: tuple[tuple[str, Any, tuple[tuple[Any, str, Any], ...]], ...]
) -> Callable[[Any], bool]:
    """``holds``, and every import path still leads where it led when planned (a module re-imported or a class
    replaced in its module makes the plan stale)."""
    modules = sys.modules

    def holds_all(obj: Any) -> bool:
        for name, module, chain in imports:
            if modules.get(name) is not module:
                return False
            for holder, part, found in chain:
                try:
                    if getattr(holder, part) is not found:
                        return False
                except Exception:  # gone, or raises now: resolve again (which says why)
                    return False
        return holds(obj)

    return holds_all


def resolve_all(
    patches: tuple[Patch, ...],
    obj: Any,
    traces: list[Trace] | None = None,
    warn: bool | None = None,
    disabled: Collection[int] = (),
) -> tuple[list[Work], list[tuple[str, str]]]:
    """Evaluate predicates and resolve targets, outside the lock; changes nothing.

    With ``traces``, also appends what a :class:`Plan` needs per patch. With ``warn=None`` (an
    apply's default), a target not found is logged once per patch and process (:func:`warn_not_found`).
    ``disabled``: the identities of the patches ``PATCHREG_DISABLE`` names (:func:`patchreg._disable.off`),
    skipped as a predicate saying no is.
    """
    work: list[Work] = []
    skipped = []
    for patch in patches:
        try:
            answer = DISABLED if disabled and id(patch) in disabled else patch.when.evaluate()
            found = resolve(patch, obj) if answer.ok else ""
        except PatchError as exc:  # from a predicate, a selector or a check: say which patch it was about
            name_patch(exc, patch)
            raise
        if not answer.ok:
            skipped.append((patch.name, answer.reason))
            if traces is not None:
                traces.append((patch, answer.reason, None))
            continue
        if isinstance(found, str):
            skipped.append((patch.name, found))
            if warn is None and patch.kind != "delete":  # nothing to delete: a no-op, as pytest's raising=False
                warn_not_found(patch, found)
            if traces is not None:
                traces.append((patch, None, None))
            continue
        work.extend((patch, holder, attr) for holder, attr in found)
        if traces is not None:
            traces.append((patch, None, _traced(patch, obj, found)))
    return work, skipped


def locate(patch: Patch, obj: Any) -> list[Site] | Miss:
    """Where ``patch`` installs on ``obj``: its target's sites (absent ones too with ``create``); for an
    item patch, ``(mapping, key)`` for each mapping the target names. A delete patch's sites must each hold what it
    deletes in their own namespace (or mapping): else there is nothing to delete, a skip."""
    if not patch.is_item:
        found = patch.where.resolve(obj, create=patch.create)
        if patch.kind == "delete" and not isinstance(found, Miss):
            for holder, attr in found:
                if own_value(holder, attr) is ABSENT:
                    return Miss(
                        f"{label(holder)}.{attr} is not in its own namespace (inherited, or served by __getattr__): "
                        "nothing to delete there; point the patch at the class or module that holds it"
                    )
        return found
    found = patch.where.resolve(obj)
    if isinstance(found, Miss):
        return found
    sites: list[Site] = []
    for holder, attr in found:
        mapping = getattr(holder, attr)
        check_mapping(patch, mapping)
        if patch.kind == "dict":  # every key it sets, then (clear=True) every other key there now
            keys = list(patch.replacement)
            if patch.clear:
                keys += [k for k in list(mapping) if k not in patch.replacement]
            sites.extend(Site(mapping, key) for key in keys)
            continue
        if not patch.create and patch.key not in mapping:
            if patch.kind == "delete":
                return Miss(f"{patch.where}[{patch.key!r}] is not set: nothing to delete")
            return Miss(
                f"{patch.where}[{patch.key!r}] is not set; pass create=True to set it for the patch "
                "(deleted again on revert)"
            )
        sites.append(Site(mapping, patch.key))
    return sites


def resolve(patch: Patch, obj: Any) -> list[Site] | str:
    """The sites of ``patch`` on ``obj``, checked patchable; a string says why there are none."""
    found = locate(patch, obj)
    if isinstance(found, Miss):
        return found.reason
    for holder, attr in found:
        check_patchable(patch, holder, attr)
    return found
