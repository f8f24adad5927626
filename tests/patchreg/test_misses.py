"""The misses of issue 34: each ends in a clear PatchError or a documented no-op, with nothing left installed."""

from __future__ import annotations

import gc
import logging
import os
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from patchreg import (
    ABSENT,
    Patch,
    PatchDefinitionError,
    PatchError,
    Registry,
    TargetNotFoundError,
    UnpatchableTargetError,
)
from tests.patchreg import kinds_sample as ks

ENV = "PATCHREG_TEST_MISSES_VAR"


class _Big:
    """Something a model's mapping refers to."""


def test_a_reverted_item_patch_keeps_neither_its_mapping_nor_what_it_refers_to_alive(patch_registry: Registry) -> None:
    """Once the model is gone, a reverted item patch on its dict holds neither the dict nor its values."""
    model = ks.Holder()
    big = _Big()
    model.extra["big"] = big
    seen = weakref.ref(big)
    patch = Patch("new", "extra", 5, kind="item", key="new", create=True)
    with patch_registry.patched(patch, model) as report:
        assert model.extra["new"] == 5
    assert "model.extra['new']" in str(report)  # still named after the release
    del model, big
    gc.collect()
    assert seen() is None
    assert patch_registry.active() == ()


def test_items_on_an_objects_mapping_are_named_by_path(patch_registry: Registry) -> None:
    """explain, summary and the report name an item on an object's mapping by its path, never by address."""
    model = ks.Holder()
    patch = Patch("new", "extra", 5, kind="item", key="new", create=True)
    assert patch_registry.explain(patch, model).rows[0][1] == "model.extra['new']"
    with patch_registry.patched(patch, model) as report:
        texts = [patch_registry.summary(), str(report), str(patch_registry.explain(patch, model))]
        entries = patch_registry.active()
    for text in texts:
        assert "model.extra['new']" in text and "dict@" not in text, text
    assert entries[0].where == "model.extra['new']"


def test_a_pending_lazy_item_names_its_key(patch_registry: Registry) -> None:
    """The summary line of a lazy item patch still waiting for its module names the mapping and the key."""
    name = "tests.patchreg._never_imported_misses"
    patch = Patch("later", f"{name}:TABLE", 1, kind="item", key="k", create=True)
    report = patch_registry.apply(patch, lazy=True)
    try:
        assert report.pending == ("later",)
        (entry,) = patch_registry.active()
        assert entry.where == f"{name}:TABLE['k']"
        assert f"{name}:TABLE['k']" in patch_registry.summary()
    finally:
        patch_registry.revert(report)


@pytest.mark.parametrize(
    ("key", "value"),
    [(1, "x"), (ENV, 1), (ENV + "\0", "x"), (ENV + "=B", "x"), ("", "x"), (ENV, "x\0")],
    ids=["int-key", "int-value", "nul-in-name", "equals-in-name", "empty-name", "nul-in-value"],
)
def test_a_bad_environment_variable_is_a_patch_error(patch_registry: Registry, key: Any, value: Any) -> None:
    """os.environ with a non-str key or value, a NUL, an '=' in the name or an empty name is a PatchDefinitionError."""
    with pytest.raises(PatchDefinitionError, match="environment"):
        Patch("env", "os:environ", value, kind="item", key=key, create=True)
    holder = types.SimpleNamespace(env=os.environ)  # the same mapping through a selector: refused at apply
    with pytest.raises(PatchDefinitionError, match="environment"):
        patch_registry.apply(Patch("env", "env", value, kind="item", key=key, create=True), holder)
    assert patch_registry.active() == ()


class _Copying(dict):  # type: ignore[type-arg]
    """A mapping whose __setitem__ stores a copy of a list, not the list it was given."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, list(value) if isinstance(value, list) else value)


@pytest.fixture
def copying() -> Iterator[types.ModuleType]:
    """A module holding a _Copying mapping with one key."""
    module = types.ModuleType("patchreg_misses_copying")
    module.TABLE = _Copying()  # type: ignore[attr-defined]
    dict.__setitem__(module.TABLE, "k", [0])  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_mapping_that_stores_something_else_is_refused_at_apply(
    patch_registry: Registry, copying: types.ModuleType
) -> None:
    """A mapping whose __setitem__ stores other than what was set is refused at apply, its original back as it was."""
    original = copying.TABLE["k"]
    patch = Patch("c", f"{copying.__name__}:TABLE", [1], kind="item", key="k")
    with pytest.raises(UnpatchableTargetError, match="stored"), patch_registry.patched(patch):
        pass  # pragma: no cover
    assert copying.TABLE["k"] is original
    assert patch_registry.active() == ()
    created = Patch("c2", f"{copying.__name__}:TABLE", [1], kind="item", key="new", create=True)
    with pytest.raises(UnpatchableTargetError, match="stored"):
        patch_registry.apply(created)
    assert "new" not in copying.TABLE and patch_registry.active() == ()


@pytest.mark.parametrize("kind", ["value", "replace", "wrap", "item"])
def test_absent_is_refused_as_a_replacement(kind: str) -> None:
    """ABSENT, patchreg's own marker for 'not there', is no replacement or value of any kind."""
    with pytest.raises(PatchDefinitionError, match="ABSENT"):
        Patch("a", f"{ks.M}:FLAG", ABSENT, kind=kind, key="x" if kind == "item" else None)  # type: ignore[arg-type]


def test_strict_raises_without_also_logging_the_skips(
    patch_registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """strict=True raises on a skip that matters and logs nothing about it: one of the two is enough."""
    missing = Patch("strict-miss", f"{ks.M}:NOT_THERE_MISSES", 1, kind="value")
    with caplog.at_level(logging.WARNING, logger="patchreg"), pytest.raises(TargetNotFoundError):
        patch_registry.apply(missing, strict=True)
    block = patch_registry.patched(missing, strict=True)
    with caplog.at_level(logging.WARNING, logger="patchreg"), pytest.raises(PatchError), block:
        pass  # pragma: no cover
    assert [r.getMessage() for r in caplog.records if r.name == "patchreg"] == []
