"""Drift detection: the upstream code a patch was verified against, and whether the installed one still is it.

A patch declares ``verified=Verified(distribution, path, bodies)``: for each release range (a
specifier such as ``"==0.13.1"`` or ``">=0.14,<0.16"``; a bare version means ``==``) the
fingerprint of the body of ``path`` (the function the patch replaces or relies on) it was
verified against. :func:`drift` compares the installed body's fingerprint with them: "verified
against this body", or "upstream body changed since verification: review" — a warning, never a
skip, so that a dev build whose body changed under an unchanged signature is caught.

The fingerprint is of the function's source, not its bytecode (which changes with every Python
minor): the syntax tree without docstrings, comments, formatting, variable contexts or Python-
version-only fields, hashed. ``python -m patchreg body module:Class.method`` prints it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import textwrap
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patchreg._versions import provider
from patchreg.exceptions import PatchDefinitionError

__all__ = [
    "Drift",
    "Verified",
    "body_fingerprint",
    "body_fingerprint_node",
    "body_fingerprint_source",
    "compare",
    "defined_at",
    "drift",
    "resolve",
    "unreadable",
]

State = Literal["verified", "changed", "unverified", "unreadable"]
_IGNORED_FIELDS = frozenset(("ctx", "type_comment", "type_params", "kind"))
_CACHE: dict[Any, str] = {}


def body_fingerprint_source(source: str) -> str:
    """The fingerprint of one function's (or class's) source text: 16 hex digits of a hash of its syntax tree."""
    tree = ast.parse(textwrap.dedent(source))
    return body_fingerprint_node(tree.body[0] if len(tree.body) == 1 else tree)  # one definition, decorators included


def body_fingerprint_node(node: ast.AST) -> str:
    """The fingerprint of a definition's syntax tree: the same whether parsed alone or within its whole file."""
    digest = hashlib.sha256("\x00".join(_walk(node)).encode("utf-8"))
    return digest.hexdigest()[:16]


def _walk(node: Any) -> Iterator[str]:
    if isinstance(node, ast.AST):
        yield type(node).__name__
        body = getattr(node, "body", None)
        for name in node._fields:
            if name in _IGNORED_FIELDS:
                continue
            value = getattr(node, name, None)
            if name == "body" and isinstance(body, list) and _has_docstring(node):
                value = body[1:]
            yield name
            yield from _walk(value)
    elif isinstance(node, list):
        yield "["
        for item in node:
            yield from _walk(item)
        yield "]"
    else:
        yield repr(node)


def _has_docstring(node: ast.AST) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) or not node.body:
        return False
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def body_fingerprint(func: Any) -> str:
    """The fingerprint of ``func``'s source (bound methods, staticmethods, decorators with ``__wrapped__`` unwrapped).

    Raises ``OSError`` / ``TypeError`` when its source cannot be read (a builtin, a function made at runtime).
    """
    func = inspect.unwrap(getattr(func, "__func__", func))
    found = _CACHE.get(func)
    if found is None:
        found = _CACHE[func] = body_fingerprint_source(inspect.getsource(func))
    return found


def resolve(path: str) -> Any:
    """The object at import path ``module:qual.name`` (imports the module)."""
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split(".") if qualname else ():
        obj = vars(obj)[part] if isinstance(obj, type) and part in vars(obj) else getattr(obj, part)
    return obj


def _specifier(text: str) -> SpecifierSet:
    try:
        Version(text)
    except InvalidVersion:
        return SpecifierSet(text)
    return SpecifierSet(f"=={text}")


def _check_bodies(instance: Verified, attribute: attrs.Attribute[Any], value: Mapping[str, str]) -> None:
    if not isinstance(value, Mapping) or not value:
        msg = f"Verified({instance.path!r}): bodies must be a non-empty mapping of release specifier to fingerprint."
        raise PatchDefinitionError(msg)
    for spec, digest in value.items():
        try:
            _specifier(spec)
        except InvalidSpecifier:
            msg = (
                f"Verified({instance.path!r}): {spec!r} is neither a version nor a specifier; write '0.13.1' or "
                "'>=0.14,<0.16'."
            )
            raise PatchDefinitionError(msg) from None
        if not isinstance(digest, str) or len(digest) != 16:
            msg = (
                f"Verified({instance.path!r}): the fingerprint for {spec!r} must be the 16 hex digits "
                f"`python -m patchreg body {instance.path}` prints, got {digest!r}."
            )
            raise PatchDefinitionError(msg)


