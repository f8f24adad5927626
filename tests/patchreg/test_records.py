"""Records: Patch and PatchSet validation, composition, repr; target parsing and selectors."""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchreg import Patch, PatchDefinitionError, PatchSet, Registry, Selector, always, requires
from patchreg._predicates import Predicate
from patchreg._targets import ImportPath, Miss, parse_import_path
from tests.patchreg import sample
from tests.patchreg.helpers import plain, tagging_wrapper

M = "tests.patchreg.sample"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target": "pkg.mod:"}, "Malformed target 'pkg.mod:'"),
        ({"target": ":attr"}, "Malformed target"),
        ({"target": "a:b:c"}, "one colon"),
        ({"target": "pkg-mod:f"}, "dotted identifiers"),
        ({"target": "mtp.layers[x].f"}, "Malformed selector"),
        ({"target": "mtp.layers[*]"}, "must end with the attribute"),
        ({"target": "a..b"}, "Malformed selector"),
        ({"target": 42}, "string or a Selector"),
        ({"replacement": 42}, "not callable"),
        ({"kind": "patch"}, "unknown kind 'patch'"),
        ({"when": True}, "not a predicate"),
        ({"name": ""}, "Invalid Patch name ''"),
        ({"name": "has space"}, "Invalid Patch name"),
        ({"kind": "wrap", "replacement": lambda x: x}, r"\(wrapped, instance, args, kwargs\)"),
        ({"doc": 3}, "doc must be a string"),
    ],
)
def test_patch_validation(kwargs: dict[str, Any], match: str) -> None:
    """A malformed field raises PatchDefinitionError naming the field's value and the remedy."""
    fields: dict[str, Any] = {"name": "p", "target": f"{M}:module_func", "replacement": plain(1)} | kwargs
    with pytest.raises(PatchDefinitionError, match=match):
        Patch(**fields)


def test_patch_is_frozen_and_identity_compared() -> None:
    """Patches are frozen, hashable by identity, and repr on one line."""
    a = Patch("p", f"{M}:module_func", plain(1), when=requires("attrs>=1"))
    b = Patch("p", f"{M}:module_func", a.replacement, when=a.when)
    assert a != b and len({a, b}) == 2
    with pytest.raises(AttributeError):
        a.name = "q"  # type: ignore[misc]
    assert repr(a) == "Patch('p', 'tests.patchreg.sample:module_func', kind='replace', when=requires('attrs>=1'))"
    assert a.is_global and not Patch("s", "forward", plain(1)).is_global


def test_patch_description_from_doc_or_docstring() -> None:
    """description is the doc field, else the first line of the replacement's docstring."""

    def replacement() -> None:
        """Do the thing.

        More text."""

    assert Patch("p", f"{M}:module_func", replacement).description == "Do the thing."
    assert Patch("p", f"{M}:module_func", replacement, doc="Own doc").description == "Own doc"


def test_descriptor_replacements_allowed() -> None:
    """staticmethod, classmethod and property objects are valid replacements."""
    for value in (staticmethod(len), classmethod(lambda cls: cls), property(lambda self: 1)):
        Patch("p", f"{M}:Child.prop", value)


def test_patchset_rules() -> None:
    """Duplicate names are rejected; + composes with the same rule; without() and lookup work."""
    a = Patch("a", f"{M}:module_func", plain(1))
    b = Patch("b", f"{M}:Child.method", plain(2))
    w = Patch("w", f"{M}:Child.method", tagging_wrapper("w"), kind="wrap")
    with pytest.raises(PatchDefinitionError, match="two patches are named 'a'"):
        PatchSet("s", [a, Patch("a", f"{M}:Child.static", plain(1))])
    s1, s2 = PatchSet("one", [a, b]), PatchSet("two", [w])
    both = s1 + s2
    assert both.name == "one+two" and both.names == ("a", "b", "w")
    with pytest.raises(PatchDefinitionError, match="two patches are named"):
        s1 + PatchSet("dup", [a])
    assert (s1 + w).names == ("a", "b", "w")
    assert s1.without("b").names == ("a",)
    with pytest.raises(PatchDefinitionError, match="no patch named"):
        s1.without("zzz")
    assert s1["b"] is b and list(s1) == [a, b] and len(s1) == 2
    with pytest.raises(KeyError):
        s1["zzz"]
    assert repr(both) == "PatchSet('one+two', ['a', 'b', 'w'])"


@pytest.mark.parametrize("doc", [None, 1])
def test_patchset_doc_must_be_a_string(doc: Any) -> None:
    """A PatchSet doc that is not a string is refused, naming the set and the remedy, as a Patch's is."""
    with pytest.raises(PatchDefinitionError, match=rf"PatchSet 's': doc must be a string, got {doc!r}; give a string"):
        PatchSet("s", [Patch("a", f"{M}:module_func", plain(1))], doc=doc)


