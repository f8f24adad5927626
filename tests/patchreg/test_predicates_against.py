"""``Predicate.against(code)``: each kind judged on source files without importing them, in three values."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from patchreg import Predicate, accepts, always, check, has, not_needed_when, refresh, requires
from patchreg._versions import Code, Static

FILES = {
    "againstpkg/__init__.py": "__version__ = '3.1.0rc1'\n",
    "againstpkg/core.py": """
        class Engine:
            def run(self, steps, *, seed=0, **options):
                return steps

            def stop(self, now):
                return now

        def helper(x, /, y):
            return x + y
    """,
}


@pytest.fixture
def code(tmp_path: Path) -> Code:
    """A candidate tree of ``againstpkg`` 3.1.0rc1 (not importable here)."""
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    refresh()
    return Code((str(tmp_path),), frozenset({"againstpkg"}), "the candidate")


C = "againstpkg.core"
TRUE = has(f"{C}:Engine.run")
FALSE = has(f"{C}:Engine.fly")
PROBE = check(lambda: True, "a probe")


@pytest.mark.parametrize(
    ("pred", "ok", "needed"),
    [
        (always, True, True),
        (requires("againstpkg>=3.1"), True, True),  # 3.1.0rc1 counts as 3.1.0
        (requires("againstpkg>=3.2"), False, True),
        (TRUE, True, True),
        (FALSE, False, True),
        (accepts(f"{C}:Engine.run", "steps", "seed"), True, True),
        (accepts(f"{C}:Engine.run", "verbose"), False, True),
        (accepts(f"{C}:Engine.run", "verbose", var_keyword=True), True, True),  # through **options
        (accepts(f"{C}:helper", "x"), False, True),  # positional-only
        (accepts(f"{C}:Engine.fly", "x"), False, True),
        (PROBE, None, True),
        (TRUE & PROBE, None, True),
        (FALSE & PROBE, False, True),
        (TRUE | PROBE, True, True),
        (FALSE | PROBE, None, True),
        (~PROBE, None, True),
        (~FALSE, True, True),
        (not_needed_when(TRUE), False, False),
        (not_needed_when(FALSE), True, True),
        (not_needed_when(PROBE), None, False),  # may turn out not needed
        (not_needed_when(PROBE) & FALSE, None, False),  # fails, unless the probe says not needed
        (not_needed_when(TRUE) & FALSE, False, False),  # not needed wins, in any order
        (FALSE & not_needed_when(TRUE), False, False),
        (not_needed_when(PROBE) & TRUE, None, False),
    ],
)
def test_each_kind_and_combination(code: Code, pred: Predicate, ok: bool | None, needed: bool) -> None:
    """A definite answer where the files tell, unknown (None) where only a probe can, not-needed carried through."""
    answer = pred.against(code)
    assert (answer.ok, answer.needed) == (ok, needed), answer.reason
    assert "againstpkg" not in sys.modules


def test_reasons_name_the_candidate_and_the_live_rule(code: Code) -> None:
    """Static reasons read as the live ones do, and say where they were read."""
    assert requires("againstpkg>=3.2").against(code) == Static(
        False,
        "againstpkg 3.1.0rc1 (read from againstpkg/__init__.py in the candidate; no distribution metadata); "
        "3.1.0rc1 (judged as 3.1.0) does not satisfy >=3.2",
    )
    assert accepts(f"{C}:Engine.run", "verbose").against(code).reason == (
        "againstpkg.core:Engine.run does not accept verbose (in the candidate)"
    )
    assert PROBE.against(code).reason == "check('a probe') is a behavioural probe: it needs the import"


def test_a_package_the_candidate_does_not_hold_is_read_as_installed(code: Code) -> None:
    """requires() on another distribution answers as installed (metadata); has() reads its installed files."""
    assert requires("attrs>=20").against(code).ok is True
    assert has("packaging.version:Version.public").against(code).ok is True
    assert has("packaging.version:NoSuchNameXyz").against(code).ok is False


def test_an_unreadable_candidate_version_is_unknown(tmp_path: Path) -> None:
    """A candidate package that writes no version: requires() cannot tell."""
    (tmp_path / "bareagainst").mkdir()
    (tmp_path / "bareagainst" / "__init__.py").write_text("")
    code = Code((str(tmp_path),), frozenset({"bareagainst"}), "the candidate")
    answer = requires("bareagainst>=1").against(code)
    assert (answer.ok, answer.reason) == (None, "no version of bareagainst can be read in the candidate")
