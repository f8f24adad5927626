"""Predicates: versions, signatures, attributes, composition, reasons and caching."""

from __future__ import annotations

import importlib.metadata
import logging
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from patchreg import (
    Answer,
    PatchDefinitionError,
    PredicateError,
    accepts,
    always,
    check,
    has,
    not_needed_when,
    refresh,
    requires,
)
from patchreg._predicates import Predicate, distributions
from tests.patchreg import sample

M = "tests.patchreg.sample"


@pytest.fixture
def fake_dists(tmp_path: Path) -> Iterator[Any]:
    """Install fake distributions (dist-info folders) on a temporary sys.path entry."""

    def make(name: str, version: str) -> None:
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        refresh()

    sys.path.insert(0, str(tmp_path))
    try:
        yield make
    finally:
        sys.path.remove(str(tmp_path))
        refresh()


def test_requires_on_installed_distribution() -> None:
    """requires() answers from the installed version and says which version it found."""
    version = importlib.metadata.version("attrs")
    ok = requires("attrs>=20").evaluate()
    assert ok.ok and version in ok.reason
    no = requires("attrs<1").evaluate()
    assert not no.ok and f"attrs {version} does not satisfy <1" == no.reason


def test_missing_distribution_is_false_with_reason() -> None:
    """A distribution that is not installed gives False and 'X is not installed'."""
    assert tuple(requires("no-such-dist-xyz>=1").evaluate()) == (False, "no-such-dist-xyz is not installed")


@pytest.mark.parametrize(
    ("installed", "spec", "expected"),
    [
        ("0.16.0rc0.dev123", ">=0.16,<0.17", True),
        ("0.16.0rc0.dev123", "<0.16", False),
        ("0.20.0rc1", "<0.20", False),
        ("0.19.2+local.abc", ">=0.19,<0.20", True),
        ("0.14.0", ">=0.14,<0.18", True),
        ("0.13.1", ">=0.14", False),
        ("0.16.0rc1", ">=0.16.0rc1", True),
        ("0.16.0rc0", ">=0.16.0rc1", False),
        ("0.19.2.post1", ">=0.19.2.post1", True),
        ("0.19.2.post1", "==0.19.2.post1", True),
        ("0.19.2.post1", "==0.19.2", False),
        ("0.19.2.post1", "<=0.19.2", False),
        ("0.19.2.post1", ">0.19.2", False),
        ("0.19.2.post1", ">=0.19.2,<0.20", True),
        ("0.19.2.post1.dev3", ">=0.19.2.post1", True),
        ("0.19.2.post1+local", "==0.19.2.post1", True),
        ("1!0.5", ">=1.0", True),
        ("1!0.5rc1", "<1.0", False),
    ],
)
def test_pre_dev_and_local_releases(fake_dists: Any, installed: str, spec: str, expected: bool) -> None:
    """Pre-, dev- and local releases are judged by their base release unless the spec names a pre-release;
    a post release is judged as itself (as PEP 440 orders it), and so is an epoch."""
    fake_dists("fake-mcore", installed)
    answer = requires(f"fake-mcore{spec}").evaluate()
    assert answer.ok is expected, answer.reason
    assert installed in answer.reason


