"""What is wrong with a requirement string that ``packaging`` refused (for ``requires()``'s errors).

``packaging`` answers most malformed specifiers with one generic sentence ("Expected semicolon
(after name with no version specifier) or end"); :func:`diagnose` reads the string itself and
names the part that is wrong: ``'abc' is not a version``, ``'=>' is not an operator: did you
mean '>='?``. It returns None when it finds nothing more precise to say.
"""

from __future__ import annotations

import re

from packaging.specifiers import InvalidSpecifier, Specifier
from packaging.version import InvalidVersion, Version

__all__ = ["diagnose"]

OPERATORS = ("===", "==", "!=", "<=", ">=", "~=", "<", ">")

#: Operators people type from other languages or by transposition, and the one they meant.
_MEANT = {
    "=>": ">=",
    "=<": "<=",
    "=": "==",
    "=!": "!=",
    "!": "!=",
    "<>": "!=",
    "~>": "~=",
    "=~": "~=",
    "~": "~=",
    "^": "~=",
    ">>": ">",
    "<<": "<",
    "==>": ">=",
    "==<": "<=",
    ">==": ">=",
    "<==": "<=",
}

_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_CLAUSE = re.compile(r"([<>=!~^]*)\s*(.*)", re.DOTALL)


def diagnose(requirement: str) -> str | None:
    """One sentence naming what is wrong with ``requirement``, or None if nothing precise is found."""
    if not requirement.strip():
        return "it is empty: name a distribution, e.g. 'torch>=2.4'"
    match = _NAME.match(requirement)
    if match is None:
        if requirement.lstrip()[:1] in set("<>=!~^"):
            return "it starts with an operator: put the distribution's name first, e.g. 'torch>=2.4'"
        return f"{requirement.strip()!r} does not start with a distribution name"
    rest = requirement[match.end() :].strip()
    if any(mark in rest for mark in ("[", "@", ";")):
        return None  # extras, URLs and markers: packaging's own message is precise enough
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1].strip()
    clauses = rest.split(",")
    if len(clauses) > 1 and clauses[-1].strip() == "":
        clauses.pop()  # packaging accepts one trailing comma
    for clause in clauses:
        found = _clause(clause.strip())
        if found is not None:
            return found
    return None


def _clause(clause: str) -> str | None:
    """What is wrong with one comma-separated clause such as ``>=abc``, or None."""
    if not clause:
        return "it has an empty clause between commas"
    match = _CLAUSE.fullmatch(clause)
    assert match is not None  # the pattern matches any string
    op, version = match.group(1), match.group(2).strip()
    if not op:
        return f"{clause!r} has no operator: write '=={clause}' for exactly it, or '>={clause}' for it and later"
    if op not in OPERATORS:
        meant = _MEANT.get(op)
        hint = f"did you mean {meant!r}?" if meant else f"use one of {', '.join(OPERATORS)}"
        return f"{op!r} is not an operator: {hint}"
    if not version:
        return f"{op!r} has no version after it"
    more = re.search(r"\s+([<>=!~^]+)", version)
    if more is not None:
        first, second = version[: more.start()].strip(), version[more.start() :].strip()
        return f"separate the clauses with commas: write '{op}{first},{second}'"
    return _version(op, version)


def _version(op: str, version: str) -> str | None:
    """What is wrong with ``version`` after ``op``, or None if packaging accepts the pair."""
    try:
        Specifier(f"{op}{version}")
    except InvalidSpecifier:
        pass
    else:
        return None
    bare = version[:-2] if version.endswith(".*") else version
    try:
        parsed = Version(bare)
    except InvalidVersion:
        return f"{version!r} is not a version"
    if version.endswith(".*"):
        return f"'.*' works with '==' and '!=' only, not {op!r}: write '{op}{bare}'"
    if parsed.local is not None and op not in ("==", "!="):
        return f"a local version ('+{parsed.local}') works with '==' and '!=' only, not {op!r}"
    if op == "~=" and len(parsed.release) < 2:
        return f"'~=' needs at least two release numbers: write '~={version}.0'"
    return None
