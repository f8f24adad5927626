"""torchrun, world size 2 on gloo: patch sets bootstrapped from the environment; assert_consistent both ways."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.megatron.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SETS = "megatron-cpu,verl-mtp"


def torchrun(tmp_path: Path, **variables: str) -> list[dict[str, Any]]:
    """Run tests/megatron/torchrun_worker.py on 2 ranks with PATCHREG_PATCHSETS and ``variables``; each rank's result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHREG_")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # keep an overlay
    env.update(PYTHONPATH=path, PATCHREG_PATCHSETS=SETS, OMP_NUM_THREADS="1", **variables)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1"]
    cmd += [f"--master_port={free_port()}", str(ROOT / "tests/megatron/torchrun_worker.py"), str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.no_distributed
@pytest.mark.no_cpu_shims
def test_torchrun_ranks_bootstrapped_from_the_environment_agree(tmp_path: Path) -> None:
    """Both ranks apply the named sets at start, enter mtp_patched on a tiny GPTModel (the CPU shims from the
    bootstrap), run a forward, and agree on one fingerprint."""
    ranks = torchrun(tmp_path)
    for rank in ranks:
        assert rank["bootstrapped"] == ["megatron-cpu", "verl-mtp"]
        assert rank["shape"][-1] == 64
        assert rank["mtp_installed"] >= 1 and rank["cpu_installed"] > rank["mtp_installed"]
        assert "error" not in rank, rank["error"]
    assert ranks[0]["consistent"] == ranks[1]["consistent"]


@pytest.mark.no_distributed
@pytest.mark.no_cpu_shims
def test_torchrun_a_rank_with_a_patch_disabled_is_named(tmp_path: Path) -> None:
    """When rank 1's environment disables one patch, both ranks raise the same error naming rank 1 and the patch."""
    ranks = torchrun(tmp_path, RANK1_DISABLE="verl-mtp.rollout_spec_decode_stats")
    assert ranks[0]["error"] == ranks[1]["error"]
    message = ranks[0]["error"]
    assert "rank(s) [1] have fingerprint" in message
    assert "missing install rollout_spec_decode_stats" in message
