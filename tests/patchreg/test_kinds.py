"""Patch kinds beyond callables: values, attributes absent before (create=True), and mapping items."""

from __future__ import annotations

import io
import os
import sys
import types
from collections.abc import Iterator

import pytest

from patchreg import (
    ABSENT,
    Patch,
    PatchConflictError,
    PatchDefinitionError,
    PatchOwnershipError,
    Registry,
    TargetNotFoundError,
    UnpatchableTargetError,
    requires,
)
from patchreg._cli import run
from patchreg._discovery import discover
from tests.patchreg import kinds_sample as ks
from tests.patchreg import sample
from tests.patchreg.helpers import plain, snapshot

M = "tests.patchreg.kinds_sample"
ENV = "PATCHREG_TEST_KINDS_VAR"


@pytest.fixture
def clean() -> Iterator[None]:
    """The sample module, its dict and os.environ are exactly as before after the test."""
    before = snapshot(ks), dict(ks.TABLE), _environ()
    yield
    assert snapshot(ks) == before[0] and all(snapshot(ks)[k] is v for k, v in before[0].items())
    assert before[1] == ks.TABLE and all(ks.TABLE[k] is v for k, v in before[1].items())
    assert _environ() == before[2]


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


# -- values -------------------------------------------------------------------------------


def test_value_patch_sets_a_module_constant_and_restores_the_very_object(patch_registry: Registry, clean: None) -> None:
    """kind='value' installs a non-callable; users are counted and the original object comes back."""
    p = Patch("flag", f"{M}:FLAG", True, kind="value")
    first, second = patch_registry.apply(p), patch_registry.apply(p)
    assert ks.FLAG is True and (first.installed, second.installed) == (1, 0)
    assert p.backup.get(ks) is False
    assert patch_registry.revert(second) == 0 and ks.FLAG is True
    assert patch_registry.revert(first) == 1 and ks.FLAG is False


def test_value_on_one_config_object_leaves_other_configs_alone(patch_registry: Registry, clean: None) -> None:
    """A value patch through a selector sets one model's dataclass config field; others see the class default."""
    model, other = ks.Holder(), ks.Holder()
    before = dict(vars(model.config))
    with patch_registry.patched(Patch("detach", "config.mtp_detach_heads", True, kind="value"), model) as report:
        assert model.config.mtp_detach_heads is True and other.config.mtp_detach_heads is False
        assert report.installed == 1 and patch_registry.is_active("detach", model)
    assert vars(model.config) == before and model.config.mtp_detach_heads is False


class _Settings:
    flag: object = False  # a class default: an instance's own value is absent until set


@pytest.mark.parametrize("value", [True, 10**30, plain("v")], ids=["bool", "big-int", "function"])
def test_a_planned_value_patch_is_restored_at_every_exit(patch_registry: Registry, value: object) -> None:
    """Block after block (the plan re-used) a value is set on an instance and removed again, whether or not it can
    be weakly referenced; a write over it inside the block is still found at the exit."""
    settings = _Settings()
    patch = Patch("flag", "flag", value, kind="value")
    for _ in range(4):
        with patch_registry.patched(patch, settings) as report:
            assert vars(settings) == {"flag": value} and report.installed == 1
        assert vars(settings) == {}
    block = patch_registry.patched(patch, settings)
    with pytest.raises(PatchOwnershipError, match="someone patched over it"), block:
        settings.flag = "theirs"
    settings.flag = value  # ours again: the exit can be retried
    block.__exit__(None, None, None)
    assert vars(settings) == {}


def test_value_patch_installs_a_callable_as_it_is(patch_registry: Registry) -> None:
    """A callable given as a value is installed unbound (no method binding), unlike kind='replace'."""
    leaf = sample.Leaf()
    fn = plain("v")
    with patch_registry.patched(Patch("fv", "forward", fn, kind="value"), leaf):
        assert vars(leaf)["forward"] is fn
    assert "forward" not in vars(leaf)


def test_non_callable_replace_is_still_caught_and_names_kind_value() -> None:
    """A typo'd callable (a plain value under kind='replace') is refused, pointing at kind='value'."""
    with pytest.raises(PatchDefinitionError, match="kind='value'"):
        Patch("typo", f"{M}:FLAG", True)


