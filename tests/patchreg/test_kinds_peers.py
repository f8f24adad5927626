"""The peers' own cases for deletion, prepend and whole mappings (pytest's delattr/delitem/delenv, setenv(prepend=),
mock.patch.dict with clear=True), run against kind="delete", prepend= and kind="dict" (issue 43's seven misses)."""

from __future__ import annotations

import collections
import os

import pytest

from patchreg import (
    Patch,
    PatchDefinitionError,
    Registry,
    UnpatchableTargetError,
)
from tests.patchreg import kinds_sample as ks

M = "tests.patchreg.kinds_sample"
ENV = "PATCHREG_TEST_PEERS_VAR"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ENV`` set to "old" for the test, as it was after (pytest's own setenv)."""
    monkeypatch.setenv(ENV, "old")


def _twice(registry: Registry, patch: Patch, gone: object) -> None:
    """Two applies share one deletion: the first revert keeps it, the second puts the value back."""
    first = registry.apply(patch)
    second = registry.apply(patch)
    assert first.installed >= 1 and second.installed == 0 and second.skipped == ()
    assert [e.count for e in registry.active()] == [2] * len(registry.active())
    registry.revert(first)
    assert not _there(gone)
    registry.revert(second)
    assert registry.active() == ()


def _there(where: object) -> bool:
    mapping, key = where  # type: ignore[misc]
    return key in mapping  # type: ignore[operator]


@pytest.mark.parametrize("what", ["attribute", "key", "variable"])
def test_a_deletion_applied_twice_is_shared_until_its_last_user_reverts(
    patch_registry: Registry, env: None, what: str
) -> None:
    """A deletion applied twice is one install with two users: still absent after the first revert, back after the
    second (pytest's delattr/delitem/delenv, counted)."""
    patch, where = {
        "attribute": (Patch("no-flag", f"{M}:FLAG", None, kind="delete"), (vars(ks), "FLAG")),
        "key": (Patch("no-gpt", f"{M}:TABLE", None, kind="delete", key="gpt"), (ks.TABLE, "gpt")),
        "variable": (Patch("no-env", "os:environ", None, kind="delete", key=ENV), (os.environ, ENV)),
    }[what]
    _twice(patch_registry, patch, where)
    assert _there(where)
    assert ks.FLAG is False and ks.TABLE["gpt"] is ks.HANDLER and os.environ[ENV] == "old"


def test_the_keys_clear_true_cleared_are_shared_by_a_second_apply(patch_registry: Registry) -> None:
    """A second apply of a clear=True dict patch shares the keys the first cleared: they stay absent until the last
    revert, then come back."""
    patch = Patch("only", f"{M}:TABLE", {"mtp": 1}, kind="dict", clear=True)
    first = patch_registry.apply(patch)
    second = patch_registry.apply(patch)
    assert second.installed == 0 and {e.where: e.count for e in second.entries} == {
        f"{M}:TABLE['mtp']": 2,
        f"{M}:TABLE['gpt']": 2,
    }
    patch_registry.revert(first)
    assert ks.TABLE == {"mtp": 1}
    patch_registry.revert(second)
    assert ks.TABLE == {"gpt": ks.HANDLER}


def test_deleting_what_a_slots_instance_inherits_is_a_skip(patch_registry: Registry) -> None:
    """An attribute a __slots__ instance only inherits is nothing to delete there: a skip with the reason."""
    holder = ks.Slotted()
    report = patch_registry.apply(Patch("no-method", "method", None, kind="delete"), holder)
    assert report.installed == 0 and "not in its own namespace" in report.skipped[0][1]
    assert holder.method() == "class"


@pytest.mark.parametrize("values", [{ENV: "bad\0value"}, {"A=B": "x"}, {ENV: 1}])
def test_a_dict_patch_on_environ_through_another_import_path_is_refused_cleanly(
    patch_registry: Registry, env: None, values: dict[str, object]
) -> None:
    """os.environ reached as kinds_sample:environ gets os.environ's rules: a PatchDefinitionError, nothing changed."""
    before = dict(os.environ)
    with pytest.raises(PatchDefinitionError, match="environ"):
        patch_registry.apply(Patch("env", f"{M}:environ", values, kind="dict"))
    assert dict(os.environ) == before and patch_registry.active() == ()


def test_a_nul_separator_prepended_to_a_set_variable_is_refused_cleanly(patch_registry: Registry, env: None) -> None:
    """prepend='\\0' over a variable that is set is a PatchDefinitionError (os.putenv's rule), nothing changed."""
    with pytest.raises(PatchDefinitionError, match="NUL"):
        patch_registry.apply(Patch("path", "os:environ", "/opt", kind="item", key=ENV, prepend="\0"))
    assert os.environ[ENV] == "old" and patch_registry.active() == ()


@pytest.mark.parametrize("key", ["count", "raw", "none"])
def test_prepending_onto_a_value_that_is_not_a_str_is_refused(patch_registry: Registry, key: str) -> None:
    """prepend= onto an int, bytes or None is refused (joining would drop the old value), and nothing changes."""
    before = dict(ks.MIXED)
    with pytest.raises(UnpatchableTargetError, match="not a str"):
        patch_registry.apply(Patch("pre", f"{M}:MIXED", "x", kind="item", key=key, prepend=":"))
    assert before == ks.MIXED and all(ks.MIXED[k] is v for k, v in before.items())


def test_the_summary_of_a_pending_dict_patch_names_each_key(patch_registry: Registry) -> None:
    """A lazy dict patch waiting for its module shows a line per key it sets, not the key None."""
    name = "patchreg_peers_never_imported"
    patch_registry.apply(Patch("late", f"{name}:TABLE", {"a": 1, "b": 2}, kind="dict"), lazy=True)
    entries = patch_registry.active()
    assert [(e.state, e.where) for e in entries] == [("pending", f"{name}:TABLE['a']"), ("pending", f"{name}:TABLE['b']")]
    assert "None" not in patch_registry.summary()
    patch_registry.revert_all()


def test_a_clear_true_block_leaves_an_ordered_dict_equal_to_its_copy(patch_registry: Registry) -> None:
    """After a clear=True block an OrderedDict has its keys back in their order (it equals its copy, as mock's)."""
    copy = collections.OrderedDict(ks.ORDERED)
    with patch_registry.patched(Patch("only-b", f"{M}:ORDERED", {"b": 20}, kind="dict", clear=True)):
        assert list(ks.ORDERED.items()) == [("b", 20)]
    assert copy == ks.ORDERED and list(ks.ORDERED) == ["a", "b", "c"]
