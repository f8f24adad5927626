"""examples/ppo_step.py (``make demo``) proves what it says, in under 40 lines and without library noise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo() -> subprocess.CompletedProcess[str]:
    """One run of the demo, shared by the tests of this module."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}  # set by other tests
    env |= {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "PYTHONWARNINGS": ""}
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ppo_step.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )


def test_demo_restores_every_namespace_and_matches_a_never_patched_twin(demo: subprocess.CompletedProcess[str]) -> None:
    """The demo exits 0, shows each touched namespace restored exactly and the upstream loss bit-equal to a twin."""
    result = demo
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    after = out.split("after the block, the ")[1].split("upstream loss after the block")[0]
    restored = " ".join(after.split()).split("restored exactly: ")[1].split(", ")
    if "rl_mode_forward" in out:  # 0.19.2: upstream's RL mode; the block sets the config flag, wraps the loss
        want = {"model", "model.config", "megatron.core.models.gpt.gpt_model", "megatron.core.tensor_parallel.random"}
    else:
        want = {"model", "model.mtp.layers[0]", "model.mtp.layers[1]", "megatron.core.tensor_parallel.random"}
    assert want <= set(restored), after
    assert "(patched: " not in out  # the demo's labels and mask ride upstream where it can
    assert "CHANGED" not in out
    assert "needed: needed:" not in out  # the report says each reason once
    assert "upstream loss after the block: shape (4, 16), bit-equal to a never-patched twin's (same weights)" in out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("step ")] == [
        "step 0",
        "step 1",
        "step 2",
    ]


def test_demo_output_is_short_and_has_no_library_warnings(demo: subprocess.CompletedProcess[str]) -> None:
    """stdout and stderr together stay under 40 lines, none of them a warning or log line from a library."""
    result = demo
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) < 40, "\n".join(lines)
    noisy = [
        line
        for line in lines
        if any(word in line for word in ("Warning", "warnings.warn", "WARNING", "DEPRECATED", "CUDA_HOME", "W1"))
    ]
    assert noisy == [], "\n".join(noisy)
    assert result.stderr == "", result.stderr


def test_the_installed_demo_runs_as_a_module_without_megatron_deprecations(tmp_path: Path) -> None:
    """`python -W default -m patches.megatron.demo`, run outside the checkout, passes and prints none of Megatron's
    deprecation warnings: ours come from the demo's config and are avoided (the MLP's width), and Megatron-Core
    0.19.2's ``tp_group is None``, which its own ``RowParallelLinear.forward`` causes, is silenced by the demo."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env |= {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "PYTHONWARNINGS": ""}
    command = [sys.executable, "-W", "default", "-m", "patches.megatron.demo"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bit-equal to a never-patched twin's" in result.stdout
    ours = [line for line in result.stderr.splitlines() if "megatron" in line and "DeprecationWarning" in line]
    assert ours == [], "\n".join(ours)
