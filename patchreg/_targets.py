"""Where a patch goes: import paths (``"pkg.mod:Qual.attr"``) and selectors (``"mtp.layers[*].fwd"``).

Parsing happens once, when a :class:`~patchreg.Patch` is declared; resolution happens at
apply time and yields :class:`Site` records (a holder object and an attribute name).
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import attrs

from patchreg._sources import found_module
from patchreg.exceptions import PatchDefinitionError, UnpatchableTargetError

__all__ = [
    "NOT_INSTANCES",
    "UNSET",
    "ImportPath",
    "Selector",
    "Site",
    "Step",
    "by_values",
    "class_attr",
    "identity",
    "import_path_meant",
    "parse_import_path",
    "parse_target",
]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENT}(?:\.{_IDENT})*\Z")
_SEGMENT = re.compile(rf"({_IDENT})((?:\[(?:\*|-?[0-9]+)\])*)\Z")
_INDEX = re.compile(r"\[(\*|-?[0-9]+)\]")

#: An object's identity as an int: unique among live objects, like ``id()``, but without the
#: ``builtins.id`` audit event. In a process with an audit hook (filelock, which torch imports,
#: installs one) every ``id()`` call runs that hook: about 0.4 µs, more than a whole install.
identity: Callable[[object], int] = object.__hash__

#: Attributes walked through, outermost first, when a selector's first name is not on the object.
DEFAULT_UNWRAP = ("module", "language_model")


class Site(NamedTuple):
    """One attribute on one holder: where an install happens."""

    holder: Any
    attr: str


@attrs.frozen
class Miss:
    """A target that resolved to nothing, with the reason."""

    reason: str


@attrs.frozen
class ImportPath:
    """``"pkg.mod:Qual.attr"``: a module or class attribute reached by import."""

    module: str
    parts: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.module}:{'.'.join(self.parts)}"

    def qualname(self, upto: str | None = None) -> str:
        """The dotted name after the colon, optionally cut after the part ``upto``."""
        if upto is None:
            return ".".join(self.parts)
        return ".".join(self.parts[: self.parts.index(upto) + 1])

    def locate(self) -> Any:
        """Import the module and walk to the object holding the attribute; a Miss says why not."""
        module = sys.modules.get(self.module)
        if module is None:
            try:
                module = importlib.import_module(self.module)
            except Exception as exc:  # an import of a library may raise anything
                return Miss(f"cannot import {self.module}: {exc.__class__.__name__}: {exc}")
        holder: Any = module
        for part in self.parts[:-1]:
            try:
                holder = getattr(holder, part)
            except AttributeError:
                return Miss(f"{self.module} has no {self.qualname(upto=part)!r}")
            except Exception as exc:  # a property or __getattr__ of a library may raise anything
                return Miss(f"{self.module}:{self.qualname(upto=part)} raised {exc.__class__.__name__}: {exc}")
        return holder

    def raw(self) -> tuple[bool, Any, str]:
        """``(found, value, reason)``: the attribute as stored, from ``vars`` along the MRO.

        An attribute that is not stored in any of those namespaces but that ``getattr`` finds
        (a module-level ``__getattr__``, a metaclass or instance ``__getattr__``) exists too:
        ``value`` is then what ``getattr`` returns.
        """
        holder = self.locate()
        if isinstance(holder, Miss):
            return False, None, holder.reason
        attr = self.parts[-1]
        for ns in namespaces(holder):
            if attr in ns:
                return True, ns[attr], f"{self} exists"
        try:
            value = getattr(holder, attr)
        except AttributeError:
            return False, None, f"{self} does not exist"
        except Exception as exc:  # a library's __getattr__ may raise anything
            return False, None, f"{self} raised {exc.__class__.__name__}: {exc}"
        return True, value, f"{self} exists (served by __getattr__, not stored)"

    def resolve(self, obj: Any = None, *, create: bool = False) -> list[Site] | Miss:
        """Import the module and walk to the holder; ``obj`` is ignored (import paths are global).

        ``create``: an attribute the holder does not store is a site too (an install creates it).
        """
        holder = self.locate()
        if isinstance(holder, Miss):
            return holder
        if not isinstance(holder, (type, types.ModuleType)):
            msg = (
                f"Import path {str(self)!r} leads to {holder!r}, which is neither a module nor a class; "
                "import paths patch modules and classes. To patch one object, pass it as obj= and use a selector."
            )
            raise UnpatchableTargetError(msg, target=str(self))
        attr = self.parts[-1]
        if not create and not any(attr in ns for ns in namespaces(holder)):
            return Miss(self._not_stored(holder, attr))
        return [Site(holder, attr)]

    def _not_stored(self, holder: Any, attr: str) -> str:
        """Why an attribute missing from ``holder``'s namespaces cannot be patched: absent, or served lazily."""
        try:
            value = getattr(holder, attr)
        except Exception:  # AttributeError: absent; anything else: not there to patch either
            return f"{self} does not exist"
        where = f"module {holder.__name__}" if isinstance(holder, types.ModuleType) else f"class {holder.__qualname__}"
        served = "its module-level __getattr__" if isinstance(holder, types.ModuleType) else "its metaclass"
        defined = _defined_at(value)
        hint = (
            f"; patch it where it is defined, e.g. '{defined}'"
            if defined is not None
            else "; patch the code that uses it, or the object that serves it"
        )
        return (
            f"{self} exists but is not stored in {where} (it is served by {served}, e.g. a lazy attribute), "
            f"so patchreg cannot install and restore it exactly{hint}"
        )


