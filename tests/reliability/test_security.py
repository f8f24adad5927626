"""Security: nothing is imported or executed from a string the user did not name."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchreg._discovery import ENTRY_POINT_GROUP, discover

ROOT = Path(__file__).resolve().parents[2]

ENTRY_POINTS = f"""\
[{ENTRY_POINT_GROUP}]
declared = sec_declared_mod:PATCHES

[console_scripts]
sec-tool = sec_other_group_mod:main

[some.other.group]
other = sec_other_group_mod:main
"""

_MODULE = """\
import os
from patchreg import Patch, PatchSet
open(os.path.join({marker_dir!r}, {name!r}), "w").close()
PATCHES = PatchSet("sec-declared", [Patch("p", "tests.reliability.targets:module_func", lambda x: x)])
def main():
    return PATCHES
"""


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution declaring one patchreg entry point and two in other groups, plus an undeclared module."""
    markers = tmp_path / "markers"
    markers.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    for name in ("sec_declared_mod", "sec_other_group_mod", "patchreg_sec_undeclared"):
        (site / f"{name}.py").write_text(_MODULE.format(marker_dir=str(markers), name=name))
    info = site / "sec_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sec-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    yield markers
    for name in ("sec_declared_mod", "sec_other_group_mod", "patchreg_sec_undeclared"):
        sys.modules.pop(name, None)


def test_discovery_loads_only_the_declared_group(planted: Path) -> None:
    """discover() imports the module of the declared patchreg entry point and nothing from other groups or sys.path."""
    found = discover(modules=(), packages=())
    assert "sec-declared" in [f.name for f in found.sets]
    assert sorted(p.name for p in planted.iterdir()) == ["sec_declared_mod"]
    assert "sec_other_group_mod" not in sys.modules
    assert "patchreg_sec_undeclared" not in sys.modules


def test_discovery_without_group_loads_no_entry_point(planted: Path) -> None:
    """discover(group=None) loads no entry point at all."""
    discover(modules=(), packages=(), group=None)
    assert list(planted.iterdir()) == []


_BANNED = {"eval", "exec", "compile", "__import__"}
_ALLOWED_LOADS = ("json.loads(", "ep.load(")  # JSON parsing, and loading a declared entry point


def _offending_calls(path: Path) -> list[str]:
    """Calls in ``path`` that evaluate or unpickle strings: eval/exec/compile/__import__, any load(s) but JSON's."""
    text = path.read_text()
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        segment = ast.get_source_segment(text, node) or name
        builtin = isinstance(func, ast.Name) or segment.startswith("builtins.")  # re.compile is fine
        if (name in _BANNED and builtin) or (name in ("load", "loads") and not segment.startswith(_ALLOWED_LOADS)):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {segment[:60]}")
    return out


@pytest.mark.parametrize("package", ["patchreg", "patches"])
def test_library_code_never_evaluates_strings(package: str) -> None:
    """No eval, exec, compile, __import__ or unpickling anywhere in the library or the patch sets (JSON only)."""
    offenders = [hit for path in sorted((ROOT / package).rglob("*.py")) for hit in _offending_calls(path)]
    assert offenders == []


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('touch {marker}')",
        "{{'method': 'mtp', 'x': open('{marker}', 'w')}}",
        "[open('{marker}', 'w')]",
    ],
)
def test_speculative_config_is_parsed_as_json_never_evaluated(tmp_path: Path, text: str) -> None:
    """A Python expression given as the speculative config is refused as malformed JSON and never runs."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from patches.vllm.mtp import build_mtp_speculative_config

    marker = tmp_path / "ran"
    with pytest.raises((ValueError, TypeError)):
        build_mtp_speculative_config(engine_speculative_config=text.format(marker=marker))
    assert not marker.exists()
    assert build_mtp_speculative_config(engine_speculative_config='{"method": "mtp"}')["method"] == "mtp"