def _check_path(instance: Verified, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or ":" not in value:
        msg = f"Verified path {value!r} must be an import path 'module:Qual.name' (the upstream function)."
        raise PatchDefinitionError(msg)


@attrs.frozen
class Verified:
    """The upstream bodies a patch was verified against: ``{release specifier: fingerprint}`` of ``path``."""

    distribution: str
    path: str = attrs.field(validator=_check_path)
    bodies: Mapping[str, str] = attrs.field(converter=dict, validator=_check_bodies)


@attrs.frozen
class Drift:
    """What :func:`drift` found: ``state`` and the sentence doctor and the report print."""

    state: State
    text: str

    @property
    def ok(self) -> bool:
        """True when the installed body is one the patch was verified against."""
        return self.state == "verified"


def _upstream(verified: Verified, patch: Any) -> Any:
    """The upstream object at ``verified.path``; where ``patch``'s own replacement is installed, what it displaced."""
    found = resolve(verified.path)
    if patch is not None and found is patch.replacement:
        module, _, qualname = verified.path.partition(":")
        parent = qualname.rpartition(".")[0]
        holder = resolve(f"{module}:{parent}") if parent else importlib.import_module(module)
        original = patch.backup.get(holder)
        found = original if original is not None else found
    return found  # a wrap's FunctionWrapper: body_fingerprint follows its __wrapped__


def drift(verified: Verified, patch: Any = None) -> Drift:
    """Compare the installed body of ``verified.path`` with the fingerprints it was verified against.

    ``patch``: the Patch declaring it, so that while it is installed on that very path the body it
    displaced is read (what a Report asks).
    """
    answers = provider(verified.distribution)  # the code imported: a source tree's version too
    version = answers.version or "not installed"
    named = verified.path.partition(":")[2]
    where = f"{named}, {verified.distribution} {answers.version_or('not installed')}"
    try:
        upstream = _upstream(verified, patch)
        found = body_fingerprint(upstream)
    except Exception as exc:  # absent, or no source to read: nothing to compare, say so
        return Drift("unreadable", unreadable(where, f"{type(exc).__name__}: {exc}"))
    defined = getattr(upstream, "__qualname__", None)
    return compare(verified, found, version, defined_at(named, defined, where) if isinstance(defined, str) else where)


def unreadable(where: str, why: str) -> str:
    """The drift sentence for a body that cannot be read at ``where``."""
    return f"cannot read the upstream body of {where} ({why}): review"


def defined_at(named: str, defined: str, where: str) -> str:
    """``where`` (``"<named>, <release>..."``), naming the class that defines the body where ``named`` inherits it."""
    if defined != named and not named.endswith(f".{defined}"):
        return f"{named}, defined as {defined}, {where.partition(', ')[2]}"
    return where


def compare(verified: Verified, found: str, version: str, where: str) -> Drift:
    """Judge fingerprint ``found`` of ``verified.path``'s body (of release ``version``, read at ``where``)."""
    same = [spec for spec, digest in verified.bodies.items() if digest == found]
    if same:
        return Drift("verified", f"verified against this body ({where}, {found}; as verified for {same[0]})")
    listed = [spec for spec in verified.bodies if _contains(spec, version)]
    if listed:
        want = verified.bodies[listed[0]]
        return Drift(
            "changed",
            f"upstream body changed since verification: review ({where} is {found}, verified {want} for {listed[0]})",
        )
    known = ", ".join(verified.bodies)
    return Drift(
        "unverified",
        f"upstream body changed since verification: review ({where} is {found}, a body never verified; "
        f"verified releases: {known})",
    )


def _contains(spec: str, version: str) -> bool:
    try:
        return _specifier(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False
