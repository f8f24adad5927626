"""Plain-text tables: stable output for terminals, pipes and doctests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["table"]


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, with a dashed rule under the header."""
    body = [tuple(str(cell) for cell in row) for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = [_line(headers, widths), _line(["-" * w for w in widths], widths)]
    lines += [_line(row, widths) for row in body]
    return "\n".join(lines)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