def _defined_at(value: Any) -> str | None:
    """``"module:qualname"`` where ``value`` is stored under its own name, when that is a valid import path.

    None for what has no such place: a lambda or a function defined inside another (``<locals>``), a
    plain value (an int, an instance), or a name that no longer holds it there.
    """
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not _DOTTED.match(qualname):
        return None
    holder: Any = sys.modules.get(module)
    for part in qualname.split("."):
        holder = vars(holder).get(part, UNSET) if isinstance(getattr(holder, "__dict__", None), Mapping) else UNSET
        if holder is UNSET:
            return None
    return f"{module}:{qualname}" if holder is value else None


def namespaces(holder: Any) -> list[Mapping[str, Any]]:
    """The namespaces an attribute of ``holder`` is read from.

    ``vars`` along the MRO for a class; for a module, ``vars``; for any other object, its own
    ``vars`` (when it has a ``__dict__``) and then ``vars`` along its class's MRO.
    """
    if isinstance(holder, type):
        return [vars(k) for k in holder.__mro__]
    own = [vars(holder)] if isinstance(getattr(holder, "__dict__", None), Mapping) else []
    if isinstance(holder, types.ModuleType):
        return own
    return [*own, *(vars(k) for k in type(holder).__mro__)]


def parse_import_path(text: object, *, field: str = "target") -> ImportPath:
    """Parse ``"pkg.mod:Qual.attr"``; raise :class:`PatchDefinitionError` naming ``field``."""
    if isinstance(text, str) and text.count(":") == 1:
        module, _, qual = text.partition(":")
        if _DOTTED.match(module) and _DOTTED.match(qual):
            return ImportPath(module, tuple(qual.split(".")))
    msg = (
        f"Malformed {field} {text!r}: an import path is 'package.module:Qualname.attr' "
        "(dotted identifiers, one colon, at least one name after it)."
    )
    raise PatchDefinitionError(msg, target=text)


def _unwrap_names(value: str | Iterable[str]) -> tuple[str, ...]:
    """A Selector's ``unwrap``: a single name (``"module"``) or an iterable of names, as a tuple."""
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        msg = f"Selector unwrap takes an attribute name or a tuple of names, got {value!r}."
        raise PatchDefinitionError(msg) from None


@attrs.frozen
class Step:
    name: str
    indices: tuple[str, ...]  # "*" or an integer, as text


