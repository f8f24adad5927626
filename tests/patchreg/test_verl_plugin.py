"""verl's plugin (patchreg.verl_plugin): importing it bootstraps the sets PATCHREG_PATCHSETS names, and an error in
that bootstrap is logged as an error before it is raised (verl swallows a plugin's error at debug level)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.patchreg.test_bootstrap import dist
from tests.patchreg.test_bootstrap_env import child

__all__ = ["dist"]

IMPORT_PLUGIN = """
import json, logging
errors = []
class Keep(logging.Handler):
    def emit(self, record):
        errors.append(record.getMessage())
logging.getLogger("patchreg").addHandler(Keep())
try:
    import patchreg.verl_plugin
    raised = None
except Exception as exc:
    raised = type(exc).__name__
import patchreg._bootstrap as boot
print(json.dumps({"held": sorted(boot._held), "raised": raised, "errors": errors}))
"""


def test_importing_the_plugin_bootstraps_the_named_sets(dist: Path) -> None:
    """Importing patchreg.verl_plugin applies the sets PATCHREG_PATCHSETS names, as verl's plugin loading does."""
    result = child(dist, IMPORT_PLUGIN, PATCHREG_PATCHSETS="boot-loud")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"held": ["boot-loud"], "raised": None, "errors": []}


def test_a_failed_bootstrap_is_logged_as_an_error_and_raised(dist: Path) -> None:
    """An unknown set name makes the import raise, and the error is logged first (verl would hide it)."""
    result = child(dist, IMPORT_PLUGIN, PATCHREG_PATCHSETS="no-such-set")
    found = json.loads(result.stdout)
    assert found["raised"] == "PatchError" and found["held"] == []
    assert any("verl plugin's bootstrap() failed" in e and "no-such-set" in e for e in found["errors"])
