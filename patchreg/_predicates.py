"""When a patch applies: predicates on installed versions, signatures and attributes.

Every predicate evaluates to an :class:`Answer` (a bool and a reason), is hashable,
composes with ``&``, ``|`` and ``~``, and is evaluated once per process: the answer
is cached until :func:`refresh` is called.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from patchreg._targets import ImportPath, parse_import_path
from patchreg.exceptions import PatchDefinitionError, PatchError, PredicateError

__all__ = [
    "Answer",
    "Predicate",
    "accepts",
    "always",
    "check",
    "distributions",
    "has",
    "not_needed_when",
    "refresh",
    "requires",
]

_CACHE: dict[Predicate, Answer] = {}
_ON_REFRESH: list[Callable[[], None]] = []


@attrs.frozen
class Answer:
    """The outcome of a predicate: ``ok`` and a one-sentence ``reason``; unpacks as a pair.

    ``needed`` is False when the patch is skipped because it is not needed here (see
    :func:`not_needed_when`), as opposed to something it needs being missing.
    """

    ok: bool
    reason: str
    needed: bool = True

    def __bool__(self) -> bool:
        return self.ok

    def __iter__(self) -> Iterator[Any]:
        return iter((self.ok, self.reason))


def refresh() -> None:
    """Forget every cached predicate answer and importlib's caches (after installs or upgrades)."""
    _CACHE.clear()
    importlib.invalidate_caches()
    for hook in _ON_REFRESH:
        hook()


def on_refresh(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever :func:`refresh` runs (engine caches register here)."""
    _ON_REFRESH.append(hook)


class Predicate:
    """Base class: subclasses implement ``_evaluate()`` and ``describe()``."""

    __slots__ = ()

    def evaluate(self) -> Answer:
        """Return the cached answer, computing it on first use."""
        try:
            return _CACHE[self]
        except KeyError:
            pass
        try:
            answer = self._evaluate()
        except PatchError:
            raise
        except Exception as exc:
            msg = (
                f"Predicate {self.describe()} raised {exc!r}; fix the predicate or make it return False with a reason."
            )
            raise PredicateError(msg) from exc
        _CACHE[self] = answer
        return answer

    def _evaluate(self) -> Answer:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def __and__(self, other: Predicate) -> Predicate:
        return _All((self, _as_predicate(other)))

    def __or__(self, other: Predicate) -> Predicate:
        return _Any((self, _as_predicate(other)))

    def __invert__(self) -> Predicate:
        return _Not(self)

    def __bool__(self) -> bool:
        msg = (
            f"Predicate {self.describe()!r} has no truth value of its own; "
            "call .evaluate() for an Answer, and combine predicates with &, | and ~ (not and/or/not)."
        )
        raise TypeError(msg)

    def __str__(self) -> str:
        return self.describe()


def _as_predicate(value: object) -> Predicate:
    if isinstance(value, Predicate):
        return value
    msg = f"Cannot combine a predicate with {value!r}; use requires(), accepts(), has(), check() or always."
    raise PatchDefinitionError(msg)


@attrs.frozen(repr=False)
class _Always(Predicate):
    def _evaluate(self) -> Answer:
        return Answer(True, "always applies")

    def describe(self) -> str:
        return "always"

    def __repr__(self) -> str:
        return "always"


always: Predicate = _Always()


@attrs.frozen(cache_hash=True)
class _All(Predicate):
    parts: tuple[Predicate, ...]

    def _evaluate(self) -> Answer:
        reasons = []
        for part in self.parts:
            answer = part.evaluate()
            if not answer.ok:
                return answer
            reasons.append(answer.reason)
        return Answer(True, "; ".join(reasons))

    def describe(self) -> str:
        return " & ".join(_wrap(p, _Any) for p in self.parts)

    def __and__(self, other: Predicate) -> Predicate:
        return _All((*self.parts, _as_predicate(other)))


@attrs.frozen(cache_hash=True)
class _Any(Predicate):
    parts: tuple[Predicate, ...]

    def _evaluate(self) -> Answer:
        reasons: list[Answer] = []
        for part in self.parts:
            answer = part.evaluate()
            if answer.ok:
                return answer
            reasons.append(answer)
        return Answer(False, "; ".join(a.reason for a in reasons), needed=all(a.needed for a in reasons))

    def describe(self) -> str:
        return " | ".join(_wrap(p, _All) for p in self.parts)

    def __or__(self, other: Predicate) -> Predicate:
        return _Any((*self.parts, _as_predicate(other)))


@attrs.frozen(cache_hash=True)
class _Not(Predicate):
    part: Predicate

    def _evaluate(self) -> Answer:
        ok, reason = self.part.evaluate()
        return Answer(not ok, f"not ({reason})")

    def describe(self) -> str:
        return f"~{_wrap(self.part, (_All, _Any))}"


def _wrap(pred: Predicate, kinds: type | tuple[type, ...]) -> str:
    text = pred.describe()
    return f"({text})" if isinstance(pred, kinds) else text


@attrs.frozen(cache_hash=True)
class _Requires(Predicate):
    requirement: str
    _parsed: Requirement = attrs.field(eq=False, repr=False)

    def _evaluate(self) -> Answer:
        name = self._parsed.name
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return Answer(False, f"{name} is not installed")
        try:
            version = Version(found)
        except InvalidVersion:
            return Answer(False, f"{name} {found} is not a valid version")
        spec = self._parsed.specifier
        if spec.prereleases:
            judged, note = version, ""
        else:
            judged = Version(version.base_version)
            note = f" (judged as {judged})" if str(judged) != found else ""
        if spec.contains(judged, prereleases=True):
            return Answer(True, f"{name} {found}{note} satisfies {spec or 'any version'}")
        return Answer(False, f"{name} {found}{note} does not satisfy {spec}")

    def describe(self) -> str:
        return f"requires({self.requirement!r})"


def requires(requirement: str) -> Predicate:
    """True when the installed distribution satisfies ``requirement`` (e.g. ``"vllm>=0.29"``).

    Pre-, dev- and local releases are judged by their base release (``0.16.0rc0.dev12``
    counts as ``0.16.0``) unless the specifier itself names a pre-release.
    """
    if not isinstance(requirement, str):
        msg = f"requires() takes a requirement string such as 'megatron-core>=0.14', not {requirement!r}."
        raise PatchDefinitionError(msg)
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        msg = (
            f"Invalid version specifier {requirement!r} in requires(): {str(exc).splitlines()[0]}. "
            "Write it as pip does, e.g. 'megatron-core>=0.14,<0.20'."
        )
        raise PatchDefinitionError(msg) from None
    if parsed.url or parsed.extras or parsed.marker:
        msg = f"requires({requirement!r}) takes a name and a version range only, without extras, URL or marker."
        raise PatchDefinitionError(msg)
    return _Requires(requirement, parsed)


def distributions(pred: Predicate) -> frozenset[str]:
    """The distribution names a predicate's ``requires()`` parts mention, normalized (for fingerprints, doctor)."""
    if isinstance(pred, _Requires):
        return frozenset({canonicalize_name(pred._parsed.name)})
    if isinstance(pred, (_All, _Any)):
        return frozenset().union(*(distributions(p) for p in pred.parts))
    if isinstance(pred, _Not):
        return distributions(pred.part)
    return frozenset()


@attrs.frozen(cache_hash=True)
class _Has(Predicate):
    path: str
    _parsed: ImportPath = attrs.field(eq=False, repr=False)

    def _evaluate(self) -> Answer:
        found, _value, reason = self._parsed.raw()
        return Answer(found, reason)

    def describe(self) -> str:
        return f"has({self.path!r})"


def has(path: str) -> Predicate:
    """True when ``"pkg.mod:Qual.attr"`` can be imported and exists."""
    return _Has(path, parse_import_path(path, field="has()"))


@attrs.frozen(cache_hash=True)
class _Accepts(Predicate):
    path: str
    params: tuple[str, ...]
    var_keyword: bool
    _parsed: ImportPath = attrs.field(eq=False, repr=False)

    def _evaluate(self) -> Answer:
        found, value, reason = self._parsed.raw()
        if not found:
            return Answer(False, reason)
        func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError) as exc:
            return Answer(False, f"{self.path} has no readable signature ({exc})")
        named = {
            p.name
            for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY)
        }
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        missing = [p for p in self.params if p not in named]
        if not missing:
            return Answer(True, f"{self.path} accepts {', '.join(self.params)}")
        if self.var_keyword and takes_kwargs:
            return Answer(True, f"{self.path} accepts {', '.join(missing)} through **kwargs")
        return Answer(False, f"{self.path} does not accept {', '.join(missing)}")

    def describe(self) -> str:
        args = ", ".join(repr(a) for a in (self.path, *self.params))
        return f"accepts({args})"