@pytest.mark.parametrize(
    ("requirement", "says"),
    [
        ("torch>=abc", "'abc' is not a version."),
        ("torch=>2", "'=>' is not an operator: did you mean '>='?"),
        ("torch=<2", "'=<' is not an operator: did you mean '<='?"),
        ("torch=2", "'=' is not an operator: did you mean '=='?"),
        ("torch~>1.2", "'~>' is not an operator: did you mean '~='?"),
        ("torch>=1.0.x", "'1.0.x' is not a version."),
        ("torch>=1.0, <=abc", "'abc' is not a version."),
        ("torch (>=abc)", "'abc' is not a version."),
        ("torch>=1.*", "'.*' works with '==' and '!=' only, not '>=': write '>=1'."),
        ("torch~=1", "'~=' needs at least two release numbers: write '~=1.0'."),
        ("torch>=1.0+cpu", "a local version ('+cpu') works with '==' and '!=' only, not '>='."),
        ("torch>=1 <2", "separate the clauses with commas: write '>=1,<2'."),
        ("torch>=1,,<2", "it has an empty clause between commas."),
        ("torch ==", "'==' has no version after it."),
        ("torch 2.0", "'2.0' has no operator: write '==2.0' for exactly it, or '>=2.0' for it and later."),
        (">=2", "it starts with an operator: put the distribution's name first"),
        ("  ", "it is empty"),
    ],
)
def test_malformed_specifier_error_names_what_is_wrong(requirement: str, says: str) -> None:
    """A malformed requires() string is refused with a sentence about that string, not packaging's generic one."""
    with pytest.raises(PatchDefinitionError) as info:
        requires(requirement)
    message = str(info.value)
    assert f"Invalid version specifier {requirement!r} in requires(): {says}" in message
    assert "Expected semicolon" not in message
    assert message.endswith("Write it as pip does, e.g. 'megatron-core>=0.14,<0.20'.")


_NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,8}[a-z0-9]", fullmatch=True)
_OPS = st.sampled_from(["==", "!=", "<=", ">=", "<", ">", "~="])


@settings(max_examples=200, deadline=None)
@given(name=_NAMES, op=_OPS, bad=st.text(alphabet="abcxyz0123456789._-+", min_size=1, max_size=10))
def test_any_non_version_after_an_operator_is_named(name: str, op: str, bad: str) -> None:
    """For every name, operator and string that is not a version, the error quotes that string as not a version."""
    assume(_not_a_version(bad))
    with pytest.raises(PatchDefinitionError, match=re.escape(f"{bad!r} is not a version")):
        requires(f"{name}{op}{bad}")


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab1.,=<>!~ ()[];*+-", max_size=16))
def test_any_string_is_accepted_or_refused_with_a_definition_error(text: str) -> None:
    """requires() on any string returns a predicate or raises PatchDefinitionError with one sentence, nothing else."""
    try:
        Requirement(text)
    except InvalidRequirement:
        valid = False
    else:
        valid = True
    if valid and ("[" in text or ";" in text):
        return  # extras and markers are refused on purpose (tested above)
    try:
        requires(text)
    except PatchDefinitionError as exc:
        assert not valid, text
        assert str(exc).startswith(f"Invalid version specifier {text!r} in requires(): ")
    else:
        assert valid, text


def _not_a_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return True
    return False


def test_invalid_specifier_raises_definition_error() -> None:
    """A malformed requirement raises PatchDefinitionError naming it and showing the right form."""
    with pytest.raises(PatchDefinitionError, match=r"'megatron-core>>0\.14'.*'megatron-core>=0\.14,<0\.20'"):
        requires("megatron-core>>0.14")
    with pytest.raises(PatchDefinitionError, match="without extras"):
        requires("vllm[cuda]>=0.29")
    with pytest.raises(PatchDefinitionError, match="requirement string"):
        requires(0.14)  # type: ignore[arg-type]


def test_accepts_named_parameters() -> None:
    """accepts() checks named parameters of a function, method, staticmethod and classmethod."""
    assert accepts(f"{M}:module_func", "x").evaluate().ok
    assert accepts(f"{M}:Child.static", "x").evaluate().ok
    assert not accepts(f"{M}:Child.method", "x").evaluate().ok
    answer = accepts(f"{M}:Child.klass", "padding_mask").evaluate()
    assert not answer.ok and "does not accept padding_mask" in answer.reason


def test_accepts_var_args_and_kwargs(tmp_path: Path) -> None:
    """*args never names a parameter; **kwargs counts only with var_keyword=True."""
    assert not accepts("tests.patchreg.test_predicates:_star", "padding_mask").evaluate().ok
    answer = accepts("tests.patchreg.test_predicates:_star", "padding_mask", var_keyword=True).evaluate()
    assert answer.ok and "**kwargs" in answer.reason
    assert accepts("tests.patchreg.test_predicates:_star", "a", "b").evaluate().ok


def _star(a: int, *args: Any, b: int = 0, **kwargs: Any) -> None:
    """A signature with every kind of parameter."""


