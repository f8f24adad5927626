"""The declarations of patchreg and their read-only views: Patch, PatchSet, Installed, and a Patch's backup slot."""

from __future__ import annotations

import functools
import inspect
import operator
import re
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import attrs

from patchreg._drift import Verified
from patchreg._namespace import ABSENT, environ_problem
from patchreg._predicates import Predicate, always
from patchreg._targets import ImportPath, Selector, identity, parse_target
from patchreg.exceptions import PatchDefinitionError

__all__ = [
    "ABSENT",
    "INSTALL_ORDER",
    "Backup",
    "Installed",
    "Patch",
    "PatchSet",
    "Target",
    "named_modules",
    "named_paths",
    "patches_of",
]

#: the key that sorts installs (layers) in the order they were made, across registries
INSTALL_ORDER = operator.attrgetter("seq")

Kind = Literal["replace", "wrap", "value", "item", "delete", "dict"]
#: Kinds whose replacement is installed as it is, never called by patchreg or required to be callable.
VALUE_KINDS = ("value", "item", "delete", "dict")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.+\-]*\Z")
_DESCRIPTORS = (staticmethod, classmethod, property, functools.cached_property)


class Backup:
    """A patch's backup slot: the originals its live installs displaced, by the object patched.

    A read-only view of the registries' installs: the state adds here every attribute (its stack) a plan of the patch
    will install on, and each install keeps its original until it is restored, so nothing here can outlive or disagree
    with what is installed. ``get(obj)`` is the most recent original on ``obj`` (``ABSENT`` if the attribute was not
    in its namespace); a patch applied by two registries on one holder stacks, the later on top. Nothing is stored on
    the patched object.
    """

    __slots__ = ("stacks",)

    def __init__(self) -> None:
        #: the stacks its patch may be installed on (held weakly; only the state adds to it)
        self.stacks: weakref.WeakSet[Any] = weakref.WeakSet()

    def layers(self) -> list[Any]:
        """The patch's live installs (its layers, of every registry), oldest first."""
        found = [la for s in list(self.stacks) if s.ref() is not None for la in s.layers if la.patch.backup is self]
        return sorted(found, key=INSTALL_ORDER)

    def _pairs(self) -> list[tuple[Any, Any]]:
        return [(layer.stack.ref(), layer.displaced()) for layer in self.layers()]

    def get(self, holder: Any, default: Any = None) -> Any:
        """The most recent original of ``holder`` (``ABSENT`` if it had none), or ``default``."""
        found = [original for h, original in self._pairs() if h is holder]
        return found[-1] if found else default

    def __contains__(self, holder: object) -> bool:
        return any(h is holder for h, _original in self._pairs())

    def __len__(self) -> int:
        """How many objects have an original kept."""
        return len({identity(h) for h, _original in self._pairs()})

    def __repr__(self) -> str:
        return f"<Backup of {len(self)} object(s)>"


