"""examples/repl.md is a doctest: the REPL transcript in the docs matches what patchreg prints."""

from __future__ import annotations

import doctest
from pathlib import Path

import patchreg

REPL = Path(__file__).resolve().parents[1] / "examples" / "repl.md"


def test_repl_transcript_matches() -> None:
    """Every example in examples/repl.md produces the output shown, and leaves nothing patched."""
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testfile(str(REPL), module_relative=False, optionflags=flags, verbose=False, report=True)
    assert result.attempted > 10
    assert result.failed == 0, f"{result.failed} example(s) in {REPL} failed; see the captured output"
    assert patchreg.registry.active() == ()
