"""``patchreg doctor verl-mtp``: the set is registered as an entry point and reports what would install on this verl."""

from __future__ import annotations

import importlib.metadata
import io
import json
import sys
from pathlib import Path

import pytest

from tests.verl.conftest import needs_verl

pytestmark = [needs_verl, pytest.mark.no_distributed]
ROOT = Path(__file__).resolve().parents[2]


def _declared() -> importlib.metadata.EntryPoint:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        pytest.skip("tomllib needs Python 3.11")
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["patchreg.patchsets"]
    return importlib.metadata.EntryPoint("verl-mtp", table["verl-mtp"], "patchreg.patchsets")


def test_entry_point_names_the_set_and_loading_it_applies_nothing() -> None:
    """pyproject's patchreg.patchsets entry point loads VERL_MTP; loading installs nothing (no opt-in)."""
    import patchreg
    from patches.verl import VERL_MTP

    assert _declared().load() is VERL_MTP
    assert not [e for e in patchreg.registry.active() if e.patch.startswith(("engine_", "rollout_"))]


def test_doctor_shows_every_patch_installing_on_this_verl() -> None:
    """`doctor --json verl-mtp` lists the five patches, each would install on verl 0.9.1, with verl's version."""
    from patchreg._cli import run
    from patchreg._discovery import discover

    out = io.StringIO()
    status = run(["doctor", "--json", "verl-mtp"], finder=lambda extra: discover(("patches.verl.mtp",), ()), out=out)
    rows = json.loads(out.getvalue())
    assert status == 0, rows
    assert [r["patch"] for r in rows] == [
        "engine_patch_engine_mtp",
        "engine_initialize",
        "rollout_speculative_config",
        "rollout_per_request_metrics",
        "rollout_spec_decode_stats",
    ]
    assert all(r["install"] and r["versions"].get("verl") == "0.9.1" for r in rows), rows
