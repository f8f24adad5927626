"""examples/verl_mtp.py runs on CPU: the chunk before, inside and after verl's engine, then freed and released."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.verl.conftest import needs_verl

pytestmark = [needs_verl, pytest.mark.no_distributed]
ROOT = Path(__file__).resolve().parents[2]


def test_example_shows_the_chunk_before_inside_and_after() -> None:
    """The example exits 0 and prints upstream, then our installs, then the model freed and nothing left."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "verl_mtp.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "verl's call site sees patch_engine_mtp from patches.verl.engine" in out
    assert "before  _postprocess: GPTModel._postprocess (class);" in out
    from patches.megatron._native import native

    if native():  # 0.19.2: upstream's RL mode (the flag and a forward that calls the class's own)
        assert "inside  forward: rl_mode_forward (instance);" in out and "config.mtp_detach_heads: True" in out
    else:
        assert "inside  _postprocess: postprocess_detached (instance);" in out
    assert "patch set 'megatron-mtp-detached' (detach_encoder=True) on 1 chunk(s), held" in out
    assert "model freed True; its installs released True" in out
    assert "MTP installs left in patchreg.registry: 0" in out
