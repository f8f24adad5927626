"""A patch set for the CLI tests whose second patch is not needed in this environment."""

from __future__ import annotations

from patchreg import Patch, PatchSet, not_needed_when, requires
from tests.patchreg.cli_sample import M, shout, tag

FIXED = PatchSet(
    "sample-fixed",
    [
        Patch("loud", f"{M}:module_func", shout, when=requires("attrs>=20")),
        Patch("workaround", f"{M}:Child.method", tag, kind="wrap", when=not_needed_when(requires("attrs>=1"))),
    ],
    doc="One patch installs; the other works around a bug fixed in this environment.",
)
