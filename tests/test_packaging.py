"""pyproject.toml declares what a build needs without deprecated forms."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression() -> None:
    """The license is an SPDX string (a TOML table makes setuptools warn on every build)."""
    data = _project()
    assert data["project"]["license"] == "Apache-2.0"  # type: ignore[index]
    requires = data["build-system"]["requires"]  # type: ignore[index]
    assert any(r.startswith("setuptools>=77") for r in requires), requires


def test_docs_extra_lists_the_site_builders() -> None:
    """The docs extra names mkdocs, Material and mkdocstrings' Python handler."""
    extra = " ".join(_project()["project"]["optional-dependencies"]["docs"])  # type: ignore[index]
    for name in ("mkdocs>=", "mkdocs-material", "mkdocstrings[python]"):
        assert name in extra, name


def test_the_declared_license_ships_as_a_file() -> None:
    """LICENSE holds the Apache-2.0 text the metadata declares, and pyproject names it as the license file."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert _project()["project"]["license-files"] == ["LICENSE"]  # type: ignore[index]


def test_classifiers_are_declared_without_a_license_classifier() -> None:
    """The project has classifiers (Python versions, typed) and no License classifier (the SPDX expression is it)."""
    classifiers = _project()["project"]["classifiers"]  # type: ignore[index]
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3.12" in classifiers
    assert [c for c in classifiers if c.startswith("License ::")] == []


def test_the_sdist_leaves_the_test_suite_out() -> None:
    """MANIFEST.in prunes tests/: the suite reads examples/, docs/ and scripts/, which the sdist does not ship."""
    assert "prune tests" in (ROOT / "MANIFEST.in").read_text().splitlines()
