"""Plain-text tables fit a width: long cells wrap (or the last column is cut), nothing is lost when wrapping."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from patchreg._format import fit, table, wrap

_TEXT = st.text(alphabet="abc.:-_ ;,/xyz0123456789", max_size=120)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, width=st.integers(min_value=1, max_value=60))
def test_wrap_keeps_every_character_within_the_width(text: str, width: int) -> None:
    """Each wrapped line is at most `width` long, and the lines hold the text's characters in order."""
    lines = wrap(text, width)
    assert all(len(line) <= width for line in lines)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(_TEXT, _TEXT, _TEXT), min_size=1, max_size=5),
    width=st.integers(min_value=40, max_value=120),
    truncate=st.booleans(),
)
def test_a_table_with_a_width_fits_it(rows: list[tuple[str, str, str]], width: int, truncate: bool) -> None:
    """Every line of a table given a width fits it when its columns can narrow that far (8 characters each)."""
    text = table(("patch", "holder", "why"), rows, width=width, truncate=truncate)
    assert all(len(line) <= width for line in text.splitlines()), text


def test_fit_narrows_the_widest_column_first_and_respects_floors() -> None:
    """The widest column gives way first; a floor keeps a column from narrowing below it."""
    assert fit([10, 80], 50) == [10, 38]
    assert fit([30, 49, 10, 20, 150], 100, [0, 0, 0, 0, 30]) == [17, 17, 10, 18, 30]
    assert fit([10, 10], 50) == [10, 10]


def test_truncated_cells_end_with_an_ellipsis_and_keep_one_line() -> None:
    """With truncate=True a long last cell is cut to one line ending in an ellipsis; other cells wrap."""
    text = table(("a", "reason"), [("x", "word " * 40)], width=40, truncate=True)
    lines = text.splitlines()
    assert len(lines) == 3 and lines[2].endswith("…") and len(lines[2]) <= 40