def accepts(path: str, *params: str, var_keyword: bool = False) -> Predicate:
    """True when the callable at ``path`` takes every named parameter.

    Parameters only reachable through ``**kwargs`` count when ``var_keyword=True``.
    """
    if not params or not all(isinstance(p, str) and p.isidentifier() for p in params):
        msg = f"accepts({path!r}, ...) needs one or more parameter names as identifiers, got {params!r}."
        raise PatchDefinitionError(msg)
    return _Accepts(path, tuple(params), var_keyword, parse_import_path(path, field="accepts()"))


@attrs.frozen(cache_hash=True)
class _NotNeeded(Predicate):
    part: Predicate

    def _evaluate(self) -> Answer:
        ok, reason = self.part.evaluate()
        if ok:
            return Answer(False, f"not needed here: {reason}", needed=False)
        return Answer(True, f"needed: {reason}")

    def describe(self) -> str:
        return f"not_needed_when({self.part.describe()})"


def not_needed_when(pred: Predicate) -> Predicate:
    """False, marked *not needed*, where ``pred`` holds (e.g. the bug a patch works around is fixed).

    A patch skipped this way is not a problem: ``python -m patchreg doctor`` counts it as fine.
    """
    return _NotNeeded(_as_predicate(pred))


@attrs.frozen(cache_hash=True)
class _Check(Predicate):
    func: Callable[[], Any]
    description: str

    def _evaluate(self) -> Answer:
        result = self.func()
        if isinstance(result, tuple) and len(result) == 2:
            return Answer(bool(result[0]), str(result[1]))
        ok = bool(result)
        return Answer(ok, f"{self.description} is {'true' if ok else 'false'}")

    def describe(self) -> str:
        return f"check({self.description!r})"


def check(func: Callable[[], Any], description: str) -> Predicate:
    """A predicate from a callable returning a bool or a ``(bool, reason)`` pair."""
    if not callable(func):
        msg = f"check() needs a callable returning a bool or (bool, reason), got {func!r}."
        raise PatchDefinitionError(msg)
    if not isinstance(description, str) or not description:
        msg = "check() needs a non-empty description naming what it tests."
        raise PatchDefinitionError(msg)
    return _Check(func, description)