def test_definition_errors_carry_a_patch_that_reprs() -> None:
    """The half-built Patch a definition error carries reprs on one line, even with an invalid when."""

    class Undescribed(Predicate):
        """A predicate subclass that forgot describe()."""

    with pytest.raises(PatchDefinitionError) as caught:
        Patch("p", f"{M}:module_func", plain(1), when=True)  # type: ignore[arg-type]
    assert caught.value.target == f"{M}:module_func"
    assert repr(caught.value.patch) == f"Patch('p', '{M}:module_func', kind='replace', when=True)"
    with pytest.raises(PatchDefinitionError) as caught:
        Patch("p", f"{M}:module_func", plain(1), when=Undescribed(), kind="patch")  # type: ignore[arg-type]
    assert repr(caught.value.patch) == f"Patch('p', '{M}:module_func', kind='patch', when=<Undescribed>)"


def test_report_after_revert_by_patch_holds_nothing(patch_registry: Registry) -> None:
    """Reverting by patch (not by report) leaves the apply's Report at 0 held, reverted, entries at count 0."""
    target = sample.Child()
    patch = Patch("p", "method", plain("patched"))
    report = patch_registry.apply(patch, target)
    assert (report.held, report.reverted) == (1, False)
    patch_registry.revert(patch, target)
    assert vars(target) == {}
    assert (report.held, report.reverted) == (0, True)
    assert [(e.state, e.count) for e in report.entries] == [("reverted", 0)]
    assert "0 held" in repr(report) and str(report).startswith("patch set 'p' (reverted):")
    assert patch_registry.revert(report) == 0


def test_report_of_only_skips_is_reverted_only_through_itself(patch_registry: Registry) -> None:
    """A report that installed nothing holds nothing, and is reverted once it is released, not before."""
    report = patch_registry.apply(Patch("p", "no_such_attr", plain(1)), sample.Child())
    assert (report.held, report.reverted, len(report.skipped)) == (0, False, 1)
    patch_registry.revert(report)
    assert report.reverted


def test_reverted_report_entries_show_count_zero_while_another_user_holds(patch_registry: Registry) -> None:
    """A released report's entries show count 0 and state reverted, though another report still holds the install."""
    patch = Patch("p", f"{M}:Child.method", plain("patched"))
    outer = patch_registry.apply(patch)
    with patch_registry.patched(patch) as inner:
        assert [(e.state, e.count) for e in inner.entries] == [("active", 2)]
    assert (inner.held, inner.reverted) == (0, True)
    assert [(e.state, e.count) for e in inner.entries] == [("reverted", 0)]
    assert "(count 0)" in str(inner)
    assert (outer.held, outer.reverted) == (1, False)
    assert [(e.state, e.count) for e in outer.entries] == [("active", 1)]
    patch_registry.revert(outer)


def test_entries_say_since_when_in_seconds_of_the_clock(patch_registry: Registry) -> None:
    """An install's ``since`` is the time of its apply in seconds (``time.time()``), by the general path and by a
    plan's, and ``summary()`` counts from it."""
    patch = Patch("own", "method", plain("patched"))
    obj = sample.Child()
    for _ in range(3):  # the first apply resolves and keeps its plan, the later ones run it
        before = time.time()
        with patch_registry.patched(patch, obj) as report:
            after = time.time()
            (entry,) = report.entries
            assert before - 0.01 <= entry.since <= after + 0.01
            assert "s ago" in patch_registry.summary() and "e+" not in patch_registry.summary()


def test_patchset_bad_members() -> None:
    """A PatchSet of non-patches, or of a single Patch, is rejected with the remedy."""
    with pytest.raises(PatchDefinitionError, match="not a Patch"):
        PatchSet("s", ["a"])  # type: ignore[list-item]
    with pytest.raises(PatchDefinitionError, match="iterable of Patch"):
        PatchSet("s", Patch("a", f"{M}:module_func", plain(1)))  # type: ignore[arg-type]


_ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@settings(suppress_health_check=[HealthCheck.too_slow])  # regex generation is slow on a loaded 2-core machine
@given(st.lists(_ident, min_size=1, max_size=4), st.lists(_ident, min_size=1, max_size=4))
def test_import_path_round_trip(module: list[str], qual: list[str]) -> None:
    """Every well-formed import path parses and prints back unchanged."""
    text = f"{'.'.join(module)}:{'.'.join(qual)}"
    parsed = parse_import_path(text)
    assert parsed == ImportPath(".".join(module), tuple(qual))
    assert str(parsed) == text


@given(st.text(max_size=30))
def test_import_path_parse_never_crashes(text: str) -> None:
    """Any string either parses as an import path or raises PatchDefinitionError."""
    try:
        parsed = parse_import_path(text)
    except PatchDefinitionError as exc:
        assert repr(text) in str(exc)
    else:
        assert str(parsed) == text


@given(st.lists(st.tuples(_ident, st.sampled_from(["", "[*]", "[0]", "[-1]", "[*][*]"])), min_size=1, max_size=4))
def test_selector_parse_round_trip(parts: list[tuple[str, str]]) -> None:
    """Well-formed selectors parse; an index on the last part is refused."""
    text = ".".join(name + idx for name, idx in parts)
    if parts[-1][1]:
        with pytest.raises(PatchDefinitionError, match="must end with"):
            Selector(text)
    else:
        assert str(Selector(text)) == text