def test_value_conflicts_with_a_replace_and_ownership_is_checked(patch_registry: Registry, clean: None) -> None:
    """Two patches putting values on one attribute conflict; a foreign write over a value blocks its revert."""
    p = Patch("flag", f"{M}:FLAG", True, kind="value")
    patch_registry.apply(p)
    with pytest.raises(PatchConflictError, match="also replaces"):
        patch_registry.apply(Patch("flag2", f"{M}:FLAG", 3, kind="value"))
    ks.FLAG = "theirs"  # type: ignore[assignment]
    with pytest.raises(PatchOwnershipError, match="someone patched over it"):
        patch_registry.revert(p)
    ks.FLAG = True
    assert patch_registry.revert(p) == 1 and ks.FLAG is False


# -- absent before ------------------------------------------------------------------------


def test_absent_attribute_is_skipped_without_create(patch_registry: Registry, clean: None) -> None:
    """Without create=True an attribute the module does not have is a skip that names create=True... or the target."""
    report = patch_registry.apply(Patch("nope", f"{M}:ADDED", 7, kind="value"))
    assert report.installed == 0 and "does not exist" in report.skipped[0][1]


def test_create_adds_a_module_attribute_and_revert_deletes_it(patch_registry: Registry, clean: None) -> None:
    """create=True installs an absent attribute; the backup says ABSENT and revert deletes it."""
    p = Patch("added", f"{M}:ADDED", 7, kind="value", create=True)
    with patch_registry.patched(p):
        assert ks.ADDED == 7  # type: ignore[attr-defined]
        assert p.backup.get(ks) is ABSENT
    assert not hasattr(ks, "ADDED")


def test_create_on_instances_through_a_selector_path(patch_registry: Registry) -> None:
    """create=True through 'blocks[*].new' adds the name to each element, removed on revert."""
    tree = sample.Tree(3)
    p = Patch("new", "blocks[*].new_attr", plain("n"), create=True)
    with patch_registry.patched(p, tree) as report:
        assert report.installed == 3 and all(b.new_attr() == "n" for b in tree.blocks)
    assert all("new_attr" not in vars(b) for b in tree.blocks)


def test_create_refused_on_a_wrap() -> None:
    """A wrap cannot create what it wraps: PatchDefinitionError at declaration."""
    with pytest.raises(PatchDefinitionError, match="cannot create"):
        Patch("w", f"{M}:ADDED", lambda w, i, a, k: 1, kind="wrap", create=True)


# -- mapping items ------------------------------------------------------------------------


def test_environ_item_absent_before_is_deleted_on_revert(patch_registry: Registry, clean: None) -> None:
    """An os.environ key set with create=True is there inside the block and gone after it."""
    assert ENV not in os.environ
    p = Patch("env", "os:environ", "1", kind="item", key=ENV, create=True)
    with patch_registry.patched(p) as report:
        assert os.environ[ENV] == "1" and report.installed == 1
        assert patch_registry.apply(p).installed == 0  # counted: a second user shares it
        patch_registry.revert(p)
    assert ENV not in os.environ


