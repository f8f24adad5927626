"""verl 0.9.1 loads the ``verl.plugins`` entry points when it is imported: patchreg's bootstraps the named sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.verl.conftest import needs_verl

pytestmark = needs_verl
ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import verl  # loads the verl.plugins group: patchreg.verl_plugin bootstraps
import patchreg._bootstrap
held = sorted(patchreg._bootstrap._held)
import verl.workers.engine.megatron.transformer_impl  # a verl-mtp target: installed as it is imported
import patchreg
print(json.dumps({"held": held, "engine": patchreg.registry.is_active("engine_initialize")}))
"""


@pytest.mark.parametrize(("sets", "held"), [("verl-mtp", ["verl-mtp"]), (None, [])])
def test_importing_verl_bootstraps_the_named_sets(sets: str | None, held: list[str]) -> None:
    """Importing verl with PATCHREG_PATCHSETS set applies the sets through the entry point; unset, nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_")}
    env.setdefault("PYTHONPATH", str(ROOT))
    if sets is not None:
        env["PATCHREG_PATCHSETS"] = sets
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out == {"held": held, "engine": bool(held)}