@pytest.mark.parametrize("value", ["no", 1, None])
def test_accepts_refuses_a_non_bool_var_keyword(value: Any) -> None:
    """var_keyword must be a bool: a string such as 'no' would have counted as true."""
    with pytest.raises(PatchDefinitionError, match=rf"var_keyword must be True or False, got {value!r}; pass"):
        accepts("tests.patchreg.test_predicates:_star", "padding_mask", var_keyword=value)


def test_accepts_and_has_on_missing_things() -> None:
    """Unimportable modules and missing attributes answer False with the reason."""
    assert "cannot import no_such_mod_xyz" in accepts("no_such_mod_xyz:f", "a").evaluate().reason
    assert "does not exist" in has(f"{M}:Child.nope").evaluate().reason
    assert "has no 'Nope'" in has(f"{M}:Nope.attr").evaluate().reason
    assert has(f"{M}:Child.Nested.deep").evaluate().ok
    assert has(f"{M}:Child.inherited").evaluate().ok


def test_bad_predicate_arguments() -> None:
    """Malformed paths and parameter names are rejected when the predicate is built."""
    with pytest.raises(PatchDefinitionError, match="import path"):
        has("no colon here")
    with pytest.raises(PatchDefinitionError, match="parameter names"):
        accepts(f"{M}:module_func")
    with pytest.raises(PatchDefinitionError, match="parameter names"):
        accepts(f"{M}:module_func", "not an identifier")
    with pytest.raises(PatchDefinitionError, match="callable"):
        check(42, "x")  # type: ignore[arg-type]
    with pytest.raises(PatchDefinitionError, match="description"):
        check(lambda: True, "")


def test_composition_and_reasons() -> None:
    """&, | and ~ compose, and the reason names the deciding part."""
    yes, no = requires("attrs>=1"), requires("attrs<1")
    assert (yes & always).evaluate().ok
    both = (yes & no).evaluate()
    assert not both.ok and "does not satisfy <1" in both.reason
    either = (no | yes).evaluate()
    assert either.ok and "satisfies >=1" in either.reason
    negated = (~no).evaluate()
    assert negated.ok and negated.reason.startswith("not (")
    assert str(yes & (no | ~yes)) == "requires('attrs>=1') & (requires('attrs<1') | ~requires('attrs>=1'))"


def test_predicate_has_no_truth_value() -> None:
    """Using `and`/`or`/`if` on a predicate is an error pointing at & | ~ and evaluate()."""
    with pytest.raises(TypeError, match="evaluate"):
        bool(requires("attrs>=1"))
    with pytest.raises(PatchDefinitionError, match="Cannot combine"):
        requires("attrs>=1") & True  # type: ignore[operator]


def test_answers_unpack_and_are_cached() -> None:
    """An Answer unpacks as (ok, reason); each predicate runs once until refresh()."""
    calls = []

    def probe() -> tuple[bool, str]:
        calls.append(1)
        return True, "probe ran"

    pred = check(probe, "probe")
    ok, reason = pred.evaluate()
    assert (ok, reason) == (True, "probe ran")
    assert pred.evaluate() is pred.evaluate()
    assert len(calls) == 1
    refresh()
    pred.evaluate()
    assert len(calls) == 2
    assert Answer(False, "x").ok is False and not Answer(False, "x")


def test_raising_predicate_becomes_predicate_error() -> None:
    """A predicate that raises surfaces as PredicateError naming it."""

    def broken() -> bool:
        raise RuntimeError("no")

    with pytest.raises(PredicateError, match=r"check\('broken probe'\) raised RuntimeError"):
        check(broken, "broken probe").evaluate()


def test_check_bool_result_reason() -> None:
    """A check returning a bool gets a reason naming its description."""
    assert check(lambda: False, "feature flag").evaluate().reason == "feature flag is false"


def test_requires_sees_refreshed_installs(fake_dists: Any) -> None:
    """After refresh(), a newly installed distribution is seen."""
    pred = requires("late-dist>=1")
    assert not pred.evaluate().ok
    fake_dists("late-dist", "1.2")
    assert pred.evaluate().ok


