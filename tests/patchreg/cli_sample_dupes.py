"""Patch sets for the CLI tests whose 'set.patch' names are ambiguous: a reused set name, dotted names."""

from __future__ import annotations

from patchreg import Patch, PatchSet
from tests.patchreg.cli_sample import M, shout

#: Reuses the name of cli_sample's set, with a patch of the same name.
REUSED = PatchSet("sample-ready", [Patch("shout", f"{M}:Child.static", shout)], doc="A set that reuses a name.")
#: 'dotted.set.p' splits two ways: set 'dotted.set' with patch 'p', and set 'dotted' with patch 'set.p'.
DOTTED_SET = PatchSet("dotted.set", [Patch("p", f"{M}:Child.method", shout)])
DOTTED_PATCH = PatchSet("dotted", [Patch("set.p", f"{M}:Base.method", shout)])