def _check_name(instance: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        msg = (
            f"Invalid {type(instance).__name__} {attribute.name} {value!r}: use a non-empty name of letters, "
            "digits, '_', '.', '+' or '-', starting with a letter or '_'."
        )
        raise PatchDefinitionError(msg)


@attrs.frozen(eq=False, repr=False)
class Patch:
    """One declarative patch: what to put where, and when.

    ``kind="replace"`` installs ``replacement`` in place of the attribute (bound to the
    instance for selector targets on methods); ``kind="wrap"`` installs a
    ``wrapt.FunctionWrapper`` calling ``replacement(wrapped, instance, args, kwargs)``;
    ``kind="value"`` installs ``replacement`` as it is, callable or not (a constant, a flag, a
    config field); ``kind="item"`` sets ``target``'s mapping (``"os:environ"``, a registry dict)
    at ``key`` to ``replacement`` (with ``prepend=os.pathsep``: in front of the value there, joined by it);
    ``kind="delete"`` makes the attribute (or ``key``) absent while applied; ``kind="dict"`` sets every key of the
    mapping ``replacement`` in ``target``'s mapping (``clear=True``: and makes every other key absent), as
    ``mock.patch.dict``, each key an install of its own. ``create=True`` lets a patch install an attribute (or a key)
    that is absent, deleted again on revert; without it an absent one is a skip.
    Patches compare by identity: a patch is declared once, at module level.
    """

    name: str = attrs.field(validator=_check_name)
    target: str | Selector
    replacement: Any  # a callable (replace, wrap), or any object (value, item)
    when: Predicate = always
    kind: Kind = "replace"
    doc: str = ""
    create: bool = False
    key: Any = None
    verified: Verified | None = None  # the upstream bodies it was verified against (patchreg._drift)
    #: an item patch's separator to put its value in front of the one there (``os.pathsep``: pytest's
    #: ``setenv(..., prepend=os.pathsep)``); the value alone where there is none
    prepend: str | None = None
    #: a dict patch's ``clear=True``: the keys not in its values are absent too while applied (``mock.patch.dict``'s)
    clear: bool = False
    backup: Backup = attrs.field(init=False, factory=Backup)
    where: ImportPath | Selector = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "where", parse_target(self.target))
        _validate(self)

    @property
    def is_global(self) -> bool:
        """True for import-path targets (modules and classes), False for selectors."""
        return isinstance(self.where, ImportPath)

    @property
    def description(self) -> str:
        """The ``doc`` field, else the replacement's docstring's first line."""
        text = self.doc or ("" if self.kind in VALUE_KINDS else inspect.getdoc(self.replacement) or "")
        return text.strip().splitlines()[0] if text.strip() else ""

    def __repr__(self) -> str:
        key = f", key={self.key!r}" if self.is_item else ""
        create = ", create=True" if self.create is True else ""
        create += f", prepend={self.prepend!r}" if self.prepend is not None else ""
        return (
            f"Patch({self.name!r}, {str(self.where)!r}, kind={self.kind!r}{key}{create}, when={_when_text(self.when)})"
        )

    @property
    def is_item(self) -> bool:
        """True for a patch of keys of a mapping (``kind="item"`` or ``"dict"``, or ``kind="delete"`` with a ``key``)."""
        return self.kind in ("item", "dict") or (self.kind == "delete" and self.key is not None)


def _when_text(when: object) -> str:
    """``when`` as a Patch's repr shows it; safe on the invalid ``when`` a PatchDefinitionError carries."""
    if not isinstance(when, Predicate):
        return repr(when)
    try:
        return when.describe()
    except Exception:  # a predicate subclass without a working describe(): a repr must not raise
        return f"<{type(when).__name__}>"


