"""Pipeline parallel: two gloo processes, Megatron's standalone-MTP layout (MTP on the stage before the loss)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from tests.megatron.conftest import BATCH, SEQ, VOCAB, free_port


@pytest.mark.no_distributed
def test_loss_stage_after_a_standalone_mtp_stage(tmp_path: Path) -> None:
    """The loss stage splits off the MTP outputs it receives: logits [b, s, vocab] and upstream's MTP loss."""
    import torch.multiprocessing as mp

    from tests.megatron import pp_worker

    try:
        config = pp_worker.standalone_config()
    except (TypeError, NotImplementedError, AssertionError) as exc:  # no layouts, or MTP only on the loss stage
        pytest.skip(f"this megatron-core cannot put MTP on a stage of its own: {type(exc).__name__}: {exc}")
    if not getattr(config, "mtp_standalone", False):  # 0.14 takes the layout but runs MTP on the loss stage too
        pytest.skip("this megatron-core has no standalone MTP stage (config.mtp_standalone)")

    out = tmp_path / "pp.json"
    mp.spawn(pp_worker.run, args=(free_port(), str(out)), nprocs=2, join=True)
    result = json.loads(out.read_text())
    assert result["standalone"]
    assert result["upstream_shape"] == [BATCH, SEQ]  # upstream: the LM loss per token
    assert result["patched_shape"] == [BATCH, SEQ, VOCAB]
    assert len(result["patched_losses"]) == 1
    assert result["patched_losses"] == pytest.approx(result["upstream_losses"], rel=1e-6)
