"""requires() by what is importable: a vendor distribution that provides the import package answers for it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchreg import Patch, Registry, provider, refresh, requires
from tests.patchreg.helpers import plain


@pytest.fixture
def vendor_dist(tmp_path: Path) -> Iterator[Any]:
    """``make(dist, version, package)``: a fake installed distribution whose RECORD holds ``package/``."""

    def make(dist: str, version: str, package: str, *, then_refresh: bool = True) -> None:
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{package}/__init__.py,,\n{info.name}/METADATA,,\n")
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
        if then_refresh:
            refresh()

    sys.path.insert(0, str(tmp_path))
    try:
        yield make
    finally:
        sys.path.remove(str(tmp_path))
        refresh()


def test_vendor_distribution_answers_for_the_import_package(vendor_dist: Any) -> None:
    """A requirement on an uninstalled name holds when one other distribution provides that import package."""
    vendor_dist("fakepkg-xyz-cpu", "0.32.0", "fakepkg_xyz")
    ok = requires("fakepkg-xyz>=0.29").evaluate()
    assert (ok.ok, ok.reason) == (True, "fakepkg-xyz-cpu 0.32.0 provides fakepkg-xyz; 0.32.0 satisfies >=0.29")
    no = requires("fakepkg_xyz>=0.33").evaluate()
    assert (no.ok, no.reason) == (
        False,
        "fakepkg-xyz-cpu 0.32.0 provides fakepkg_xyz; 0.32.0 does not satisfy >=0.33",
    )
    found = provider("fakepkg-xyz")
    assert (found.distribution, found.version) == ("fakepkg-xyz-cpu", "0.32.0")


def test_two_providers_are_ambiguous(vendor_dist: Any) -> None:
    """When two distributions provide the import package, none is chosen and the reason names both."""
    vendor_dist("fakepkg-two-a", "1.0", "fakepkg_two")
    vendor_dist("fakepkg-two-b", "2.0", "fakepkg_two")
    answer = requires("fakepkg-two>=1").evaluate()
    assert not answer.ok
    assert answer.reason == (
        "fakepkg-two is not installed, and the import package fakepkg_two comes from "
        "fakepkg-two-a, fakepkg-two-b; require one of those by name"
    )


def test_provider_is_cached_until_refresh(vendor_dist: Any) -> None:
    """The distribution look-up is cached: a provider installed later is seen only after refresh()."""
    assert requires("fakepkg-late").evaluate().reason == "fakepkg-late is not installed"
    vendor_dist("fakepkg-late-cpu", "1.0", "fakepkg_late", then_refresh=False)
    assert not requires("fakepkg-late>=0").evaluate().ok  # another predicate, the same cached look-up
    refresh()
    assert requires("fakepkg-late>=0").evaluate().ok


def test_fingerprint_and_doctor_name_the_providing_distribution(vendor_dist: Any, patch_registry: Registry) -> None:
    """The fingerprint's and doctor's version of a requirement met by a vendor build names that build."""
    from patchreg import _cli

    vendor_dist("fakepkg-fp-cpu", "1.5", "fakepkg_fp")
    guarded = Patch("vendor-guarded", "tests.patchreg.sample:module_func", plain(1), when=requires("fakepkg-fp>=1"))
    with patch_registry.patched(guarded):
        assert "version fakepkg-fp==1.5 (fakepkg-fp-cpu)" in patch_registry.fingerprint_lines()
    assert _cli._version("fakepkg-fp") == "1.5 (fakepkg-fp-cpu)"
    assert _cli._version("no-such-dist-xyz") == "not installed"