def test_not_needed_when_marks_the_answer() -> None:
    """not_needed_when() answers False, marked not needed, where its predicate holds, and True elsewhere."""
    from patchreg import not_needed_when

    fixed = not_needed_when(requires("attrs>=1")).evaluate()
    assert (fixed.ok, fixed.needed) == (False, False)
    assert fixed.reason.startswith("not needed here: attrs")
    broken = not_needed_when(requires("attrs<1")).evaluate()
    assert (broken.ok, broken.needed) == (True, True)
    both = (has(f"{M}:module_func") & not_needed_when(requires("attrs>=1"))).evaluate()
    assert not both.ok and not both.needed
    missing = (requires("no-such-dist-xyz>=1") & not_needed_when(requires("attrs>=1"))).evaluate()
    assert not missing.ok and not missing.needed  # order-independent: see test_needed_is_order_independent
    assert str(not_needed_when(requires("attrs>=1"))) == "not_needed_when(requires('attrs>=1'))"


@pytest.mark.parametrize(
    ("installed", "note"),
    [
        ("0.19.2.post1", ""),
        ("0.19.2.post1.dev3", " (judged as 0.19.2.post1)"),
        ("0.16.0rc0.dev12", " (judged as 0.16.0)"),
        ("1!0.5+abc", " (judged as 1!0.5)"),
    ],
)
def test_judged_as_note(fake_dists: Any, installed: str, note: str) -> None:
    """The reason says '(judged as X)' only when pre/dev/local parts were dropped; X keeps post and epoch."""
    fake_dists("fake-note", installed)
    answer = requires("fake-note>=0").evaluate()
    assert answer.reason == f"fake-note {installed}{note} satisfies >=0"


# -- has() and accepts() agree with getattr -------------------------------------------------------


class _Lazy:
    """A class a module serves through its module-level __getattr__."""

    def run(self, x: int) -> int:
        return x


class _Boom:
    """An object whose property raises something other than AttributeError."""

    @property
    def inner(self) -> Any:
        raise RuntimeError("backend not initialised")


@pytest.fixture
def lazy_module() -> Iterator[types.ModuleType]:
    """A module ``lazy_mod_xyz`` with a lazy attribute (PEP 562), an instance and a raising property."""

    def __getattr__(name: str) -> Any:
        if name == "Lazy":
            return _Lazy
        if name == "broken":
            raise RuntimeError("lazy import failed")
        raise AttributeError(name)

    mod = types.ModuleType("lazy_mod_xyz")
    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    mod.leaf = sample.Leaf()  # type: ignore[attr-defined]
    mod.boom = _Boom()  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    refresh()
    try:
        yield mod
    finally:
        del sys.modules[mod.__name__]
        refresh()


def test_has_and_accepts_see_lazy_module_attributes(lazy_module: types.ModuleType) -> None:
    """A module attribute served by a module-level __getattr__ exists, as getattr says."""
    answer = has("lazy_mod_xyz:Lazy").evaluate()
    assert answer.ok and "lazy_mod_xyz:Lazy exists" in answer.reason
    assert has("lazy_mod_xyz:Lazy.run").evaluate().ok
    assert accepts("lazy_mod_xyz:Lazy", "self").evaluate().ok is False  # the class's __init__: no 'self'
    assert accepts("lazy_mod_xyz:Lazy.run", "x").evaluate().ok
    missing = has("lazy_mod_xyz:Nope").evaluate()
    assert (missing.ok, missing.reason) == (False, "lazy_mod_xyz:Nope does not exist")
    broken = has("lazy_mod_xyz:broken").evaluate()
    assert not broken.ok and "RuntimeError: lazy import failed" in broken.reason


def test_has_and_accepts_see_attributes_of_an_instance_class(lazy_module: types.ModuleType) -> None:
    """An attribute of an object's class (a method) exists on the object, as getattr says."""
    assert has("lazy_mod_xyz:leaf.forward").evaluate().ok
    assert has("lazy_mod_xyz:leaf.tag").evaluate().ok
    assert accepts("lazy_mod_xyz:leaf.forward", "x").evaluate().ok
    assert not has("lazy_mod_xyz:leaf.nope").evaluate().ok
    assert hasattr(logging.root, "setLevel")
    assert has("logging:root.setLevel").evaluate().ok
    assert accepts("logging:root.setLevel", "level").evaluate().ok


