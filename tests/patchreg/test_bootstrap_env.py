"""PATCHREG_DISABLE at bootstrap, Ray's runtime_env fragment, and ``doctor --env``, each in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import patchreg
from tests.patchreg.test_bootstrap import ROOT, dist

__all__ = ["dist"]

PROBE = """
import json, logging
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("patchreg").addHandler(Keep())
import patchreg, boot_patches
reports = patchreg.bootstrap() + patchreg.bootstrap()
print(json.dumps({"quiet": boot_patches.quiet(0), "other": boot_patches.OTHER,
                  "skipped": [list(s) for r in reports[:2] for s in r.skipped],
                  "warnings": [m for m in records if "PATCHREG_DISABLE" in m]}))
"""


def child(dist: Path, code: str, *argv: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (or ``-m patchreg argv``) in a fresh interpreter with the variables given (others unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_")}
    env.update(variables, PYTHONPATH=os.pathsep.join([str(dist), str(ROOT)]))
    cmd = [sys.executable, "-m", "patchreg", *argv] if argv else [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)


def test_bootstrap_skips_disabled_patches_and_warns_once_about_unknown_names(dist: Path) -> None:
    """A disabled patch of a named set is not installed (its report says why); an unknown name is warned about
    once per process, in a short line with the name a typo may mean."""
    result = child(
        dist,
        PROBE,
        PATCHREG_PATCHSETS="boot-loud,boot-also",
        PATCHREG_DISABLE="boot-also.also,no-such-thing,boot-first.frist",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["quiet"] == "LOUD"
    assert out["other"] == 1  # boot-also.also disabled
    assert out["skipped"] == [["also", "disabled by PATCHREG_DISABLE"]]
    assert len(out["warnings"]) == 1
    assert "'no-such-thing'" in out["warnings"][0]
    assert "'boot-first.frist' (did you mean 'boot-first.first'?)" in out["warnings"][0]
    assert "'boot-also.also'" not in out["warnings"][0]
    assert len(out["warnings"][0]) < 300  # not every known name (there are about a hundred)


def test_a_whole_set_disabled(dist: Path) -> None:
    """A set named in PATCHREG_DISABLE installs nothing, even when PATCHREG_PATCHSETS names it."""
    result = child(dist, PROBE, PATCHREG_PATCHSETS="boot-loud", PATCHREG_DISABLE="boot-loud")
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["quiet"] == 0
    assert out["warnings"] == []


def test_doctor_env_nothing_named(dist: Path) -> None:
    """doctor --env with nothing named says bootstrap installs nothing, exit 0."""
    result = child(dist, "", "doctor", "--env")
    assert result.returncode == 0, result.stderr
    assert "bootstrap() installs nothing here" in result.stdout


def test_doctor_env_a_set_that_installs(dist: Path) -> None:
    """doctor --env shows the named set's patches (a disabled one as such) and exits 0 when they install."""
    result = child(
        dist, "", "doctor", "--env", "--json", PATCHREG_PATCHSETS="boot-loud,boot-also", PATCHREG_DISABLE="also"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert out["problems"] == []
    assert [(p["patch"], p["install"], p["reason"]) for p in out["patches"]][1] == (
        "also",
        False,
        "disabled by PATCHREG_DISABLE",
    )


@pytest.mark.parametrize(
    ("named", "says"),
    [("boot-loud,no-such-set", "unknown patch set 'no-such-set'"), ("boot-bound", "targets an object given")],
)
def test_doctor_env_exit_1_when_a_named_set_would_not_install(dist: Path, named: str, says: str) -> None:
    """doctor --env exits 1 naming why, for an unknown set or one that needs an object."""
    result = child(dist, "", "doctor", "--env", PATCHREG_PATCHSETS=named)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "WOULD NOT INSTALL FULLY" in result.stdout and says in result.stdout


def test_doctor_env_exit_1_when_a_patch_would_not_install(dist: Path) -> None:
    """doctor --env exits 1 when a patch of a named set would be skipped (its target is missing)."""
    (dist / "boot_extra.py").write_text(
        "from patchreg import Patch, PatchSet\nMISSING = PatchSet('boot-missing', [Patch('gone', 'boot_extra:nope', 1, "
        "kind='value')])\n"
    )
    info = dist / "boot_extra-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: boot-extra\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[patchreg.patchsets]\nmissing = boot_extra:MISSING\n")
    result = child(dist, "", "doctor", "--env", PATCHREG_PATCHSETS="boot-loud,boot-missing")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 of 2 patch(es) would install" in result.stdout


def test_ray_runtime_env_fragment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fragment carries both variables (given or this process's own) and Ray's setup hook, bootstrap."""
    frag = patchreg.ray_runtime_env(["a", "b"], ["a.p"])
    assert frag == {
        "env_vars": {"PATCHREG_PATCHSETS": "a,b", "PATCHREG_DISABLE": "a.p"},
        "worker_process_setup_hook": "patchreg.bootstrap",
    }
    monkeypatch.setenv("PATCHREG_PATCHSETS", "x")
    monkeypatch.delenv("PATCHREG_DISABLE", raising=False)
    assert patchreg.ray_runtime_env()["env_vars"] == {"PATCHREG_PATCHSETS": "x"}
    module, _, name = frag["worker_process_setup_hook"].rpartition(".")
    assert getattr(__import__(module), name) is patchreg.bootstrap  # what Ray's load_class finds


def test_the_verl_plugin_entry_point_bootstraps() -> None:
    """patchreg declares a verl.plugins entry point 'patchreg' whose module bootstraps when imported."""
    import importlib.metadata

    eps = [ep for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.name == "patchreg"]
    assert eps, "reinstall the checkout (make env): its entry points are missing"
    assert {ep.value for ep in eps} == {"patchreg.verl_plugin"}
