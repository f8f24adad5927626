"""docs/guides/supported-versions.md agrees with what CI runs: .ci/run's lanes, what the Makefile and the lanes'
scripts install (scripts/ci_versions.py), and pyproject.toml's declared ranges; wrong edits of either side fail."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guides" / "supported-versions.md"
_SPEC = importlib.util.spec_from_file_location("ci_versions", ROOT / "scripts" / "ci_versions.py")
assert _SPEC is not None and _SPEC.loader is not None
ci_versions = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ci_versions)

_LANE = re.compile(r"`([\w-]+)`")
_RELEASE = re.compile(r"^\d+(\.\d+)+")


class Row(NamedTuple):
    component: str
    version: str
    lanes: frozenset[str]
    pending: bool


def _table(text: str, name: str) -> list[list[str]]:
    """The cells of the Markdown table between ``<!-- ci-<name>:begin -->`` and ``<!-- ci-<name>:end -->``."""
    found = re.search(rf"<!-- ci-{name}:begin -->\n(.*?)\n<!-- ci-{name}:end -->", text, flags=re.DOTALL)
    assert found, f"{PAGE.name} has no <!-- ci-{name}:begin/end --> table"
    table = []
    for line in found.group(1).strip().splitlines()[2:]:  # past the header and its separator
        if not line.startswith("|"):  # a Markdown table ends at its first line that is not a row
            break
        table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return table


def rows(text: str) -> list[Row]:
    """The tested-versions table: component, version, the lanes named (backticked) in the last cell, pending."""
    out = []
    for cells in _table(text, "versions"):
        lanes = cells[-1]
        out.append(Row(cells[0], cells[1], frozenset(_LANE.findall(lanes)), lanes.startswith("pending")))
    return out


def _declared(root: Path) -> dict[str, SpecifierSet]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    declared = {"Python": SpecifierSet(project["requires-python"])}
    for requirement in (Requirement(r) for extra in project["optional-dependencies"].values() for r in extra):
        if requirement.name in ("megatron-core", "vllm"):
            declared[requirement.name] = requirement.specifier
    return declared


def disagreements(text: str, root: Path = ROOT) -> list[str]:
    """Every way the page's tables and what CI runs (and pyproject.toml declares) disagree, one sentence each."""
    tested, lanes = ci_versions.tested(root), ci_versions.ci_lanes(root)
    table, out = rows(text), []
    claimed: dict[tuple[str, str], set[str]] = {}
    for row in table:
        pair, name = (row.component, row.version), f"{row.component} {row.version}"
        if row.pending:
            out += [
                f"{name}: says pending, but {lane!r} runs in .ci/run now" for lane in sorted(row.lanes & set(lanes))
            ]
            continue
        if pair not in tested:
            out.append(f"{name}: claimed, but no lane of .ci/run installs it")
            continue
        if not row.lanes:
            out.append(f"{name}: names no lane")
        out += [f"{name}: claims {lane!r}, which does not install it" for lane in sorted(row.lanes - tested[pair])]
        claimed.setdefault(pair, set()).update(row.lanes)
    for pair, by in sorted(tested.items()):
        if pair not in claimed:
            out.append(f"{pair[0]} {pair[1]}: {', '.join(sorted(by))} install(s) it; missing from the page")
    named = {lane for row in table for lane in row.lanes} | set(_LANE.findall(text))
    out += [f"lane {lane!r} of .ci/run: not named on the page" for lane in lanes if lane not in named]
    for (component, version), spec in ((p, s) for p in claimed for c, s in _declared(root).items() if p[0] == c):
        if _RELEASE.match(version) and version not in spec:
            out.append(f"{component} {version}: tested, but pyproject.toml declares {component}{spec}")
    return out + _route_disagreements(text, table)


def _route_disagreements(text: str, table: list[Row]) -> list[str]:
    """The route table lists each megatron-core version of the versions table once, pending exactly where it is."""
    mcore = {row.version: row.pending for row in table if row.component == "megatron-core"}
    routes = {cells[0]: any("pending" in cell for cell in cells[1:]) for cells in _table(text, "routes")}
    out = [f"route table: megatron-core {v} is not in the versions table" for v in routes if v not in mcore]
    out += [f"route table: megatron-core {v} is missing" for v in mcore if v not in routes]
    out += [
        f"route table: megatron-core {v} is {'pending' if p else 'tested'} but its routes say otherwise"
        for v, p in mcore.items()
        if v in routes and routes[v] != p
    ]
    return out


# ---------------------------------------------------------------- the page as it is


def test_the_page_agrees_with_what_ci_runs() -> None:
    """Every version the page claims is installed by the lanes it names, and every lane's version is on the page."""
    assert disagreements(PAGE.read_text()) == []