def test_has_through_a_raising_property_is_false_with_the_reason(lazy_module: types.ModuleType) -> None:
    """A path through a property that raises (not AttributeError) answers False, not a PredicateError."""
    answer = has("lazy_mod_xyz:boom.inner.attr").evaluate()
    assert not answer.ok
    assert answer.reason == "lazy_mod_xyz:boom.inner raised RuntimeError: backend not initialised"


# -- check() on unhashable callables --------------------------------------------------------------


class _Probe:
    """A callable object defining __eq__ (so __hash__ is None)."""

    def __init__(self) -> None:
        self.calls = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Probe)

    __hash__ = None  # type: ignore[assignment]

    def __call__(self) -> bool:
        self.calls += 1
        return True


def test_check_takes_unhashable_callables() -> None:
    """check() on an unhashable callable evaluates (once) and hashes: the callable counts by identity."""
    probe = _Probe()
    pred = check(probe, "probe feature")
    hash(pred)
    assert pred.evaluate() == Answer(True, "probe feature is true")
    assert pred.evaluate() is pred.evaluate() and probe.calls == 1
    assert check(probe, "probe feature") == pred
    assert check(_Probe(), "probe feature") != pred
    assert (pred & always).evaluate().ok


def test_unhashable_predicate_subclass_is_cached_by_identity() -> None:
    """A Predicate subclass without __hash__ evaluates without a TypeError and is cached."""
    calls = []

    class Odd(Predicate):
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Odd)

        __hash__ = None  # type: ignore[assignment]

        def _evaluate(self) -> Answer:
            calls.append(1)
            return Answer(True, "odd")

        def describe(self) -> str:
            return "odd"

    odd = Odd()
    assert odd.evaluate().ok and odd.evaluate().ok and len(calls) == 1
    assert (odd & always).evaluate().ok and len(calls) == 1


# -- needed through & and ~ ---------------------------------------------------------------------


def test_needed_is_order_independent_and_survives_negation() -> None:
    """A failing & is not needed when any failing part is, in any order; ~~p answers as p."""
    fixed = not_needed_when(requires("attrs>=1"))
    missing = requires("no-such-dist-xyz")
    for pred in (fixed & missing, missing & fixed, missing & always & fixed, fixed | missing, missing | fixed):
        answer = pred.evaluate()
        assert (answer.ok, answer.needed) == (False, False), pred
        assert "not needed here: attrs" in answer.reason
    assert (~fixed).evaluate().ok
    for p in (fixed, missing, not_needed_when(requires("attrs<1")), always, fixed & missing):
        assert ((~~p).evaluate().ok, (~~p).evaluate().needed) == (p.evaluate().ok, p.evaluate().needed), p
    plain_miss = (missing & requires("attrs>=1")).evaluate()
    assert (plain_miss.ok, plain_miss.needed, plain_miss.reason) == (False, True, "no-such-dist-xyz is not installed")


def test_conjunction_still_short_circuits_where_needed_cannot_change() -> None:
    """After a needed failure, parts that cannot answer 'not needed' are not run; one that raises is ignored."""
    ran = []

    def probe() -> bool:
        ran.append(1)
        return True

    def broken() -> bool:
        raise ImportError("the dependency the first part says is missing")

    missing = requires("no-such-dist-xyz")
    assert not (missing & check(probe, "probe")).evaluate().ok
    assert ran == []
    answer = (missing & not_needed_when(check(broken, "broken"))).evaluate()
    assert (answer.ok, answer.needed, answer.reason) == (False, True, "no-such-dist-xyz is not installed")


def test_distributions_descend_into_not_needed_when() -> None:
    """distributions() names the requires() inside not_needed_when(), ~ and combinations."""
    assert distributions(not_needed_when(requires("attrs>=999"))) == {"attrs"}
    combined = not_needed_when(requires("Some_Dist>=1") & has(f"{M}:module_func")) | ~requires("other.dist")
    assert distributions(combined) == {"some-dist", "other-dist"}
