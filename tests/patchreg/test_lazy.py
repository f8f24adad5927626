"""Lazy patching: import-path patches installed by a post-import hook when their module is imported."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchreg import Patch, PatchSet, Registry, requires
from tests.patchreg.helpers import plain


@pytest.fixture
def late_module(tmp_path: Path) -> Iterator[Any]:
    """A module file in tmp_path, importable by a unique name, not imported yet."""
    counter = [0]
    names: list[str] = []

    def make() -> str:
        counter[0] += 1
        name = f"patchreg_late_{id(tmp_path):x}_{counter[0]}"
        (tmp_path / f"{name}.py").write_text(
            "def greet():\n    return 'hello'\n\nclass K:\n    def m(self):\n        return 'k'\n"
        )
        names.append(name)
        return name

    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield make
    finally:
        sys.path.remove(str(tmp_path))
        for name in names:
            sys.modules.pop(name, None)


def test_installed_when_module_is_imported(patch_registry: Registry, late_module: Any) -> None:
    """A lazy patch is pending until the import, then installed, and reverts normally."""
    name = late_module()
    p = Patch("greet", f"{name}:greet", plain("patched"))
    report = patch_registry.apply(p, lazy=True)
    assert report.installed == 0 and report.pending == ("greet",)
    assert "pending" in patch_registry.summary()
    assert "installed when its module is imported" in str(report)
    module = importlib.import_module(name)
    assert module.greet() == "patched"
    assert report.pending == ()
    assert [e.state for e in patch_registry.active()] == ["active"]
    assert patch_registry.revert(report) == 1
    assert module.greet() == "hello"
    assert "greet" not in vars(module) or vars(module)["greet"].__name__ == "greet"


def test_revert_before_import_cancels(patch_registry: Registry, late_module: Any) -> None:
    """Reverting before the import cancels the hook: it never fires later."""
    name = late_module()
    p = PatchSet("s", [Patch("greet", f"{name}:greet", plain("patched"))])
    report = patch_registry.apply(p, lazy=True)
    assert patch_registry.revert(p) == 0
    assert patch_registry.active() == ()
    module = importlib.import_module(name)
    assert module.greet() == "hello"
    assert patch_registry.revert(report) == 0


def test_predicate_evaluated_at_import(patch_registry: Registry, late_module: Any) -> None:
    """A lazy patch whose predicate is false at import time is skipped, not installed."""
    name = late_module()
    report = patch_registry.apply(Patch("k", f"{name}:K.m", plain(1), when=requires("attrs<1")), lazy=True)
    module = importlib.import_module(name)
    assert module.K().m() == "k"
    assert report.pending == ()
    assert patch_registry.active() == ()


def test_already_imported_modules_install_now(patch_registry: Registry) -> None:
    """lazy=True installs at once when the module is already imported."""
    report = patch_registry.apply(Patch("f", "tests.patchreg.sample:module_func", plain(1)), lazy=True)
    assert report.installed == 1 and report.pending == ()
    patch_registry.revert(report)


def test_block_exit_before_import_cancels(patch_registry: Registry, late_module: Any) -> None:
    """A patched() block exited before the import leaves nothing pending."""
    name = late_module()
    p = Patch("greet", f"{name}:greet", plain("patched"))
    report = patch_registry.apply(p, lazy=True)
    patch_registry.revert_all()
    assert report.pending == ()
    assert importlib.import_module(name).greet() == "hello"


def test_failed_lazy_install_releases_only_itself(
    patch_registry: Registry, late_module: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A lazy patch that fails at import (a conflict) is marked failed; the set's other installs stay."""
    eager, late = late_module(), late_module()
    first = importlib.import_module(eager)
    patch_registry.apply(Patch("other", f"{late}:greet", plain("other")), lazy=True)
    report = patch_registry.apply(
        PatchSet("s", [Patch("a", f"{eager}:greet", plain("a")), Patch("b", f"{late}:greet", plain("b"))]), lazy=True
    )
    module = importlib.import_module(late)  # 'other' installs first, then 'b' conflicts with it
    assert "lazy patch b" in caplog.text and "failed" in caplog.text
    assert first.greet() == "a" and module.greet() == "other"
    assert not report.reverted and report.held == 1
    assert patch_registry.revert(report) == 1
    assert first.greet() == "hello"
    patch_registry.revert_all()


def test_rollback_keeps_a_lazy_patch_applied_before_the_checkpoint(patch_registry: Registry, late_module: Any) -> None:
    """A lazy patch applied before a checkpoint and installed after it is not rolled back."""
    name = late_module()
    report = patch_registry.apply(Patch("greet", f"{name}:greet", plain("patched")), lazy=True)
    checkpoint = patch_registry.checkpoint()
    module = importlib.import_module(name)
    assert patch_registry.rollback(checkpoint) == 0
    assert module.greet() == "patched" and report.held == 1
    assert patch_registry.revert(report) == 1
    assert module.greet() == "hello"


def test_explain_imports_nothing(patch_registry: Registry, late_module: Any) -> None:
    """explain() of a module a lazy patch waits for says so, and neither imports it nor fires that patch."""
    name = late_module()
    p = Patch("greet", f"{name}:greet", plain("patched"))
    patch_registry.apply(p, lazy=True)
    (row,) = patch_registry.explain(p).rows
    assert row[2] == "import" and "lazy patches wait for it" in row[3]
    assert name not in sys.modules
    assert [e.state for e in patch_registry.active()] == ["pending"]


def test_pending_entries_read_like_installs(patch_registry: Registry, late_module: Any) -> None:
    """A pending entry names its holder (module, then class) and attribute as the install will; repr counts it."""
    name = late_module()
    patch_registry.apply(
        PatchSet("late", (Patch("g", f"{name}:greet", plain("p")), Patch("m", f"{name}:K.m", plain("p")))), lazy=True
    )
    assert [(e.holder, e.attr) for e in patch_registry.active()] == [(name, "greet"), (f"{name}.K", "m")]
    assert "0 active install(s)" in repr(patch_registry) and "2 pending" in repr(patch_registry)
    assert "0 active install(s), 2 pending" in patch_registry.summary()
    module = importlib.import_module(name)
    assert [(e.holder, e.attr) for e in patch_registry.active()] == [(name, "greet"), (f"{name}.K", "m")]
    assert module.greet() == "p"


def test_a_lazy_skip_is_in_the_report(patch_registry: Registry, late_module: Any) -> None:
    """A lazy patch whose predicate fails when its module is imported is listed in its apply's skipped."""
    name = late_module()
    report = patch_registry.apply(Patch("g", f"{name}:greet", plain("p"), when=requires("packaging>=999")), lazy=True)
    assert report.skipped == ()
    module = importlib.import_module(name)
    assert module.greet() == "hello"
    ((skipped, reason),) = report.skipped
    assert skipped == "g" and ">=999" in reason
