"""examples/compose.py runs: three patch sets in one ExitStack on a tiny real GPTModel, all restored after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

ROOT = Path(__file__).resolve().parents[1]


def test_compose_example_applies_three_sets_and_restores_everything() -> None:
    """The script exits 0, shows the three sets active together, the refused replace, and exact restores."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "compose.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    native = "rl_mode_forward" in out  # 0.19.2: the block rides upstream's RL mode; the rival is on its config flag
    if native:
        assert "refused: Patch 'rival-detach-heads' replaces model.config.mtp_detach_heads" in out
        assert "but patch 'mtp_heads_attached' also replaces" in out
    else:
        assert "refused: Patch 'rival-postprocess' replaces model._postprocess" in out
        assert "but patch 'postprocess' also replaces" in out
    assert "@0x" not in out  # holders read by path: model, model.decoder
    assert all(len(line) <= 100 for line in out.split("after the ExitStack:")[0].splitlines()[5:])  # the summary
    ours = "rl_mode_forward" if native else "postprocess"
    for name in ("rng_tracker_fork", ours, "log-postprocess", "count-decoder"):
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
    after = out.split("after the ExitStack:")[1]
    assert "registry 'default': nothing active" in after
    assert "CHANGED" not in after and after.count("restored exactly") == 7
    assert "forward with labels returns the LM loss (2, 8), not logits" in after
