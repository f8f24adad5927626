"""Discovery: module-level sets in known modules, the patchreg.patchsets entry-point group, load failures."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchreg._discovery import ENTRY_POINT_GROUP, discover

ROOT = Path(__file__).resolve().parents[2]

DUMMY_MODULE = '''
"""A third-party library's patch sets."""
from patchreg import Patch, PatchSet

def loud(x):
    """Say it louder."""
    return "LOUD"

PATCHES = PatchSet("dummy-loud", [Patch("loud", "dummy_patches:quiet", loud)], doc="A dummy set.")

def quiet(x):
    return x

def make():
    return PatchSet("dummy-made", [Patch("made", "dummy_patches:quiet", loud)])

def not_a_set():
    return 42

def exits():
    raise SystemExit("no GPU here")
'''

ENTRY_POINTS = f"""
[{ENTRY_POINT_GROUP}]
loud = dummy_patches:PATCHES
made = dummy_patches:make
missing = dummy_patches:no_such_name
wrong = dummy_patches:not_a_set
exits = dummy_patches:exits

[console_scripts]
dummy = dummy_patches:quiet
"""


@pytest.fixture
def clean_modules() -> Iterator[None]:
    """Forget every module the test imported, so module files made in tmp_path do not leak."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture
def dummy_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_modules: None) -> Path:
    """An installed distribution 'dummy-patches 1.0' on a tmp sys.path entry, declaring five entry points."""
    (tmp_path / "dummy_patches.py").write_text(DUMMY_MODULE)
    info = tmp_path / "dummy_patches-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dummy-patches\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_entry_points_name_a_patch_set_or_a_factory(dummy_dist: Path) -> None:
    """An entry point naming a PatchSet, or a zero-argument callable returning one, yields that set."""
    found = discover((), ())
    by_name = {f.name: f for f in found.sets if f.source.endswith("from dummy-patches 1.0")}  # not patchreg's own
    assert set(by_name) == {"dummy-loud", "dummy-made"}
    assert by_name["dummy-loud"].source == "entry point loud = dummy_patches:PATCHES from dummy-patches 1.0"
    assert by_name["dummy-loud"].origin == "loud"
    assert by_name["dummy-made"].patch_set.names == ("made",)


def test_bad_entry_points_are_reported_not_raised(dummy_dist: Path) -> None:
    """A missing attribute or a callable returning something else becomes a load error with the reason."""
    errors = {e.origin: e.reason for e in discover((), ()).errors}
    assert set(errors) == {"missing", "wrong", "exits"}
    assert errors["missing"].startswith("entry point missing = dummy_patches:no_such_name from dummy-patches 1.0")
    assert "AttributeError" in errors["missing"]
    assert "returned 42, not a PatchSet" in errors["wrong"]


def test_only_the_patchsets_group_is_loaded(dummy_dist: Path) -> None:
    """Entry points of other groups are never loaded, and group=None loads none at all."""
    assert discover((), (), group=None).sets == ()
    assert "dummy_patches" not in sys.modules
    found = discover((), ())
    assert "dummy" not in {f.origin for f in found.sets} | {e.origin for e in found.errors}


def test_missing_and_failing_modules_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_modules: None
) -> None:
    """A module that is not installed, or raises on import, is a load error naming the cause; others still load."""
    (tmp_path / "raising_patches.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover(("not_a_module_xyz", "raising_patches", "needs_dep", "tests.patchreg.cli_sample"), (), group=None)
    reasons = {e.origin: e.reason for e in found.errors}
    assert (
        reasons["not_a_module_xyz"] == "module not_a_module_xyz is not installed (no module named 'not_a_module_xyz')"
    )
    assert reasons["raising_patches"] == "importing raising_patches failed: RuntimeError: boom at import"
    assert reasons["needs_dep"].startswith("importing needs_dep failed: ModuleNotFoundError")
    assert [f.name for f in found.sets] == ["sample-ready", "sample-skipping"]


def test_an_entry_point_that_exits_is_a_load_error(dummy_dist: Path) -> None:
    """An entry point whose callable raises SystemExit is a load error naming it and the exit code."""
    errors = {e.origin: e.reason for e in discover((), ()).errors}
    assert errors["exits"] == (
        "entry point exits = dummy_patches:exits from dummy-patches 1.0 failed to load: SystemExit with exit code "
        "'no GPU here': it exits when loaded; keep command-line code under `if __name__ == '__main__':`"
    )


def test_a_module_that_exits_at_import_is_a_load_error_but_an_interrupt_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_modules: None
) -> None:
    """SystemExit at import becomes a load error with the exit code; KeyboardInterrupt still stops discovery."""
    (tmp_path / "exiting_patches.py").write_text("import sys\nsys.exit(2)\n")
    (tmp_path / "interrupted_patches.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover(("exiting_patches", "tests.patchreg.cli_sample"), (), group=None)
    assert [(e.source, e.origin) for e in found.errors] == [("module exiting_patches", "exiting_patches")]
    assert found.errors[0].reason.startswith("importing exiting_patches failed: SystemExit with exit code 2: ")
    assert [f.name for f in found.sets] == ["sample-ready", "sample-skipping"]
    with pytest.raises(KeyboardInterrupt):
        discover(("interrupted_patches",), (), group=None)


def test_package_submodules_are_scanned_and_sets_deduplicated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_modules: None
) -> None:
    """Public submodules of a known package are scanned; a re-exported set is listed once, at its definition."""
    pkg = tmp_path / "pkg_patches"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg_patches.real import SET\n")
    (pkg / "real.py").write_text(
        "from patchreg import Patch, PatchSet\n"
        "SET = PatchSet('pkg-set', [Patch('p', 'pkg_patches.real:f', print)])\n"
        "ALIAS = SET\n"
    )
    (pkg / "_private.py").write_text("raise RuntimeError('private modules are not scanned')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover((), ("pkg_patches",), group=None)
    assert [(f.name, f.source) for f in found.sets] == [("pkg-set", "module pkg_patches.real")]
    assert found.errors == ()


def test_cli_lists_an_installed_distributions_sets(dummy_dist: Path) -> None:
    """`python -m patchreg list` shows entry-point sets with their distribution, and the ones that failed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dummy_dist), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "patchreg", "list"], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dummy-loud "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    row = " ".join(lines[start:end]).split()  # the row and its continuation lines (cells wrap to fit 100 columns)
    assert row[:2] == ["dummy-loud", "1"]
    assert {"entry", "point", "loud", "=", "dummy_patches:PATCHES", "from", "dummy-patches", "1.0"} <= set(row)
    assert {"A", "dummy", "set."} <= set(row)
    text = " ".join(result.stdout.split())
    assert "entry point missing = dummy_patches:no_such_name from dummy-patches 1.0 failed to load" in text


def test_our_sets_are_bundled_and_a_users_are_not(dummy_dist: Path) -> None:
    """Sets from patchreg's own patches folder (modules and patchreg's entry points) are bundled; others are not."""
    found = discover(("patches.megatron.cpu", "tests.patchreg.cli_sample"), ())
    bundled = {f.name: f.bundled for f in found.sets}
    assert bundled["megatron-cpu"] is True
    assert bundled["sample-ready"] is False and bundled["dummy-loud"] is False  # -m module, another distribution
    ours = [f for f in found.sets if f.source.endswith(f"from patchreg {__import__('patchreg').__version__}")]
    assert ours and all(f.bundled for f in ours)  # verl-mtp, megatron-bridge: patchreg's own entry points