def test_selector_resolution_misses_and_indices() -> None:
    """Selectors report misses with reasons and honour [n] and mapping values."""
    tree = sample.Tree(3)
    assert [s.holder.tag for s in Selector("blocks[-1].forward").resolve(tree)] == ["block2"]  # type: ignore[union-attr]
    miss = Selector("blocks[5].forward").resolve(tree)
    assert isinstance(miss, Miss) and "out of range" in miss.reason
    miss = Selector("head[*].forward").resolve(tree)
    assert isinstance(miss, Miss) and "not a sequence" in miss.reason
    tree.blocks = {"x": sample.Leaf("x")}  # type: ignore[assignment]
    assert [s.holder.tag for s in Selector("blocks[*].forward").resolve(tree)] == ["x"]  # type: ignore[union-attr]
    tree.blocks = []
    assert "empty" in Selector("blocks[*].forward").resolve(tree).reason  # type: ignore[union-attr]
    tree.head = None  # type: ignore[assignment]
    assert "missing or None" in Selector("head.forward").resolve(tree).reason  # type: ignore[union-attr]


def test_selector_custom_unwrap() -> None:
    """A Selector object can name its own wrapper attributes."""
    leaf = sample.Leaf()

    class Box:
        def __init__(self) -> None:
            self.inner = leaf

    assert isinstance(Selector("forward").resolve(Box()), Miss)
    found = Selector("forward", unwrap=("inner",)).resolve(Box())
    assert [s.holder for s in found] == [leaf]  # type: ignore[union-attr]
    with pytest.raises(PatchDefinitionError, match="identifiers"):
        Selector("forward", unwrap=("not ok",))


def test_selector_unwrap_takes_one_name_as_a_string() -> None:
    """unwrap="module" is one name (not the letters m, o, d, ...); a non-iterable is a definition error."""
    wrapped = sample.Wrapper(sample.Leaf("inner"))
    selector = Selector("forward", unwrap="module")
    assert selector.unwrap == ("module",)
    assert [s.holder.tag for s in selector.resolve(wrapped)] == ["inner"]  # type: ignore[union-attr]
    assert Selector("forward", unwrap=["module"]).unwrap == ("module",)
    assert Selector("forward", unwrap="module") == Selector("forward", unwrap=("module",))
    with pytest.raises(PatchDefinitionError, match="attribute name or a tuple of names"):
        Selector("forward", unwrap=3)  # type: ignore[arg-type]
    with pytest.raises(PatchDefinitionError, match="identifiers"):
        Selector("forward", unwrap="not ok")


def test_import_path_to_a_lazy_module_attribute_is_skipped_with_the_reason() -> None:
    """A module attribute served by a module-level __getattr__ exists, but a patch on it is skipped, saying why."""

    def __getattr__(name: str) -> Any:
        if name == "Lazy":
            return sample.Leaf
        raise AttributeError(name)

    mod = types.ModuleType("lazy_records_xyz")
    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[mod.__name__] = mod
    try:
        before = dict(vars(mod))
        miss = parse_import_path("lazy_records_xyz:Lazy").resolve()
        assert isinstance(miss, Miss)
        assert "exists but is not stored in module lazy_records_xyz" in miss.reason
        assert "module-level __getattr__" in miss.reason
        assert "'tests.patchreg.sample:Leaf'" in miss.reason
        assert parse_import_path("lazy_records_xyz:Nope").resolve() == Miss("lazy_records_xyz:Nope does not exist")
        reg = Registry("lazy-attr")
        patch = Patch("lazy", "lazy_records_xyz:Lazy", plain(1))
        assert reg.explain(patch).rows[0][2:] == ("skip", miss.reason)
        report = reg.apply(patch)
        assert reg.active() == () and vars(mod) == before
        reg.revert(report)
    finally:
        del sys.modules[mod.__name__]


def test_import_path_through_a_raising_property_is_a_miss() -> None:
    """A path through a property raising something other than AttributeError resolves to a Miss with the reason."""

    class Boom:
        @property
        def inner(self) -> Any:
            raise RuntimeError("backend not initialised")

    mod = types.ModuleType("boom_records_xyz")
    mod.holder = Boom()  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        miss = parse_import_path("boom_records_xyz:holder.inner.attr").resolve()
        assert miss == Miss("boom_records_xyz:holder.inner raised RuntimeError: backend not initialised")
    finally:
        del sys.modules[mod.__name__]


def test_chunk_reasons_combined() -> None:
    """When no chunk matches, the miss names each chunk's reason."""
    miss = Selector("blocks[*].forward").resolve([sample.Leaf(), sample.Tree(0)])
    assert isinstance(miss, Miss) and "chunk 0" in miss.reason and "chunk 1" in miss.reason


def test_always_repr() -> None:
    """always prints as its name."""
    assert repr(always) == "always" and always.evaluate().ok
