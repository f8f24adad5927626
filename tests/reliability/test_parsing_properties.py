"""Hypothesis properties of target-string parsing: total, round-tripping, and only PatchDefinitionError on bad text."""

from __future__ import annotations

import keyword

from hypothesis import given, settings
from hypothesis import strategies as st

from patchreg import Patch, PatchDefinitionError, Selector
from patchreg._targets import ImportPath, parse_import_path, parse_target
from tests.reliability.helpers import Figures, plain

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
dotted = st.lists(identifiers, min_size=1, max_size=4).map(".".join)
indices = st.lists(st.one_of(st.just("*"), st.integers(-5, 50).map(str)), max_size=3).map(
    lambda xs: "".join(f"[{x}]" for x in xs)
)
segments = st.tuples(identifiers, indices).map("".join)
selectors = st.tuples(st.lists(segments, max_size=3), identifiers).map(lambda t: ".".join([*t[0], t[1]]))
noise = st.text(alphabet=st.sampled_from("ab_1.:[]*- \t\n\x00é"), max_size=20)

_SEEN = {"parsed": 0}


@settings(max_examples=200)
@given(module=dotted, qual=dotted)
def test_import_paths_round_trip(module: str, qual: str) -> None:
    """Every well-formed 'module:Qual.attr' parses to an ImportPath whose str() is the input."""
    text = f"{module}:{qual}"
    parsed = parse_target(text)
    assert isinstance(parsed, ImportPath)
    assert str(parsed) == text
    assert parsed.module == module and parsed.parts == tuple(qual.split("."))
    _SEEN["parsed"] += 1


@settings(max_examples=200)
@given(path=selectors)
def test_selectors_round_trip(path: str) -> None:
    """Every well-formed selector parses to a Selector whose str() is the input, and a Patch accepts it."""
    parsed = parse_target(path)
    assert isinstance(parsed, Selector)
    assert str(parsed) == path
    assert Patch("p", path, plain(1)).where == parsed
    _SEEN["parsed"] += 1


@settings(max_examples=300)
@given(text=st.one_of(noise, st.text(max_size=30)))
def test_any_text_parses_or_raises_definition_error(text: str) -> None:
    """Arbitrary text either parses or raises PatchDefinitionError naming it; never another exception."""
    try:
        parsed = parse_target(text)
    except PatchDefinitionError as exc:
        assert repr(text) in str(exc) or repr(text.split(".")[0]) in str(exc) or "at " in str(exc)
    else:
        assert str(parsed) == text
    _SEEN["parsed"] += 1


@settings(max_examples=100)
@given(value=st.one_of(st.none(), st.integers(), st.binary(max_size=5), st.lists(st.text(max_size=3), max_size=2)))
def test_non_strings_are_refused(value: object) -> None:
    """Anything but a string or a Selector is refused with PatchDefinitionError."""
    try:
        parse_target(value)
    except PatchDefinitionError as exc:
        assert repr(value) in str(exc)
    else:
        raise AssertionError(f"{value!r} parsed")
    _SEEN["parsed"] += 1


@settings(max_examples=200)
@given(text=st.text(max_size=30))
def test_import_path_parser_is_strict(text: str) -> None:
    """parse_import_path accepts exactly one colon between dotted identifiers, and names the field otherwise."""
    try:
        parsed = parse_import_path(text, field="has()")
    except PatchDefinitionError as exc:
        assert "has()" in str(exc) and repr(text) in str(exc)
    else:
        assert text.count(":") == 1 and str(parsed) == text
    _SEEN["parsed"] += 1


def test_parsing_inputs_tried(figures: Figures) -> None:
    """Record how many strings the parsing properties tried (after they ran)."""
    figures.add("parsing.inputs_tried", _SEEN["parsed"])
    _SEEN["parsed"] = 0
