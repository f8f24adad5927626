"""The docs site's sources: every public name is in the API reference, every page is in the navigation; the README's
tour runs as written."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PUBLIC = {
    "patchreg": "patchreg/__init__.py",
    "patches.megatron": "patches/megatron/__init__.py",
    "patches.vllm": "patches/vllm/__init__.py",
    "patchreg.distributed": "patchreg/distributed.py",
}


def _all_of(path: Path) -> list[str]:
    """The module's ``__all__``, read from its source (no import: patches.* would import torch and vLLM)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    msg = f"{path} has no __all__"
    raise AssertionError(msg)


def _reference_text() -> str:
    return "\n".join(p.read_text() for p in sorted((DOCS / "reference").glob("*.md")))


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_in_the_api_reference(module: str) -> None:
    """Each name in the module's __all__ has a `::: module.name` entry in docs/reference/ (mkdocstrings renders it)."""
    names = _all_of(ROOT / PUBLIC[module])
    assert names, module
    entries = set(re.findall(r"^::: ([\w.]+)\s*$", _reference_text(), flags=re.MULTILINE))
    missing = [name for name in names if f"{module}.{name}" not in entries]
    assert missing == [], f"add `::: {module}.<name>` to docs/reference/ for: {', '.join(missing)}"


def test_every_reference_entry_names_a_public_name() -> None:
    """No reference entry names something private or removed (mkdocs --strict would fail on a missing one)."""
    public = {f"{m}.{n}" for m, path in PUBLIC.items() for n in _all_of(ROOT / path)}
    public |= {"patchreg.distributed.assert_consistent", "patchreg.testing.patch_registry"}
    entries = re.findall(r"^::: ([\w.]+)\s*$", _reference_text(), flags=re.MULTILINE)
    assert sorted(set(entries) - public) == []
    assert len(entries) == len(set(entries)), "an entry is listed twice"


def test_every_page_is_in_the_navigation_and_exists() -> None:
    """mkdocs.yml's nav lists each Markdown file under docs/ once, and each listed file exists."""
    nav = re.findall(r":\s+([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.MULTILINE)
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages


def test_readme_is_short_and_its_quick_start_is_the_two_commands() -> None:
    """README.md stays within 12 KB and its Quick start is a code block of exactly `make demo` and `make test`."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024
    quick = text.split("## Quick start", 1)[1]
    assert re.match(r"\s*```\nmake demo\nmake test\n```\n", quick), quick[:80]


def test_readme_links_point_at_files_that_exist() -> None:
    """Each relative link in README.md names a file of the repository (the docs pages among them)."""
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    assert links
    assert [link for link in links if "://" not in link and not (ROOT / link).is_file()] == []


def test_the_examples_run_against_the_installed_packages() -> None:
    """No example puts the checkout on sys.path: each imports patchreg and patches as installed (pip, -e or wheel)."""
    edits = [
        p.name
        for p in sorted((ROOT / "examples").glob("*.py"))
        if re.search(r"sys\.path\.(insert|append)", p.read_text())
    ]
    assert edits == []


def readme_tour(text: str) -> str:
    """The Python block of the README's "A tour" section, as written."""
    found = re.search(r"```python\n(.*?)```", text.split("## A tour", 1)[1], flags=re.DOTALL)
    assert found, "README.md's tour has no ```python block"
    return found.group(1)


def test_the_readme_tour_runs_exactly_as_written(tmp_path: Path) -> None:
    """The tour, extracted from README.md, runs unchanged in a fresh interpreter outside the checkout: it builds the
    model (process group and parallel state included), steps it in the three blocks and prints both reports."""
    pytest.importorskip("megatron.core", reason="the tour needs patchreg[megatron]")
    script = tmp_path / "tour.py"
    script.write_text(readme_tour((ROOT / "README.md").read_text()))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT") and not k.startswith("PATCH")}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "log_postprocess" in result.stdout and "model._postprocess" in result.stdout  # registry.summary()
    assert "mtp_patched(detach_encoder=True) on GPTModel" in result.stdout  # print(report)
