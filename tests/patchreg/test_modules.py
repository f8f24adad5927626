"""Where module names resolve without importing (``_modules``): the longest module prefix, and a shadowed ``patches``.

The shadowing cases run in a fresh ``python -S`` whose path puts a user's own ``patches`` package first, then the
checkout, then this environment's site-packages (without its .pth files, so no editable finder answers for us): the
route of a user whose project folder holds a ``patches/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from patchreg._sources import found_module, is_ours, missing_package, ours, shadowed_by, shadowing

ROOT = Path(__file__).resolve().parents[2]


def test_found_module_is_the_longest_module_prefix_and_imports_nothing() -> None:
    """A dotted name gives its longest module prefix; nothing is imported to find it."""
    assert found_module("os.path") == "os.path"
    assert found_module("tests.patchreg.sample.Child.method") == "tests.patchreg.sample"
    assert found_module("no_such_package_xyz.mod") == ""
    if "wsgiref.simple_server" not in sys.modules:
        assert found_module("wsgiref.simple_server.WSGIServer") == "wsgiref.simple_server"
        assert "wsgiref.simple_server" not in sys.modules


def test_our_patches_is_not_shadowed_here() -> None:
    """In the checkout, `patches` is ours: no shadowing, and our modules are ours."""
    import patches.megatron

    assert shadowing() == "" and shadowed_by() == ""
    assert is_ours(patches.megatron) and ours() == ROOT / "patches"
    assert not is_ours(sys.modules["tests.patchreg"])


@pytest.fixture
def shadowed(tmp_path: Path) -> Path:
    """A project folder holding the user's own `patches` package (with an __init__.py)."""
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "__init__.py").write_text('"""My own patches."""\n')
    return tmp_path


def _run(project: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -S argv`` from ``project``, with the project first on the path, then the checkout and site-packages."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT), sysconfig.get_paths()["purelib"]])
    cmd = [sys.executable, "-S", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=project, timeout=300, check=False)


def test_list_and_doctor_name_the_folder_in_the_way_and_the_remedy(shadowed: Path) -> None:
    """`list` (exit 0) and `doctor` (exit 1) say our sets are not loaded, naming the user's folder and the remedy;
    patchreg's own entry points say so too."""
    listed = _run(shadowed, "-m", "patchreg", "list")
    doctor = _run(shadowed, "-m", "patchreg", "doctor")
    assert listed.returncode == 0 and doctor.returncode == 1, listed.stdout + doctor.stdout
    for out in (listed.stdout, doctor.stdout):
        text = "".join(out.split())  # the lines are wrapped to 100 columns, long paths too

        def says(words: str, text: str = text) -> bool:
            return "".join(words.split()) in text

        assert says(f"the top-level name 'patches' is '{shadowed / 'patches'}'")
        assert says("rename your own 'patches'") and not says("is not installed")
        assert says("entry point verl-mtp = patches.verl.mtp:VERL_MTP from patchreg")
        assert says(f"failed to load: 'patches' is '{shadowed / 'patches'}', not patchreg's patch sets")
    assert all(len(line) <= 100 for line in listed.stdout.splitlines())


def test_import_of_our_subpackage_names_the_folder_in_the_way(shadowed: Path) -> None:
    """After `import patchreg`, `import patches.megatron` fails naming the user's folder, ours, and the remedy."""
    result = _run(shadowed, "-c", "import patchreg, patches.megatron")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: No module named 'patches.megatron': the top-level name 'patches' is")
    assert str(shadowed / "patches") in last and str(ROOT / "patches") in last and "rename your own" in last


def test_a_users_own_subpackage_of_patches_still_imports(shadowed: Path) -> None:
    """The finder answers only what no other finder found: the user's own `patches.mine` imports as before."""
    (shadowed / "patches" / "mine.py").write_text("VALUE = 1\n")
    result = _run(shadowed, "-c", "import patchreg, patches.mine; print(patches.mine.VALUE)")
    assert result.returncode == 0 and result.stdout.strip() == "1", result.stderr


def test_missing_package_stops_at_the_installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a namespace package the missing package is its missing subpackage (megatron.bridge under megatron); a
    module a release lacks inside an installed package is not a missing package."""
    (tmp_path / "ns_xyz" / "core").mkdir(parents=True)  # ns_xyz: a namespace package; ns_xyz.core: a regular one
    (tmp_path / "ns_xyz" / "core" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert missing_package("ns_xyz.core.models.absent_in_this_release") == ""
    assert missing_package("ns_xyz.bridge.models.gpt") == "ns_xyz.bridge"
    assert missing_package("no_such_package_xyz.mod") == "no_such_package_xyz"
    assert missing_package("tests.patchreg.no_such_module_xyz") == ""
    assert "ns_xyz" not in sys.modules and "ns_xyz.core" not in sys.modules  # found, not imported
