"""examples/mtp_rollout.py runs against a real engine and prints real stats and the batch's metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.vllm_engine.engines import REPO

EXAMPLE = REPO / "examples" / "mtp_rollout.py"


def test_example_prints_engine_stats_and_rollout_metrics(tmp_path: Path) -> None:
    """The example (its own process, as a user runs it) prints per-request stats and known acceptance."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    print(out)
    assert "'per_request_spec_decode_metrics': 'summary'" in out
    assert "some drafts right: prompt [65, 66, 67] -> generated [68, 69, 70, 71, 72, 73]... (24 tokens)" in out
    assert "every draft right: prompt [130, 131] -> generated [132, 133, 134, 135, 136, 137]..." in out
    assert "every draft wrong: prompt [195, 196] -> generated [197, 198, 199, 200, 201, 202]..." in out
    assert out.count("acceptance_rate=1.0000") == 1 and out.count("acceptance_rate=0.0000") == 1
    assert "rollout/spec_num_requests = 3" in out and "rollout/spec_num_requests_missing = 0" in out
