"""bootstrap(): the sets named in PATCHREG_PATCHSETS, applied once per process, in a fresh process each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A third-party distribution with two import-path sets and one selector set, installed on a tmp sys.path entry.
DIST_MODULE = '''
from patchreg import Patch, PatchSet

def quiet(x):
    return x

def louder(x):
    return "LOUD"

def first(x):
    return "first"

LOUD = PatchSet("boot-loud", [Patch("loud", "boot_patches:quiet", louder)])
FIRST = PatchSet("boot-first", [Patch("first", "boot_patches:quiet", first)])
ALSO = PatchSet("boot-also", [Patch("also", "boot_patches:OTHER", 2, kind="value")])
BOUND = PatchSet("boot-bound", [Patch("bound", "method", louder)])
LATER = PatchSet("boot-later", [Patch("later", "boot_later:f", louder)])
OTHER = 1
'''

ENTRY_POINTS = """
[patchreg.patchsets]
loud = boot_patches:LOUD
first = boot_patches:FIRST
also = boot_patches:ALSO
bound = boot_patches:BOUND
later = boot_patches:LATER
"""

# What the child reports: bootstrap's reports (twice), what is active, and whether patch sets were imported.
PROBE = """
import json, sys
import patchreg
out = {"imported_patches": sorted(m for m in sys.modules if m.startswith(("patches", "boot_")))}
try:
    first = patchreg.bootstrap()
    again = patchreg.bootstrap()
    out["installed"] = [r.installed for r in first]
    out["again_installed"] = [r.installed for r in again]
    out["same_reports"] = all(a is b for a, b in zip(first, again)) and len(first) == len(again)
except patchreg.PatchError as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
out["active"] = sorted((i.patch, i.count) for i in patchreg.registry.active())
if "boot_patches" in sys.modules:
    import boot_patches
    out["quiet"] = boot_patches.quiet(0)
    out["other"] = boot_patches.OTHER
print(json.dumps(out))
"""


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    """A distribution 'boot-patches 1.0' declaring five patch sets, on a tmp path for the child process."""
    (tmp_path / "boot_patches.py").write_text(DIST_MODULE)
    (tmp_path / "boot_later.py").write_text("def f(x):\n    return 'plain'\n")
    info = tmp_path / "boot_patches-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boot-patches\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return tmp_path


def run(dist: Path, value: str | None, code: str = PROBE) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter with PATCHREG_PATCHSETS set to ``value`` (unset for None)."""
    env = {k: v for k, v in os.environ.items() if k != "PATCHREG_PATCHSETS"}
    env["PYTHONPATH"] = os.pathsep.join([str(dist), str(ROOT)])
    if value is not None:
        env["PATCHREG_PATCHSETS"] = value
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize("value", [None, "", " , "])
def test_unset_or_empty_does_nothing_and_imports_no_patch_set(dist: Path, value: str | None) -> None:
    """With PATCHREG_PATCHSETS unset or naming nothing, bootstrap installs nothing and imports no patch module."""
    out = run(dist, value)
    assert out["installed"] == []
    assert out["active"] == []
    assert out["imported_patches"] == []
    assert "quiet" not in out  # boot_patches was never imported


def test_named_sets_install_once_and_are_held(dist: Path) -> None:
    """Each named set installs once; a second call installs nothing, returns the same reports, counts stay 1."""
    out = run(dist, "boot-loud, boot-also,boot-loud")
    assert out["installed"] == [1, 1]
    assert out["again_installed"] == [1, 1]
    assert out["same_reports"] is True
    assert out["active"] == [["also", 1], ["loud", 1]]
    assert out["quiet"] == "LOUD"
    assert out["other"] == 2


def test_an_unknown_name_raises_naming_the_known_sets_and_installs_nothing(dist: Path) -> None:
    """An unknown name is a PatchError naming it and the known sets; the valid names beside it install nothing."""
    out = run(dist, "boot-loud,no-such-set")
    error = str(out["error"])
    assert error.startswith("PatchError: PATCHREG_PATCHSETS names unknown patch set(s) 'no-such-set'; known sets:")
    assert "boot-loud" in error and "megatron-cpu" in error and "patchreg list" in error
    assert out["active"] == []


def test_a_set_that_needs_an_object_is_refused_and_nothing_installs(dist: Path) -> None:
    """A set with a selector patch cannot come from the environment: refused, naming the patch and the remedy."""
    out = run(dist, "boot-loud,boot-bound")
    error = str(out["error"])
    assert error.startswith("PatchDefinitionError: PATCHREG_PATCHSETS names patch set 'boot-bound'")
    assert "'bound'" in error and "apply it in code with the object" in error
    assert out["active"] == []


def test_a_failing_set_reverts_the_sets_before_it(dist: Path) -> None:
    """When a later set fails to apply (a replace conflict), the sets this call applied before it are reverted."""
    out = run(dist, "boot-loud,boot-first")
    assert str(out["error"]).startswith("PatchConflictError")
    assert out["active"] == []
    assert out["quiet"] == 0


def test_a_set_for_a_module_not_yet_imported_installs_on_import(dist: Path) -> None:
    """bootstrap applies lazily: a patch of a module imported later is installed when it is imported."""
    code = PROBE + "import boot_later; print(json.dumps([boot_later.f(0), patchreg.registry.is_active('later')]))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dist), str(ROOT)]), "PATCHREG_PATCHSETS": "boot-later"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == ["LOUD", True]


def test_the_vllm_plugin_entry_point_is_bootstrap() -> None:
    """patchreg declares a vllm.general_plugins entry point named 'patchreg' that loads bootstrap()."""
    import importlib.metadata

    import patchreg

    eps = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins") if ep.name == "patchreg"]
    assert eps, "reinstall the checkout (make env): its entry points are missing"
    assert {ep.load() for ep in eps} == {patchreg.bootstrap}


def test_a_dotted_selector_named_from_the_environment_is_told_its_import_path() -> None:
    """A set whose patch targets 'json.dumps' (a selector) is refused with the import path 'json:dumps' it may mean."""
    from patchreg import Patch, PatchDefinitionError, PatchSet
    from patchreg._discovery import Discovery, Found
    from patchreg._discovery import named as _find

    dotted = PatchSet("boot-dotted", [Patch("dumps", "json.dumps", lambda *a, **k: "{}")])
    found = Discovery((Found(dotted, "module boot_dotted", "boot_dotted"),), ())
    with pytest.raises(PatchDefinitionError, match="write the import path 'json:dumps'"):
        _find(["boot-dotted"], found)
