"""Patch sets for the ``doctor --against`` tests, on a small upstream package ``auditpkg_xyz`` the tests write.

Release 1.0 is on the path as "installed" (when a test puts it there); release 2.0 is the candidate: its
``scale`` gained a line, ``fixed_bug`` appeared, and ``area`` kept its body.
"""

from __future__ import annotations

import textwrap
from typing import Any

from patchreg import Patch, PatchSet, Verified, accepts, check, has, not_needed_when, requires
from patchreg._drift import body_fingerprint_source

AREA = '''
def area(width, height):
    """The area."""
    return width * height
'''
SCALE_1 = """
def scale(x, factor=2):
    return x * factor
"""
SCALE_2 = """
def scale(x, factor=2, *, offset=0):
    y = x * factor
    return y + offset
"""

#: auditpkg_xyz's files, per release (relative path -> text).
RELEASES: dict[str, dict[str, str]] = {
    version: {
        "auditpkg_xyz/__init__.py": f"__version__ = {version!r}\n",
        "auditpkg_xyz/geometry.py": textwrap.dedent(AREA) + textwrap.dedent(scale) + extra,
    }
    for version, scale, extra in [
        ("1.0", SCALE_1, ""),
        ("2.0", SCALE_2, "\ndef fixed_bug():\n    return True\n"),
    ]
}

G = "auditpkg_xyz.geometry"
UP = "auditpkg-xyz"


def _twice(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    return 2 * wrapped(*args, **kwargs)


AREA_BODY = Verified(UP, f"{G}:area", {"1.0": body_fingerprint_source(AREA)})
SCALE_BODY = Verified(UP, f"{G}:scale", {"1.0": body_fingerprint_source(SCALE_1)})

FINE = PatchSet(
    "audit-fine",
    [
        Patch(
            "installs",
            f"{G}:area",
            _twice,
            kind="wrap",
            when=requires(f"{UP}>=2") & accepts(f"{G}:area", "width"),
            verified=AREA_BODY,
        ),
        Patch("fixed-upstream", f"{G}:area", _twice, kind="wrap", when=not_needed_when(has(f"{G}:fixed_bug"))),
    ],
)
UNKNOWN = PatchSet(
    "audit-unknown",
    [Patch("probed", f"{G}:area", _twice, kind="wrap", when=requires(f"{UP}>=1") & check(lambda: True, "a probe"))],
)
BROKEN = PatchSet(
    "audit-broken",
    [
        Patch("scale-changed", f"{G}:scale", _twice, kind="wrap", verified=SCALE_BODY),
        Patch("too-new", f"{G}:area", _twice, kind="wrap", when=requires(f"{UP}>=3")),
        Patch("no-param", f"{G}:scale", _twice, kind="wrap", when=accepts(f"{G}:scale", "round_to")),
        Patch("no-target", f"{G}:volume", _twice, kind="wrap"),
    ],
)
ELSEWHERE = PatchSet(
    "audit-elsewhere",
    [Patch("local", "tests.patchreg.sample:module_func", lambda: 0, when=requires("attrs>=20"))],
)
