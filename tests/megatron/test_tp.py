"""Tensor parallel: two gloo processes with tensor_model_parallel_size=2 against the same model at TP=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.megatron.conftest import free_port, record_measurement


@pytest.mark.no_distributed
def test_tp2_matches_tp1(tmp_path: Path) -> None:
    """Gathered TP=2 logits equal the TP=1 model's within 1e-5 and the MTP gradients and losses match."""
    import torch.multiprocessing as mp

    from tests.megatron import tp_worker

    out = tmp_path / "tp.json"
    mp.spawn(tp_worker.run, args=(2, free_port(), str(out)), nprocs=2, join=True)
    result = json.loads(out.read_text())
    assert result["logits_shape"] == [2, 8, 64]
    assert result["logits_max_abs"] <= 1e-5
    assert max(result["grad_rel"].values()) <= 1e-5, result["grad_rel"]
    assert result["losses"][0] == pytest.approx(result["losses"][1], rel=1e-5)
    assert result["trunk"] == [0.0, 0.0]
    record_measurement("tp2 logits max abs diff", result["logits_max_abs"])
    record_measurement("tp2 mtp grad max abs diff", result["grad_max_abs"])