@attrs.frozen
class Selector:
    """A path resolved against an object at apply time: ``"mtp.layers[*]._get_embeddings"``.

    The first name is looked up on the object, then through ``unwrap`` attributes
    (``.module`` chains, ``.language_model``) until found; ``unwrap`` takes a tuple of
    names or one name (``unwrap="module"`` is ``unwrap=("module",)``). ``[*]`` fans out over a
    sequence, ``nn.ModuleList`` or mapping values; ``[n]`` picks one element. A list or
    tuple passed as the object is treated as model chunks, each resolved on its own.
    """

    path: str
    unwrap: tuple[str, ...] = attrs.field(default=DEFAULT_UNWRAP, converter=_unwrap_names)
    _steps: tuple[Step, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_steps", _parse_steps(self.path))
        if not all(isinstance(u, str) and u.isidentifier() for u in self.unwrap):
            msg = f"Selector unwrap names must be identifiers, got {self.unwrap!r}."
            raise PatchDefinitionError(msg, target=self.path)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The parsed path: one step per name, with its indices (what a walk, or a guard's trace, follows)."""
        return self._steps

    def __str__(self) -> str:
        return self.path

    def paths(self, obj: Any) -> dict[int, str]:
        """Where each holder the selector names on ``obj`` sits, by identity: ``model.mtp.layers[0]``.

        The object passed reads ``model``; the chunks of a list or tuple read ``chunks[i]``; an unwrap
        step shows as the attribute it went through (``model.module.mtp.layers[0]``). The slow walk:
        for reports and tables only, never on the way to an install.
        """
        roots = [(c, f"chunks[{i}]") for i, c in enumerate(obj)] if isinstance(obj, (list, tuple)) else [(obj, "model")]
        found: dict[int, str] = {}
        for chunk, root in roots:
            start = _unwrap_path(chunk, self._steps[0].name, self.unwrap, root)
            if start is None and len(self._steps) == 1:  # the one name is absent (created, or deleted by a patch)
                start = (chunk, root)
            if start is None:
                continue
            holders: list[tuple[Any, str]] = [start]
            for step in self._steps[:-1]:
                holders, miss = _advance(holders, step)
                if miss is not None:
                    break
            for holder, where in holders:
                found.setdefault(identity(holder), where)
        return found

    def resolve(self, obj: Any, *, create: bool = False) -> list[Site] | Miss:
        """Every (holder, attribute) the selector names on ``obj``; a Miss says why there is none.

        ``create``: the last name need not exist on the holders the rest of the path finds (on ``obj``
        itself for a one-name selector); an install creates it.
        """
        if isinstance(obj, (list, tuple)):
            chunks = obj
            for chunk in chunks:
                _check_instance(chunk, self.path)
        else:
            _check_instance(obj, self.path)
            chunks = (obj,)
        sites: list[Site] = []
        for chunk in chunks:
            found = self._fast(chunk) or (self._created(chunk) if create else None)
            if found:
                sites.extend(found)
        if sites:
            return sites
        reasons = [self._explain(chunk) for chunk in chunks]
        if len(set(reasons)) == 1:
            return Miss(reasons[0])
        return Miss("; ".join(f"chunk {i}: {r}" for i, r in enumerate(reasons)))

    def _fast(self, obj: Any) -> list[Site] | None:
        """The sites on one chunk, or None on any miss (``_explain`` then says why)."""
        steps = self._steps
        found = _unwrap_get(obj, steps[0].name, self.unwrap)
        if found is None:
            return None
        start, value = found  # the first name's value: looked up once, not again below
        holders = [start]
        for step in steps[:-1]:
            nxt = []
            for holder in holders:
                if value is UNSET:
                    value = getattr(holder, step.name, None)
                if value is None:
                    return None
                items = [value]
                value = UNSET
                for index in step.indices:
                    items = _select(items, index)
                    if not items:
                        return None
                nxt.extend(items)
            holders = nxt
        attr = steps[-1].name
        for holder in holders:
            if isinstance(holder, NOT_INSTANCES):
                _check_instance(holder, self.path)
            if value is UNSET and not _has_attr(holder, attr):
                return None
        return [Site(holder, attr) for holder in holders]

    def _created(self, obj: Any) -> list[Site] | None:
        """The sites on one chunk when the last name may be absent (``create``), or None on a miss."""
        steps = self._steps
        if len(steps) == 1:
            if steps[0].indices:
                return None
            _check_instance(obj, self.path)
            return [Site(obj, steps[0].name)]
        names = [*self.path.split(".")[:-2], steps[-2].name]  # the path to the holders, their indices below
        parent = Selector(".".join(names), self.unwrap)
        found = parent._fast(obj)
        if not found:
            return None
        holders: list[Any] = []
        for holder, name in found:
            items = [getattr(holder, name)]
            for index in steps[-2].indices:  # "layers[*].flag": the elements are the holders
                items = _select(items, index)
            holders.extend(items)
        attr = steps[-1].name
        if not holders or steps[-1].indices or any(isinstance(h, NOT_INSTANCES) for h in holders):
            return None
        return [Site(h, attr) for h in holders]

    def _explain(self, obj: Any) -> str:
        """Why the selector finds nothing on ``obj`` (the slow path, with dotted locations)."""
        first = self._steps[0].name
        start = _unwrap_to(obj, first, self.unwrap)
        if start is None:
            through = ", ".join(f".{u}" for u in self.unwrap)
            return f"{type(obj).__name__} has no attribute {first!r} (looked through {through})"
        holders: list[tuple[Any, str]] = [(start, "")]
        for step in self._steps[:-1]:
            holders, miss = _advance(holders, step)
            if miss is not None:
                return miss.reason
        last = self._steps[-1].name
        for holder, where in holders:
            if not _has_attr(holder, last):
                return f"{where or type(holder).__name__} has no attribute {last!r}"
        return "nothing matched"


def class_attr(cls: type, name: str, default: Any = None) -> Any:
    """The attribute as stored on ``cls`` or its bases (``vars`` along the MRO), or ``default``."""
    for klass in cls.__mro__:
        ns = vars(klass)
        if name in ns:
            return ns[name]
    return default


def _select(items: list[Any], index: str) -> list[Any]:
    """Apply one ``[*]``/``[n]`` to each item; empty when anything is missing or out of range."""
    out: list[Any] = []
    for value in items:
        try:
            elements = _elements(value)
        except TypeError:
            return []
        if index == "*":
            out.extend(elements)
            continue
        i = int(index)
        if not -len(elements) <= i < len(elements):
            return []
        out.append(elements[i])
    return out


def _elements(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if by_values(value):
        return list(value.values())
    return list(_iterate(value))


def by_values(value: Any) -> bool:
    """``[*]`` on ``value`` selects its values (a mapping, a ``ModuleDict``), not what iterating it yields."""
    return isinstance(value, Mapping) or _is_module_dict(value)


def _parse_steps(path: object) -> tuple[Step, ...]:
    if not isinstance(path, str) or not path or ":" in path:
        msg = f"Malformed selector {path!r}: write attribute names joined by dots, with [*] or [n] after a name."
        raise PatchDefinitionError(msg, target=path)
    steps = []
    for segment in path.split("."):
        match = _SEGMENT.match(segment)
        if match is None:
            msg = (
                f"Malformed selector {path!r} at {segment!r}: each part is an identifier optionally "
                "followed by [*] or [n], e.g. 'mtp.layers[*]._get_embeddings'."
            )
            raise PatchDefinitionError(msg, target=path)
        steps.append(Step(match.group(1), tuple(_INDEX.findall(match.group(2)))))
    if steps[-1].indices:
        msg = f"Malformed selector {path!r}: it must end with the attribute to patch, not an index."
        raise PatchDefinitionError(msg, target=path)
    return tuple(steps)


def _has_attr(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
    except AttributeError:
        return False
    return True


UNSET: Any = object()


def _unwrap_get(obj: Any, name: str, unwrap: tuple[str, ...]) -> tuple[Any, Any] | None:
    """``(holder, value)``: the object that has ``name`` (as :func:`_unwrap_to` finds it) and its value."""
    value = getattr(obj, name, UNSET)
    if value is not UNSET:
        return obj, value
    start = _unwrap_to(obj, name, unwrap)
    return None if start is None else (start, getattr(start, name, None))


def _unwrap_to(obj: Any, name: str, unwrap: tuple[str, ...]) -> Any:
    """The first object, walking ``unwrap`` attributes breadth first, that has ``name``."""
    if _has_attr(obj, name):
        return obj
    found = _unwrap_path(obj, name, unwrap, "")
    return None if found is None else found[0]


def _unwrap_path(obj: Any, name: str, unwrap: tuple[str, ...], where: str) -> tuple[Any, str] | None:
    """:func:`_unwrap_to`'s object and its path: ``where`` followed by the unwrap attributes walked (``.module``)."""
    queue, seen = [(obj, where)], set()
    while queue:
        current, here = queue.pop(0)
        if identity(current) in seen or current is None:
            continue
        seen.add(identity(current))
        if _has_attr(current, name):
            return current, here
        for attr in unwrap:
            inner = getattr(current, attr, None)
            if _is_module_like(inner):
                queue.append((inner, f"{here}.{attr}"))
    return None


def _is_module_like(obj: Any) -> bool:
    """An object worth looking into: has a ``__dict__`` and is not a function, class or Python module."""
    skip = (types.FunctionType, types.MethodType, types.ModuleType, type)
    return obj is not None and hasattr(obj, "__dict__") and not isinstance(obj, skip)


def _advance(holders: list[tuple[Any, str]], step: Step) -> tuple[list[tuple[Any, str]], Miss | None]:
    out: list[tuple[Any, str]] = []
    for holder, where in holders:
        here = f"{where}.{step.name}" if where else step.name
        value = getattr(holder, step.name, None)
        if value is None:
            return [], Miss(f"{here} is missing or None")
        items: list[tuple[Any, str]] = [(value, here)]
        for index in step.indices:
            items, miss = _index(items, index)
            if miss is not None:
                return [], miss
        out.extend(items)
    return out, None


def _index(items: list[tuple[Any, str]], index: str) -> tuple[list[tuple[Any, str]], Miss | None]:
    out: list[tuple[Any, str]] = []
    for value, where in items:
        try:
            elements = _elements(value)
        except TypeError:
            return [], Miss(f"{where} is not a sequence, so [{index}] cannot select from it")
        if index == "*":
            out.extend((e, f"{where}[{i}]") for i, e in enumerate(elements))
            continue
        i = int(index)
        if not -len(elements) <= i < len(elements):
            return [], Miss(f"{where}[{i}] is out of range ({len(elements)} elements)")
        out.append((elements[i], f"{where}[{i}]"))
    if not out:
        return [], Miss(f"{items[0][1] if items else 'selection'} is empty")
    return out, None


def _is_module_dict(value: Any) -> bool:
    """Mapping-like (``ModuleDict``): callable ``keys`` and ``values`` on its class or in its ``__dict__``.

    The class is ``value.__class__``, which a proxy reports as the wrapped object's class. A
    ``__getattr__`` is not consulted: for ``nn.Module`` containers it would look among the
    children and raise, which cost more than the rest of a selector's resolution.
    """
    return _has_callable(value, "values") and _has_callable(value, "keys")


def _has_callable(value: Any, name: str) -> bool:
    found = getattr(value.__class__, name, None)
    if found is None:
        ns = getattr(value, "__dict__", None)
        found = ns.get(name) if isinstance(ns, dict) else None
    return callable(found)


def _iterate(value: Any) -> Iterable[Any]:
    if isinstance(value, (str, bytes)):
        raise TypeError("strings are not containers of targets")
    items: Iterable[Any] = iter(value)
    return items


NOT_INSTANCES = (type, types.ModuleType, type(None))


def _check_instance(obj: Any, path: str) -> None:
    if obj is None:
        msg = f"Selector {path!r} needs an object to resolve against, got None; pass the model as obj=."
        if meant := import_path_meant(path):
            msg = (
                f"Target {path!r} has no ':', so it is a selector, which needs an object to resolve against (got None);"
                f" {meant.partition(':')[0]!r} is a module: to patch its attribute, write the import path {meant!r}."
                " (For a selector, pass the object as obj=.)"
            )
        raise UnpatchableTargetError(msg, target=path)
    if isinstance(obj, type):
        msg = (
            f"Selector {path!r} resolves against instances, got the class {obj.__qualname__!r}; "
            f"to patch the class itself use an import path such as '{obj.__module__}:{obj.__qualname__}.attr'."
        )
        raise UnpatchableTargetError(msg, target=path)
    if isinstance(obj, types.ModuleType):
        msg = (
            f"Selector {path!r} resolves against instances, got the module {obj.__name__!r}; use an import path "
            f"such as '{obj.__name__}:{path}'."
        )
        raise UnpatchableTargetError(msg, target=path)


def import_path_meant(path: str) -> str:
    """For a dotted selector whose head is a module (``"json.dumps"``): the import path it may mean (``"json:dumps"``,
    the longest module prefix, :func:`found_module`); "" when none."""
    found = found_module(path.rpartition(".")[0]) if _DOTTED.match(path) else ""
    return f"{found}:{path[len(found) + 1 :]}" if found else ""


def parse_target(target: object) -> ImportPath | Selector:
    """Parse a Patch's ``target`` field: an import path (with a colon) or a selector."""
    if isinstance(target, Selector):
        return target
    if isinstance(target, str) and ":" in target:
        return parse_import_path(target)
    if isinstance(target, str):
        return Selector(target)
    msg = f"A patch target must be a string or a Selector, got {target!r}; e.g. 'pkg.mod:Cls.attr' or 'mtp.layers[*].forward'."
    raise PatchDefinitionError(msg, target=target)
