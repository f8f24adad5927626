"""Plain-text tables: stable output for terminals, pipes and doctests."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["WIDTH", "fit", "table", "wrap"]

#: The widest line a table prints (``summary()``, ``explain()``, ``doctor``); full texts are in ``--json`` and the records.
WIDTH = 100

#: Where a long cell may break: after a space, a dot, a colon, a comma, a semicolon, a slash or a hyphen.
_PIECES = re.compile(r"[^\s.:,;/-]*[\s.:,;/-]*")


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    width: int | None = None,
    truncate: bool = False,
    floors: Sequence[int] = (),
) -> str:
    """Left-aligned columns separated by two spaces, with a dashed rule under the header.

    With ``width``, the widest columns are narrowed until every line fits, and their cells wrap onto
    continuation lines; with ``truncate`` the last column's cells are cut to one line ending in ``…`` instead.
    ``floors`` are the narrowest each column may become (default: its header's width, at least 8).
    """
    body = [tuple(str(cell) for cell in row) for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    if width is not None:
        widths = fit(
            widths, width, [max(len(h), f) for h, f in zip(headers, floors or [0] * len(headers), strict=True)]
        )
    lines = [_line(headers, widths), _line(["-" * w for w in widths], widths)]
    for row in body:
        lines += _row(row, widths, truncate)
    return "\n".join(lines)


def fit(widths: Sequence[int], width: int, floors: Sequence[int] = ()) -> list[int]:
    """Column widths that fit ``width`` with two-space gaps: the widest column is narrowed first.

    No column is narrowed below its floor (its header's width) or 8 characters; a table with too
    many columns for ``width`` stays wider.
    """
    out = list(widths)
    least = [max(8, f) for f in floors] if floors else [8] * len(out)
    room = width - 2 * (len(out) - 1)
    while (excess := sum(out) - room) > 0:
        shrinkable = [i for i, w in enumerate(out) if w > least[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=out.__getitem__)
        runner_up = max((out[i] for i in shrinkable if i != widest), default=0)
        out[widest] = min(max(least[widest], runner_up, out[widest] - excess), out[widest] - 1)
    return out


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters: broken at spaces, a longer word after a separator."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) <= width:
            line += " " + word
            continue
        if line:
            lines.append(line)
        line = ""
        for piece in _PIECES.findall(word) if len(word) > width else [word]:
            while len(piece) > width:  # no separator close enough: cut the piece
                lines.append(line + piece[: width - len(line)])
                line, piece = "", piece[width - len(line) :]
            if len(line) + len(piece) > width:
                lines.append(line)
                line = ""
            line += piece
    lines.append(line)
    return [part for part in lines if part] or [""]


def _row(cells: Sequence[str], widths: Sequence[int], truncate: bool) -> list[str]:
    columns = [wrap(cell, w) if len(cell) > w else [cell] for cell, w in zip(cells, widths, strict=True)]
    if truncate and len(cells[-1]) > widths[-1]:
        columns[-1] = [cells[-1][: widths[-1] - 1].rstrip() + "…"]
    height = max(len(c) for c in columns)
    return [_line([c[i] if i < len(c) else "" for c in columns], widths) for i in range(height)]


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
