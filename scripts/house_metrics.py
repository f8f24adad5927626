"""``python scripts/house_metrics.py [ROOT]``: the engine's module count, lines, import levels and import cycles.

Every import counts: at the top, inside functions and under ``TYPE_CHECKING``. Levels: the longest chain of imports
(a module that imports nothing of the engine is level 1); where there are cycles, their back edges are dropped.
Cycles: the strongly connected components of more than one module, and the pairs of modules that import each other.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the engine modules it imports (``__init__`` for the package)."""
    engine = root / "patchreg"
    names = {p.stem for p in engine.glob("*.py")}
    found: dict[str, set[str]] = {}
    for path in sorted(engine.glob("*.py")):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "patchreg":
                    deps.update(a.name if a.name in names else "__init__" for a in node.names)
                elif node.module.startswith("patchreg."):
                    deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("patchreg."))
        found[path.stem] = deps - {path.stem}
    return found


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            comp = []
            while True:
                top = stack.pop()
                comp.append(top)
                if top == node:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    edges = graph(root)

    @functools.cache
    def level(node: str, path: tuple[str, ...] = ()) -> int:
        return 1 + max((level(n, (*path, node)) for n in edges[node] if n not in (*path, node)), default=0)

    lines = sum(len(p.read_text().splitlines()) for p in (root / "patchreg").glob("*.py"))
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges[b]})
    cycles = components(edges)
    print(f"modules {len(edges)}, lines {lines}, import levels {max(level(n) for n in edges)}, ", end="")
    print(f"cyclic components {len(cycles)}, modules importing each other {len(pairs)}")
    for comp in cycles:
        print("  cycle among:", ", ".join(comp))
    for a, b in pairs:
        print(f"  {a} <-> {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
