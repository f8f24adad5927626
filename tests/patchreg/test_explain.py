"""Introspection (patchreg._explain): explain, active, summary and fingerprint read the state and change nothing."""

from __future__ import annotations

from patchreg import Patch, PatchSet, Registry, requires
from tests.patchreg import kinds_sample as ks

SET = PatchSet(
    "explained",
    [
        Patch("flag", f"{ks.M}:FLAG", True, kind="value"),
        Patch("never", f"{ks.M}:FLAG", True, kind="value", when=requires("attrs<1")),
        Patch("missing", f"{ks.M}:NOT_THERE_EXPLAIN", 1, kind="value"),
    ],
)


def test_explain_says_install_skip_and_share_without_changing_anything() -> None:
    """explain() rows say what an apply would do now; the namespace is untouched by it."""
    registry = Registry("t")
    rows = {r[0]: r[2] for r in registry.explain(SET).rows}
    assert rows == {"flag": "install", "never": "skip", "missing": "skip"} and ks.FLAG is False
    with registry.patched(SET):
        assert {r[0]: r[2] for r in registry.explain(SET).rows}["flag"] == "share"


def test_active_and_summary_list_the_installs_and_fingerprint_follows_them() -> None:
    """active() copies each install, summary() tables it, and the fingerprint changes while it is active."""
    registry = Registry("t")
    before = registry.fingerprint()
    assert registry.summary() == "registry 't': nothing active"
    with registry.patched(SET):
        (entry,) = registry.active()
        assert entry.patch == "flag" and entry.count == 1 and entry.where == f"{ks.M}.FLAG"
        assert "flag" in registry.summary() and registry.fingerprint() != before
    assert registry.fingerprint() == before and registry.active() == ()
