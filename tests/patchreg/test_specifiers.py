"""Requirement diagnostics (patchreg._specifiers): what is wrong with a requirement string packaging refused."""

from __future__ import annotations

import pytest

from patchreg import PatchDefinitionError, requires
from patchreg._specifiers import diagnose


@pytest.mark.parametrize("good", ["megatron-core>=0.14", "vllm>=0.8,<1", "torch==2.14.0"])
def test_a_valid_requirement_has_nothing_to_say(good: str) -> None:
    """A requirement packaging accepts gets no diagnosis."""
    assert diagnose(good) is None


@pytest.mark.parametrize(
    ("bad", "says"),
    [("megatron-core>=", "no version after it"), ("x>=1,<", "no version after it"), ("x=>1", "did you mean '>='")],
)
def test_a_bad_requirement_is_named_with_the_fix(bad: str, says: str) -> None:
    """A malformed clause is named with what is wrong (and the operator meant, where it can tell)."""
    assert says in (diagnose(bad) or "")


def test_requires_raises_the_diagnosis() -> None:
    """requires() refuses a malformed requirement with a PatchDefinitionError carrying the diagnosis."""
    with pytest.raises(PatchDefinitionError, match="did you mean"):
        requires("x=>1")