def test_the_reader_finds_every_lanes_versions() -> None:
    """scripts/ci_versions.py reads the pins of the lanes (the default stack, the matrix's releases, the overlays)."""
    tested = ci_versions.tested()
    assert tested[("vllm", "0.34.0")] == {"test-vllm-034"}
    assert tested[("megatron-core", "0.13.1")] == {"test-matrix"} and ("megatron-core", "0.19.2") in tested
    assert {"test-vllm-engine", "test-matrix"} <= tested[("torch", "2.13.0+cpu")]
    assert tested[("ray", "2.60.0")] == {"test-verl"} and ("Python", "3.11") in tested


# ---------------------------------------------------------------- wrong edits fail


def _edited(old: str, new: str) -> str:
    text = PAGE.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("| vllm | 0.34.0 |", "| vllm | 0.35.0 |", "vllm 0.35.0: claimed, but no lane of .ci/run installs it"),
        ("| vllm | 0.34.0 |", "| vllm | 0.35.0 |", "vllm 0.34.0: test-vllm-034 install(s) it; missing from the page"),
        ("| ray | 2.60.0 | in the verl overlay | `test-verl` |\n", "", "ray 2.60.0: test-verl install(s) it; missing"),
        ("in the verl overlay | `test-verl` |", "in the verl overlay | `test-verl`, `test-vllm-034` |",
         "ray 2.60.0: claims 'test-vllm-034', which does not install it"),
        ("| megatron-core | 0.13.1 |", "| megatron-core | 0.12.0 |", "megatron-core 0.12.0: claimed, but no lane"),
        ("| 0.13.1 | today's patches", "| 0.12.0 | today's patches", "route table: megatron-core 0.12.0 is not in"),
        ("| 0.19.2 | native | native |", "| 0.19.2 | pending | native |", "megatron-core 0.19.2 is tested but"),
        ("Lanes that install no version of their own beyond the above: `make lint`", "Lanes: `make lint`", None),
    ],
)  # fmt: skip
def test_a_wrong_edit_of_the_page_fails(old: str, new: str, expected: str | None) -> None:
    """Each wrong edit of the page (a version no lane runs, a row gone, a lane that does not install it, a route
    row out of step) is named; the last edit only drops a sentence, and nothing fails."""
    found = disagreements(_edited(old, new))
    if expected is None:
        assert found == []
    else:
        assert any(expected in line for line in found), found


def _copy_of_ci(tmp_path: Path) -> Path:
    """A copy of the files CI's versions are read from."""
    names = ("Makefile", "pyproject.toml", ".ci/run", "scripts/test-matrix.sh", "scripts/test-source-trees.sh")
    for name in (*names, "scripts/user-route.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_a_pin_changed_in_the_makefile_fails(tmp_path: Path) -> None:
    """Bumping the default lane's vLLM in the Makefile (and not on the page) is named from both sides."""
    root = _copy_of_ci(tmp_path)
    make = root / "Makefile"
    make.write_text(make.read_text().replace("vllm==0.33.0", "vllm==0.33.1"))
    found = disagreements(PAGE.read_text(), root)
    assert "vllm 0.33.0: claimed, but no lane of .ci/run installs it" in found
    assert any(line.startswith("vllm 0.33.1:") and "missing from the page" in line for line in found)


def test_a_matrix_release_dropped_from_the_script_fails(tmp_path: Path) -> None:
    """Dropping 0.13.1 from scripts/test-matrix.sh's releases makes the page's 0.13.1 row a claim no lane backs."""
    root = _copy_of_ci(tmp_path)
    script = root / "scripts" / "test-matrix.sh"
    script.write_text(script.read_text().replace('"0.13.1 0.14.0', '"0.14.0'))
    assert "megatron-core 0.13.1: claimed, but no lane of .ci/run installs it" in disagreements(PAGE.read_text(), root)


def test_a_lane_dropped_from_ci_leaves_its_claims_unbacked(tmp_path: Path) -> None:
    """The source-tree lane taken out of .ci/run: the page's main and dev rows (and its name on the others) are claims
    no lane backs, each named."""
    root = _copy_of_ci(tmp_path)
    run = root / ".ci" / "run"
    run.write_text(run.read_text().replace("lane test-source-trees\n", ""))
    assert ("megatron-core", "main") not in ci_versions.tested(root)
    found = disagreements(PAGE.read_text(), root)
    assert "megatron-core main: claimed, but no lane of .ci/run installs it" in found
    assert "megatron-core 0.18.2: claims 'test-source-trees', which does not install it" in found


def test_a_declared_range_that_excludes_a_tested_release_fails(tmp_path: Path) -> None:
    """pyproject.toml's megatron extra capped below a tested release (0.19.2) is named."""
    root = _copy_of_ci(tmp_path)
    project = root / "pyproject.toml"
    project.write_text(project.read_text().replace("megatron-core>=0.13,<0.21", "megatron-core>=0.13,<0.19"))
    assert "megatron-core 0.19.2: tested, but pyproject.toml declares megatron-core<0.19,>=0.13" in disagreements(
        PAGE.read_text(), root
    )
