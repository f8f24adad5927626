"""Patch sets for the command-line tests: one that installs everywhere, one with every kind of skip."""

from __future__ import annotations

from typing import Any

from patchreg import Patch, PatchSet, always, has, requires

M = "tests.patchreg.sample"


def shout(x: int) -> str:
    """Return a marker instead of x + 1.

    Used by the CLI tests to check that ``show`` prints the whole docstring.
    """
    return "shout"


def tag(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Tag what the wrapped method returns."""
    return ("tag", wrapped(*args, **kwargs))


READY = PatchSet(
    "sample-ready",
    [
        Patch("shout", f"{M}:module_func", shout, when=requires("attrs>=20")),
        Patch("tag-method", f"{M}:Child.method", tag, kind="wrap", when=always),
        Patch("tag-forward", "blocks[*].forward", tag, kind="wrap", when=has(f"{M}:Leaf.forward")),
    ],
    doc="Patches that install in any environment.\n\nA second paragraph that list does not show.",
)

SKIPPING = PatchSet(
    "sample-skipping",
    [
        Patch("future", f"{M}:module_func", shout, when=requires("attrs>=999")),
        Patch("missing-target", f"{M}:Child.no_such_method", tag, kind="wrap"),
        Patch("shout", f"{M}:Base.inherited", shout),
    ],
    doc="Patches that do not all install.",
)