def _validate(patch: Patch) -> None:
    if patch.kind not in ("replace", "wrap", "value", "item", "delete", "dict"):
        msg = (
            f"Patch {patch.name!r}: unknown kind {patch.kind!r}; use 'replace', 'wrap', 'value', 'item', 'delete' "
            "or 'dict'."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    _validate_kind_fields(patch)
    if patch.replacement is ABSENT:
        msg = (
            f"Patch {patch.name!r}: ABSENT is patchreg's own marker for an attribute or key that is not there, not "
            "a replacement or value; give the object to install."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.kind == "delete" and patch.replacement is not None:
        msg = (
            f"Patch {patch.name!r}: a delete patch installs nothing, it removes {str(patch.where)!r}"
            f"{'' if patch.key is None else f'[{patch.key!r}]'} for as long as it is applied; pass None as its "
            "replacement."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.kind == "dict":
        _validate_dict(patch)
    elif patch.clear is not False:
        msg = f"Patch {patch.name!r}: clear= is for kind='dict' (the whole mapping); leave it out."
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.is_item and patch.target == "os:environ" and patch.kind != "dict":
        problem = environ_problem(patch.key, "" if patch.kind == "delete" else patch.replacement)
        if problem is not None:
            msg = f"Patch {patch.name!r}: {problem}; give os.environ a valid name and a str value."
            raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if not isinstance(patch.when, Predicate):
        msg = (
            f"Patch {patch.name!r}: when={patch.when!r} is not a predicate; "
            "use requires(), accepts(), has(), check() or always."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.verified is not None and not isinstance(patch.verified, Verified):
        msg = f"Patch {patch.name!r}: verified={patch.verified!r} is not a Verified(distribution, path, bodies)."
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if not isinstance(patch.doc, str):
        msg = f"Patch {patch.name!r}: doc must be a string, got {patch.doc!r}; give a string or leave it out."
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.kind == "wrap":
        _validate_wrapper(patch)
    elif patch.kind == "replace" and not (callable(patch.replacement) or isinstance(patch.replacement, _DESCRIPTORS)):
        msg = (
            f"Patch {patch.name!r}: replacement {patch.replacement!r} is not callable; "
            "give a function (or a staticmethod, classmethod or property), or, to install a plain value "
            "(a constant, a flag, a config field), say so with kind='value'."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)


def _validate_kind_fields(patch: Patch) -> None:
    """``create`` is a bool, no wrap creates, ``key`` is given exactly for item patches, and hashable."""
    if not isinstance(patch.create, bool):
        msg = f"Patch {patch.name!r}: create must be True or False, got {patch.create!r}."
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.create and patch.kind == "wrap":
        msg = (
            f"Patch {patch.name!r}: a wrap patch cannot create its attribute (there is nothing to wrap); "
            "use kind='replace' or kind='value' with create=True."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.prepend is not None and (
        patch.kind != "item" or not isinstance(patch.prepend, str) or not isinstance(patch.replacement, str)
    ):
        msg = (
            f"Patch {patch.name!r}: prepend={patch.prepend!r} puts a str value in front of a mapping item's "
            "(e.g. kind='item', key='PATH', prepend=os.pathsep); give kind='item', a str replacement and a str "
            "separator, or leave prepend out."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.create and patch.kind == "delete":
        msg = f"Patch {patch.name!r}: a delete patch cannot create what it deletes; leave create out."
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.kind == "dict":
        pass  # its keys are the replacement's (_validate_dict)
    elif patch.is_item:
        try:
            hash(patch.key)
        except TypeError:
            msg = f"Patch {patch.name!r}: key {patch.key!r} is not hashable; give the mapping key (e.g. a string)."
            raise PatchDefinitionError(msg, patch=patch, target=patch.target) from None
        if patch.key is None:
            msg = (
                f"Patch {patch.name!r}: kind='item' sets one key of the mapping {str(patch.where)!r}; "
                "name it with key=..., e.g. Patch(name, 'os:environ', '1', kind='item', key='VLLM_USE_V1')."
            )
            raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    elif patch.key is not None:
        msg = (
            f"Patch {patch.name!r}: key={patch.key!r} is for mapping items; use kind='item' or kind='delete' "
            f"(the target {str(patch.where)!r} is then the mapping), or leave key out."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)


def _validate_dict(patch: Patch) -> None:
    """A dict patch: a mapping of values, no ``key``, no ``create`` (it creates what is absent), ``clear`` a bool."""
    if not isinstance(patch.replacement, Mapping):
        msg = (
            f"Patch {patch.name!r}: kind='dict' takes the mapping of keys and values to set, got {patch.replacement!r}; "
            "give a dict (empty with clear=True: the mapping empty while applied)."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    if patch.key is not None or patch.create or not isinstance(patch.clear, bool):
        msg = (
            f"Patch {patch.name!r}: kind='dict' sets the keys of its mapping (and creates the absent ones); leave "
            "key and create out, and give clear as True or False."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    for key, value in patch.replacement.items():
        if value is ABSENT:
            msg = f"Patch {patch.name!r}: the value of {key!r} is ABSENT, patchreg's own marker; give a value."
            raise PatchDefinitionError(msg, patch=patch, target=patch.target)
        if patch.target == "os:environ" and (problem := environ_problem(key, value)) is not None:
            msg = f"Patch {patch.name!r}: {problem}; give os.environ valid names and str values."
            raise PatchDefinitionError(msg, patch=patch, target=patch.target)


def _validate_wrapper(patch: Patch) -> None:
    wrapper = patch.replacement
    if not callable(wrapper):
        msg = f"Patch {patch.name!r}: a wrap patch needs a callable wrapper(wrapped, instance, args, kwargs), got {wrapper!r}."
        raise PatchDefinitionError(msg, patch=patch, target=patch.target)
    try:
        inspect.signature(wrapper).bind(None, None, (), {})
    except TypeError:
        msg = (
            f"Patch {patch.name!r}: wrapper {getattr(wrapper, '__qualname__', wrapper)!r} must accept "
            "(wrapped, instance, args, kwargs); for a plain replacement use kind='replace'."
        )
        raise PatchDefinitionError(msg, patch=patch, target=patch.target) from None
    except ValueError:  # no signature (some builtins): trust the caller
        pass


def _to_patches(value: Iterable[Patch]) -> tuple[Patch, ...]:
    if isinstance(value, (str, bytes, Patch)) or not isinstance(value, Iterable):
        msg = f"PatchSet patches must be an iterable of Patch records, got {value!r}."
        raise PatchDefinitionError(msg)
    return tuple(value)


@attrs.frozen(eq=False, repr=False)
class PatchSet:
    """An ordered, named collection of patches applied and reverted together."""

    name: str = attrs.field(validator=_check_name)
    patches: tuple[Patch, ...] = attrs.field(converter=_to_patches)
    doc: str = ""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.doc, str):
            msg = f"PatchSet {self.name!r}: doc must be a string, got {self.doc!r}; give a string or leave it out."
            raise PatchDefinitionError(msg)
        seen: set[str] = set()
        for patch in self.patches:
            if not isinstance(patch, Patch):
                msg = f"PatchSet {self.name!r}: {patch!r} is not a Patch; build each entry with Patch(...)."
                raise PatchDefinitionError(msg, patch=patch)
            if patch.name in seen:
                msg = f"PatchSet {self.name!r}: two patches are named {patch.name!r}; give each patch a unique name."
                raise PatchDefinitionError(msg, patch=patch, target=patch.target)
            seen.add(patch.name)

    def __add__(self, other: PatchSet | Patch) -> PatchSet:
        if isinstance(other, Patch):
            return PatchSet(self.name, (*self.patches, other), self.doc)
        if not isinstance(other, PatchSet):
            return NotImplemented
        return PatchSet(f"{self.name}+{other.name}", (*self.patches, *other.patches))

    def without(self, *names: str) -> PatchSet:
        """The same set less the named patches (unknown names are an error)."""
        unknown = set(names) - {p.name for p in self.patches}
        if unknown:
            msg = f"PatchSet {self.name!r} has no patch named {sorted(unknown)!r}; it has {self.names!r}."
            raise PatchDefinitionError(msg)
        return PatchSet(self.name, (p for p in self.patches if p.name not in names), self.doc)

    @property
    def names(self) -> tuple[str, ...]:
        """The patch names, in order."""
        return tuple(p.name for p in self.patches)

    def __iter__(self) -> Iterator[Patch]:
        return iter(self.patches)

    def __len__(self) -> int:
        return len(self.patches)

    def __getitem__(self, name: str) -> Patch:
        for patch in self.patches:
            if patch.name == name:
                return patch
        msg = f"PatchSet {self.name!r} has no patch named {name!r}; it has {self.names!r}."
        raise KeyError(msg)

    def __repr__(self) -> str:
        return f"PatchSet({self.name!r}, {list(self.names)!r})"


@attrs.frozen
class Installed:
    """A copy of one active install: which patch, on what, how many users, since when.

    ``holder`` names an instance by its path from the object the installing apply was given
    (``model``, ``model.mtp.layers[0]``, ``chunks[1].module``), a class or module by its dotted name;
    ``address`` tells two holders apart (``Type@0x7f...`` for an instance, the dotted name otherwise).
    """

    patch: str
    target: str
    holder: str
    attr: str
    kind: str
    count: int
    since: float
    state: str = "active"
    address: str = ""
    item: bool = False  # on a key of a mapping (an item patch, or a delete patch with a key)

    @property
    def where(self) -> str:
        """``holder.attr``, or ``mapping['key']`` for a mapping item."""
        item = self.item or self.kind == "item"
        return f"{self.holder}[{self.attr!r}]" if item else f"{self.holder}.{self.attr}"


#: What an apply, a revert or a block takes: one patch, a set, or patches.
Target = Patch | PatchSet | Iterable[Patch]


def patches_of(target: object) -> tuple[str, tuple[Patch, ...]]:
    """``(name, patches)`` of a Patch, a PatchSet or an iterable of Patch records (read once)."""
    if isinstance(target, Patch):
        return target.name, (target,)
    if isinstance(target, PatchSet):
        return target.name, target.patches
    if isinstance(target, Iterable) and not isinstance(target, (str, bytes)):
        items = tuple(target)  # a generator too (read once)
        if all(isinstance(p, Patch) for p in items):
            return "patches", PatchSet("patches", items).patches  # the same checks as a set (unique names)
    msg = f"Expected a Patch or a PatchSet, got {target!r}; build one with Patch(...) or PatchSet(name, patches)."
    raise PatchDefinitionError(msg)


def named_paths(pred: Any) -> list[str]:
    """The import paths named by ``has()`` and ``accepts()`` parts of a predicate (duck-typed walk: a user's own
    predicate with ``path`` and ``parts`` / ``part`` counts too)."""
    path = getattr(pred, "path", None)
    found = [path] if isinstance(path, str) else []
    for part in (*getattr(pred, "parts", ()), getattr(pred, "part", None)):
        if part is not None:
            found += named_paths(part)
    return found


def named_modules(patch: Patch) -> list[str]:
    """The modules a patch names: its target's (an import path) and those of the paths its predicate names."""
    modules = [patch.where.module] if isinstance(patch.where, ImportPath) else []
    return modules + [path.partition(":")[0] for path in named_paths(patch.when)]