def test_environ_item_present_before_comes_back(
    patch_registry: Registry, clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An os.environ key that was set gets its old value back."""
    monkeypatch.setenv(ENV, "old")
    with patch_registry.patched(Patch("env", "os:environ", "new", kind="item", key=ENV)):
        assert os.environ[ENV] == "new"
    assert os.environ[ENV] == "old"


def test_absent_item_without_create_is_a_skip_naming_create(patch_registry: Registry) -> None:
    """A key the mapping does not have is skipped unless create=True, and the reason says so."""
    report = patch_registry.apply(Patch("env", "os:environ", "1", kind="item", key=ENV))
    assert report.installed == 0 and "create=True" in report.skipped[0][1] and ENV not in os.environ


def test_dict_item_restores_the_very_object_and_checks_ownership(patch_registry: Registry, clean: None) -> None:
    """A registry dict's entry is replaced and restored as the same object; a foreign change blocks the revert."""
    p = Patch("gpt", f"{M}:TABLE", "mine", kind="item", key="gpt")
    patch_registry.apply(p)
    assert ks.TABLE["gpt"] == "mine" and p.backup.get(ks.TABLE) is ks.HANDLER
    ks.TABLE["gpt"] = "theirs"
    with pytest.raises(PatchOwnershipError, match=r"TABLE\['gpt'\]"):
        patch_registry.revert(p)
    del ks.TABLE["gpt"]
    with pytest.raises(PatchOwnershipError, match="deleted meanwhile"):
        patch_registry.revert(p)
    ks.TABLE["gpt"] = ks.HANDLER  # put back: the revert then finds the original and writes nothing
    assert patch_registry.revert(p) == 1 and ks.TABLE["gpt"] is ks.HANDLER


def test_item_on_an_objects_mapping_through_a_selector(patch_registry: Registry) -> None:
    """kind='item' with a selector sets a key of the mapping an attribute of the object holds."""
    model = ks.Holder()
    with patch_registry.patched(Patch("x", "extra", 2, kind="item", key="new", create=True), model):
        assert model.extra == {"seen": 1, "new": 2}
    assert model.extra == {"seen": 1}


def test_two_items_on_one_key_conflict(patch_registry: Registry, clean: None) -> None:
    """Two item patches on one key conflict like two replaces; on different keys they coexist."""
    patch_registry.apply(Patch("a", f"{M}:TABLE", 1, kind="item", key="gpt"))
    with pytest.raises(PatchConflictError):
        patch_registry.apply(Patch("b", f"{M}:TABLE", 2, kind="item", key="gpt"))
    assert patch_registry.apply(Patch("c", f"{M}:TABLE", 3, kind="item", key="mtp", create=True)).installed == 1
    assert patch_registry.revert_all() == 2


def test_item_definition_errors() -> None:
    """kind='item' needs a hashable key; key= without kind='item' is refused."""
    with pytest.raises(PatchDefinitionError, match="key="):
        Patch("a", "os:environ", "1", kind="item")
    with pytest.raises(PatchDefinitionError, match="not hashable"):
        Patch("a", "os:environ", "1", kind="item", key=[1])
    with pytest.raises(PatchDefinitionError, match="for mapping items"):
        Patch("a", f"{M}:FLAG", True, kind="value", key="x")


def test_item_on_a_non_mapping_is_unpatchable(patch_registry: Registry) -> None:
    """An item patch whose target is not a mutable mapping is refused with what it holds."""
    with pytest.raises(UnpatchableTargetError, match="not a mutable mapping"):
        patch_registry.apply(Patch("a", f"{M}:FLAG", 1, kind="item", key="x"))


def test_predicate_skips_an_item(patch_registry: Registry) -> None:
    """A predicate that does not hold skips an item patch like any other."""
    report = patch_registry.apply(
        Patch("env", "os:environ", "1", kind="item", key=ENV, create=True, when=requires("attrs<1"))
    )
    assert report.installed == 0 and ENV not in os.environ


# -- introspection ------------------------------------------------------------------------


def test_explain_summary_fingerprint_name_each_kind(patch_registry: Registry, clean: None) -> None:
    """explain, summary, Report text and fingerprint show values, created attributes and items with their keys."""
    print_rows = patch_registry.explain(ks.KINDS).rows
    assert [r[2] for r in print_rows] == ["install"] * 4
    assert print_rows[1][1] == "os:environ['PATCHREG_KINDS_SAMPLE']"
    before = patch_registry.fingerprint()
    with patch_registry.patched(ks.KINDS) as report:
        text = patch_registry.summary()
        assert "os:environ['PATCHREG_KINDS_SAMPLE']" in text and f"{M}:TABLE['mtp']" in text
        assert "tests.patchreg.kinds_sample.ADDED" in text and "(count 1)" in str(report)
        lines = patch_registry.fingerprint_lines()
        assert any("|item|os:environ.PATCHREG_KINDS_SAMPLE|active" in line for line in lines)
        assert patch_registry.fingerprint() != before
        assert [r[2] for r in patch_registry.explain(ks.KINDS).rows] == ["share"] * 4
    assert patch_registry.fingerprint() == before


def test_cli_show_names_the_kind_key_and_value() -> None:
    """`show` on an item patch prints its kind, key, create and value."""
    out = io.StringIO()
    status = run(["show", "sample-kinds.env-var"], finder=lambda extra: discover((M,), (), group=None), out=out)
    text = out.getvalue()
    assert status == 0, text
    assert "item, key 'PATCHREG_KINDS_SAMPLE', created if absent" in text and "value '1'" in text


def test_create_shadows_a_getattr_served_attribute_and_revert_uncovers_it(patch_registry: Registry) -> None:
    """create=True stores over an attribute a module __getattr__ serves; revert deletes it and __getattr__ serves again."""
    mod = types.ModuleType("kinds_lazy_xyz")
    mod.__getattr__ = lambda name: "served" if name == "LAZY" else (_ for _ in ()).throw(AttributeError(name))  # type: ignore[method-assign]
    sys.modules[mod.__name__] = mod
    try:
        assert patch_registry.apply(Patch("v", "kinds_lazy_xyz:LAZY", "mine", kind="value")).installed == 0
        with patch_registry.patched(Patch("c", "kinds_lazy_xyz:LAZY", "mine", kind="value", create=True)):
            assert mod.LAZY == "mine"
        assert "LAZY" not in vars(mod) and mod.LAZY == "served"
    finally:
        del sys.modules[mod.__name__]


# -- deletion for a block (pytest's delattr / delitem / delenv) --------------------------------


def test_delete_removes_a_module_attribute_for_a_block_and_puts_the_very_object_back(
    patch_registry: Registry, clean: None
) -> None:
    """kind='delete' makes an attribute absent inside the block; the same object comes back after, users counted."""
    p = Patch("no-flag", f"{M}:FLAG", None, kind="delete")
    with patch_registry.patched(p) as report:
        assert not hasattr(ks, "FLAG") and report.installed == 1
        assert "no-flag" in patch_registry.summary() and f"{M}.FLAG" in patch_registry.summary()
        inner = patch_registry.apply(p)
        assert inner.installed == 0  # a second user shares it
        patch_registry.revert(inner)
        assert not hasattr(ks, "FLAG")
    assert ks.FLAG is False


def test_delete_removes_an_environment_variable_and_a_dict_key_for_a_block(
    patch_registry: Registry, clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kind='delete' with key= makes a variable or a key absent inside the block; its value comes back after."""
    monkeypatch.setenv(ENV, "old")
    gone = Patch("no-env", "os:environ", None, kind="delete", key=ENV)
    with patch_registry.patched(gone):
        assert ENV not in os.environ
        assert patch_registry.active()[0].where == f"os:environ[{ENV!r}]"
    assert os.environ[ENV] == "old"
    with patch_registry.patched(Patch("no-gpt", f"{M}:TABLE", None, kind="delete", key="gpt")):
        assert "gpt" not in ks.TABLE
    assert ks.TABLE["gpt"] is ks.HANDLER


def test_delete_of_an_instance_attribute_through_a_selector(patch_registry: Registry) -> None:
    """A selector's delete removes the instance's own attribute and restores it; one only inherited is a skip."""
    model = ks.Holder()
    config = model.config
    with patch_registry.patched(Patch("no-config", "config", None, kind="delete"), model) as report:
        assert "config" not in vars(model) and report.entries[0].where == "model.config"
    assert model.config is config
    report = patch_registry.apply(Patch("no-init", "__init__", None, kind="delete"), model)
    assert report.installed == 0 and "own namespace" in report.skipped[0][1]


def test_delete_of_something_absent_is_a_quiet_skip_and_strict_refuses_it(
    patch_registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing to delete is a skip logged nowhere (pytest's raising=False); strict=True refuses it (raising=True)."""
    p = Patch("no-var", "os:environ", None, kind="delete", key=ENV)
    with caplog.at_level("WARNING", logger="patchreg"):
        report = patch_registry.apply(p)
    assert report.installed == 0 and "nothing to delete" in report.skipped[0][1] and caplog.records == []
    with pytest.raises(TargetNotFoundError, match="nothing to delete"):
        patch_registry.apply(p, strict=True)


def test_delete_conflicts_checks_ownership_and_refuses_bad_definitions(patch_registry: Registry, clean: None) -> None:
    """A delete conflicts with a replace on the same attribute, refuses to revert over a re-set, and takes no value."""
    delete = Patch("no-flag", f"{M}:FLAG", None, kind="delete")
    patch_registry.apply(delete)
    with pytest.raises(PatchConflictError):
        patch_registry.apply(Patch("flag", f"{M}:FLAG", True, kind="value", create=True))
    ks.FLAG = True  # someone sets it inside the block
    with pytest.raises(PatchOwnershipError):
        patch_registry.revert(delete)
    del ks.FLAG
    assert patch_registry.revert(delete) == 1 and ks.FLAG is False
    with pytest.raises(PatchDefinitionError, match="pass None"):
        Patch("d", f"{M}:FLAG", 1, kind="delete")
    with pytest.raises(PatchDefinitionError, match="cannot create"):
        Patch("d", f"{M}:FLAG", None, kind="delete", create=True)
    with pytest.raises(PatchDefinitionError, match="environment"):
        Patch("d", "os:environ", None, kind="delete", key="A=B")


def test_prepend_puts_a_value_in_front_of_an_environment_variable_for_a_block(
    patch_registry: Registry, clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepend=os.pathsep joins the value in front of the one there (pytest's setenv prepend); the old one is back."""
    monkeypatch.setenv(ENV, "/usr/bin")
    p = Patch("path", "os:environ", "/opt/bin", kind="item", key=ENV, prepend=os.pathsep)
    with patch_registry.patched(p):
        assert os.environ[ENV] == f"/opt/bin{os.pathsep}/usr/bin"
        assert "prepend=" in repr(p)
    assert os.environ[ENV] == "/usr/bin"
    monkeypatch.delenv(ENV)
    with patch_registry.patched(Patch("path", "os:environ", "/opt/bin", kind="item", key=ENV, create=True, prepend=":")):
        assert os.environ[ENV] == "/opt/bin"  # nothing there: the value alone
    assert ENV not in os.environ


def test_prepend_is_for_str_items_only() -> None:
    """prepend on another kind, with a non-str value or a non-str separator is a PatchDefinitionError."""
    with pytest.raises(PatchDefinitionError, match="prepend"):
        Patch("p", f"{M}:FLAG", "x", kind="value", prepend=":")
    with pytest.raises(PatchDefinitionError, match="prepend"):
        Patch("p", f"{M}:TABLE", 1, kind="item", key="k", prepend=":")
    with pytest.raises(PatchDefinitionError, match="prepend"):
        Patch("p", f"{M}:TABLE", "x", kind="item", key="k", prepend=1)  # type: ignore[arg-type]


# -- a whole mapping for a block (mock.patch.dict) -----------------------------------------------


def test_a_dict_patch_sets_its_keys_and_clear_empties_the_rest_for_a_block(patch_registry: Registry, clean: None) -> None:
    """kind='dict' sets each key (creating the absent), clear=True makes the others absent; all come back as they were."""
    before = dict(ks.TABLE)
    values = {"gpt": "mine", "new": 1}
    with patch_registry.patched(Patch("table", f"{ks.M}:TABLE", values, kind="dict")) as report:
        assert ks.TABLE == {"gpt": "mine", "new": 1} and report.installed == 2
        assert {e.where for e in report.entries} == {f"{M}:TABLE['gpt']", f"{M}:TABLE['new']"}
    assert before == ks.TABLE and ks.TABLE["gpt"] is ks.HANDLER
    with patch_registry.patched(Patch("only", f"{ks.M}:TABLE", {"mtp": 2}, kind="dict", clear=True)):
        assert ks.TABLE == {"mtp": 2}
    assert before == ks.TABLE and ks.TABLE["gpt"] is ks.HANDLER


def test_a_dict_patch_on_environ_undoes_only_its_own_changes(
    patch_registry: Registry, clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On exit a dict patch undoes its own keys only: a variable someone else set meanwhile stays (mock's is dropped)."""
    monkeypatch.setenv(ENV, "old")
    other = ENV + "_OTHER"
    with patch_registry.patched(Patch("env", "os:environ", {ENV: "new"}, kind="dict")):
        assert os.environ[ENV] == "new"
        monkeypatch.setenv(other, "theirs")
    assert os.environ[ENV] == "old" and os.environ[other] == "theirs"


def test_a_dict_patch_checks_ownership_per_key_and_refuses_bad_definitions(
    patch_registry: Registry, clean: None
) -> None:
    """A key changed by someone else inside the block refuses the revert; a non-mapping or key= is refused."""
    patch = Patch("table", f"{ks.M}:TABLE", {"gpt": "mine"}, kind="dict")
    patch_registry.apply(patch)
    ks.TABLE["gpt"] = "theirs"
    with pytest.raises(PatchOwnershipError):
        patch_registry.revert(patch)
    ks.TABLE["gpt"] = "mine"
    assert patch_registry.revert(patch) == 1 and ks.TABLE["gpt"] is ks.HANDLER
    with pytest.raises(PatchDefinitionError, match="mapping of keys"):
        Patch("d", f"{ks.M}:TABLE", [("a", 1)], kind="dict")
    with pytest.raises(PatchDefinitionError, match="leave key and create out"):
        Patch("d", f"{ks.M}:TABLE", {}, kind="dict", key="a")
    with pytest.raises(PatchDefinitionError, match="clear="):
        Patch("d", f"{ks.M}:TABLE", "x", kind="item", key="a", clear=True)
    with pytest.raises(PatchDefinitionError, match="environment"):
        Patch("d", "os:environ", {"A": 1}, kind="dict")
