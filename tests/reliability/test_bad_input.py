"""Bad input, table-driven: each malformed input raises a PatchError naming it and the remedy, and changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

import patchreg
from patchreg import Patch as P
from patchreg import (
    PatchDefinitionError,
    PatchError,
    PredicateError,
    Registry,
    Selector,
    TargetNotFoundError,
    UnpatchableTargetError,
    accepts,
    always,
    check,
    has,
    requires,
)
from patchreg import PatchSet as S
from tests.reliability import targets
from tests.reliability.helpers import Figures, raising

T = "tests.reliability.targets"


def f(*args: Any, **kwargs: Any) -> int:
    """A valid replacement."""
    return 1


def w(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """A valid wrapper."""
    return wrapped(*args, **kwargs)


class Case(NamedTuple):
    """One malformed input: how to feed it, what it raises, what the message must name, and its remedy."""

    id: str
    call: Callable[[Registry, targets.Leaf], object]
    error: type[PatchError]
    names: str
    remedy: str


D, U, N = PatchDefinitionError, UnpatchableTargetError, TargetNotFoundError

CASES = [
    # target strings: import paths
    Case(
        "import-path-empty-after-colon", lambda r, o: P("p", f"{T}:", f), D, f"'{T}:'", "package.module:Qualname.attr"
    ),
    Case("import-path-no-module", lambda r, o: P("p", ":attr", f), D, "':attr'", "package.module:Qualname.attr"),
    Case("import-path-two-colons", lambda r, o: P("p", "a:b:c", f), D, "'a:b:c'", "one colon"),
    Case("import-path-space", lambda r, o: P("p", "pkg mod:attr", f), D, "'pkg mod:attr'", "dotted identifiers"),
    Case(
        "import-path-empty-part",
        lambda r, o: P("p", f"{T}:Child..method", f),
        D,
        "Child..method'",
        "dotted identifiers",
    ),
    Case("import-path-leading-digit", lambda r, o: P("p", "1pkg:attr", f), D, "'1pkg:attr'", "dotted identifiers"),
    Case("target-int", lambda r, o: P("p", 42, f), D, "got 42", "'pkg.mod:Cls.attr'"),  # type: ignore[arg-type]
    Case("target-none", lambda r, o: P("p", None, f), D, "got None", "'pkg.mod:Cls.attr'"),  # type: ignore[arg-type]
    # target strings: selectors
    Case("selector-empty", lambda r, o: P("p", "", f), D, "''", "attribute names joined by dots"),
    Case(
        "selector-ends-with-index", lambda r, o: P("p", "layers[*]", f), D, "'layers[*]'", "must end with the attribute"
    ),
    Case("selector-bad-index", lambda r, o: P("p", "layers[x].fw", f), D, "'layers[x]'", "[*] or [n]"),
    Case("selector-double-dot", lambda r, o: P("p", "a..b", f), D, "'a..b'", "identifier optionally followed"),
    Case("selector-open-bracket", lambda r, o: P("p", "a.b[", f), D, "'b['", "[*] or [n]"),
    Case("selector-whitespace", lambda r, o: P("p", " fw", f), D, "' fw'", "identifier optionally followed"),
    Case("selector-bad-unwrap", lambda r, o: Selector("fw", unwrap=("not an id",)), D, "'not an id'", "identifiers"),
    # names
    Case("patch-name-empty", lambda r, o: P("", "fw", f), D, "name ''", "starting with a letter"),
    Case("patch-name-space", lambda r, o: P("has space", "fw", f), D, "'has space'", "starting with a letter"),
    Case("patch-name-int", lambda r, o: P(3, "fw", f), D, "name 3", "use a non-empty name"),  # type: ignore[arg-type]
    Case("set-name-leading-digit", lambda r, o: S("1bad", []), D, "'1bad'", "starting with a letter"),
    # replacements and kinds
    Case("replacement-none", lambda r, o: P("p", "fw", None), D, "replacement None", "give a function"),  # type: ignore[arg-type]
    Case("replacement-int", lambda r, o: P("p", "fw", 42), D, "replacement 42", "give a function"),  # type: ignore[arg-type]
    Case("wrapper-wrong-arity", lambda r, o: P("p", "fw", lambda x: x, kind="wrap"), D, "<lambda>", "kind='replace'"),
    Case("wrapper-not-callable", lambda r, o: P("p", "fw", 42, kind="wrap"), D, "got 42", "(wrapped, instance"),  # type: ignore[arg-type]
    Case(
        "kind-unknown",
        lambda r, o: P("p", "fw", f, kind="bogus"),
        D,
        "'bogus'",
        "use 'replace', 'wrap', 'value', 'item', 'delete' or 'dict'",
    ),  # type: ignore[arg-type]
    Case("delete-with-value", lambda r, o: P("p", "fw", 1, kind="delete"), D, "'fw'", "pass None"),
    Case("dict-not-a-mapping", lambda r, o: P("p", "os:environ", "x", kind="dict"), D, "'x'", "give a dict"),
    Case("prepend-on-a-value", lambda r, o: P("p", "fw", "x", kind="value", prepend=":"), D, "':'", "kind='item'"),
    Case("doc-not-string", lambda r, o: P("p", "fw", f, doc=3), D, "got 3", "must be a string"),  # type: ignore[arg-type]
    # predicates and version specifiers
    Case("when-string", lambda r, o: P("p", "fw", f, when="always"), D, "when='always'", "use requires()"),  # type: ignore[arg-type]
    Case("when-bool", lambda r, o: P("p", "fw", f, when=True), D, "when=True", "use requires()"),  # type: ignore[arg-type]
    Case("requires-no-name", lambda r, o: requires(">=1.0"), D, "'>=1.0'", "as pip does"),
    Case("requires-bad-operator", lambda r, o: requires("torch>>1"), D, "'torch>>1'", "as pip does"),
    Case("requires-bad-version", lambda r, o: requires("torch>=abc"), D, "'torch>=abc'", "as pip does"),
    Case(
        "requires-extras", lambda r, o: requires("torch[cuda]>=2"), D, "'torch[cuda]>=2'", "a name and a version range"
    ),
    Case("requires-marker", lambda r, o: requires("torch>=2; python_version>'3'"), D, "python_version", "a name and a"),
    Case("requires-not-string", lambda r, o: requires(3), D, "not 3", "such as 'megatron-core>=0.14'"),  # type: ignore[arg-type]
    Case("accepts-no-params", lambda r, o: accepts(f"{T}:module_func"), D, "module_func", "one or more parameter"),
    Case("accepts-bad-param", lambda r, o: accepts(f"{T}:module_func", "1x"), D, "'1x'", "as identifiers"),
    Case("has-no-colon", lambda r, o: has("nocolon"), D, "'nocolon'", "package.module:Qualname.attr"),
    Case("check-not-callable", lambda r, o: check(42, "x"), D, "got 42", "needs a callable"),  # type: ignore[arg-type]
    Case("check-no-description", lambda r, o: check(f, ""), D, "description", "non-empty description"),
    Case("predicate-and-string", lambda r, o: always & "x", D, "'x'", "use requires()"),  # type: ignore[operator]
    Case("predicate-or-bool", lambda r, o: always | True, D, "True", "use requires()"),  # type: ignore[operator]
    Case(
        "predicate-raises",
        lambda r, o: r.apply(P("p", "forward", f, when=check(raising(ZeroDivisionError("z")), "boom")), o),
        PredicateError,
        "check('boom')",
        "fix the predicate",
    ),
    # compositions
    Case("set-duplicate-names", lambda r, o: S("s", [P("a", "fw", f), P("a", "bw", f)]), D, "'a'", "unique name"),
    Case(
        "set-sum-duplicate-names",
        lambda r, o: S("s", [P("a", "fw", f)]) + S("t", [P("a", "bw", f)]),
        D,
        "'a'",
        "unique",
    ),
    Case("set-non-patch-entry", lambda r, o: S("s", [P("a", "fw", f), "b"]), D, "'b'", "build each entry with Patch"),  # type: ignore[list-item]
    Case("set-from-string", lambda r, o: S("s", "abc"), D, "'abc'", "iterable of Patch records"),  # type: ignore[arg-type]
    Case("set-without-unknown", lambda r, o: S("s", [P("a", "fw", f)]).without("zz"), D, "'zz'", "it has ('a',)"),
    Case(
        "list-duplicate-names",
        lambda r, o: r.apply([P("a", "forward", f), P("a", "backward", f)], o),
        D,
        "'a'",
        "unique name",
    ),
    # applying to the wrong thing
    Case("apply-none", lambda r, o: r.apply(None), D, "got None", "build one with Patch"),  # type: ignore[arg-type]
    Case("apply-string", lambda r, o: r.apply(f"{T}:module_func"), D, f"'{T}:module_func'", "build one with Patch"),  # type: ignore[arg-type]
    Case("patched-none", lambda r, o: r.patched(None), D, "got None", "build one with Patch"),  # type: ignore[arg-type]
    Case("revert-none", lambda r, o: r.revert(None), D, "got None", "build one with Patch"),  # type: ignore[arg-type]
    Case(
        "selector-on-none", lambda r, o: r.apply(P("p", "forward", f), None), U, "'forward'", "pass the model as obj="
    ),
    Case("selector-on-none-chunk", lambda r, o: r.apply(P("p", "forward", f), [o, None]), U, "got None", "obj="),
    Case(
        "selector-on-class",
        lambda r, o: r.apply(P("p", "forward", f), targets.Leaf),
        U,
        "'Leaf'",
        "import path such as",
    ),
    Case("selector-on-module", lambda r, o: r.apply(P("p", "forward", f), targets), U, f"'{T}'", "use an import path"),
    Case(
        "import-path-to-instance", lambda r, o: r.apply(P("p", f"{T}:LEAF.forward", f)), U, "LEAF.forward", "selector"
    ),
    # unpatchable targets
    Case("builtin-slot-int-add", lambda r, o: r.apply(P("p", "builtins:int.__add__", f)), U, "int.__add__", "subclass"),
    Case(
        "builtin-object-repr",
        lambda r, o: r.apply(P("p", "builtins:object.__repr__", f)),
        U,
        "object.__repr__",
        "subclass",
    ),
    Case("builtin-instance-attr", lambda r, o: r.apply(P("p", "real", f), 5), U, "'real'", "no __dict__"),
    Case("slotted-instance", lambda r, o: r.apply(P("p", "method", f), targets.Slotted()), U, "Slotted", "import path"),
    Case(
        "no-weakref-instance",
        lambda r, o: r.apply(P("p", "method", f), targets.SlottedNoWeakref()),
        U,
        "Slotted",
        "__weakref__",
    ),
    Case(
        "property-on-instance",
        lambda r, o: r.apply(P("p", "prop", f), targets.Child()),
        U,
        "'prop'",
        f"'{T}:Child.prop'",
    ),
    Case(
        "wrap-property",
        lambda r, o: r.apply(P("p", f"{T}:Child.prop", w, kind="wrap")),
        U,
        "Child.prop",
        "kind='replace'",
    ),
    Case(
        "wrap-constant", lambda r, o: r.apply(P("p", f"{T}:CONSTANT", w, kind="wrap")), U, "CONSTANT", "kind='replace'"
    ),
    Case("type-dunder-dict", lambda r, o: r.apply(P("p", f"{T}:Child.__dict__", f)), U, "__dict__", "Patch the code"),
    # strict mode misses
    Case(
        "strict-missing-attr",
        lambda r, o: r.apply(P("p", f"{T}:Child.nope", f), strict=True),
        N,
        "Child.nope",
        "strict",
    ),
    Case(
        "strict-missing-module",
        lambda r, o: r.apply(P("p", "no_such_mod_xyz:f", f), strict=True),
        N,
        "no_such_mod",
        "strict",
    ),
    Case("strict-index-non-sequence", lambda r, o: r.apply(P("p", "tag[0].x", f), o, strict=True), N, "tag", "strict"),
]


def test_at_least_thirty_cases(figures: Figures) -> None:
    """The table covers at least 30 malformed inputs, each with a unique id."""
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) >= 30
    figures.add("bad_input.cases", len(ids))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(patch_registry: Registry, pristine: Callable[[], None], case: Case) -> None:
    """The input raises its PatchError subclass, the message names it and the remedy, and nothing changed."""
    leaf = targets.Leaf()
    before = dict(vars(leaf))
    with pytest.raises(case.error) as info:
        case.call(patch_registry, leaf)
    message = str(info.value)
    assert case.names in message, f"message does not name the input {case.names!r}: {message}"
    assert case.remedy in message, f"message gives no remedy ({case.remedy!r}): {message}"
    assert message.endswith("."), f"not a whole sentence: {message}"
    assert patch_registry.active() == ()
    assert patchreg.registry.active() == ()
    assert vars(leaf) == before
    pristine()
