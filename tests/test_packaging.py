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
