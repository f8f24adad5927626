"""The MTP drafter follows a weight sync in vLLM's own processes (DRAFTER_SYNC via the patchreg plugin), and says so.

Each engine runs in a fresh process (``tests/vllm_engine/sync_run.py``): the plugin's bootstrap holds
its sets for the life of a process. Every engine starts on the ``random`` checkpoint and loads
``known`` over it, by path (``collective_rpc("reload_weights")``), then by a one-pass iterator streamed
in the worker (a worker extension, as RL frameworks do), then a sync with a drafter tensor of the
wrong shape. The engines run two at a time, once for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_engine.engines import REPO, by_range, one_record, run_all, run_sync

# The module's engines start in its first test's setup: about 4 minutes on a quiet 2-core machine, much more
# on a shared one; pytest-timeout's default (600 s per test) would cut that setup short.
pytestmark = pytest.mark.timeout(2400)

SET = "vllm-mtp-drafter-sync"
CHANNEL = "vllm-worker-channel"
SYNC_PATCH = "vllm.worker.reload-weights-syncs-drafter"
DRAFTER_TENSORS, SHARED = 17, 2  # DeepSeekMTP of the tiny checkpoint; embed_tokens and the LM head are the target's

#: name -> (engine, PATCHREG_PATCHSETS or None, VLLM_ENABLE_V1_MULTIPROCESSING)
SCENARIOS: dict[str, tuple[str, str | None, str]] = {
    "mp": ("llm", SET, "1"),
    "inproc": ("llm", SET, "0"),
    "async": ("async", SET, "1"),
    "mp-unset": ("llm", None, "1"),
    "inproc-channel": ("llm", CHANNEL, "0"),
}
WITH_SET = ["mp", "inproc", "async"]
WITHOUT_SET = ["mp-unset", "inproc-channel"]


def _run(name: str, root: Path, checkpoints: dict[str, Path]) -> dict[str, Any]:
    engine, sets, mp = SCENARIOS[name]
    spec = {
        "engine": engine,
        "known": str(checkpoints["known"]),
        "random": str(checkpoints["random"]),
        "more": True,
        "compare_tensors": mp == "0",  # a callable over collective_rpc: in-process only (no insecure serialization)
    }
    return run_sync(name, root, spec, sets, mp)


@pytest.fixture(scope="module")
def runs(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every scenario's result, the engines run two at a time in fresh processes."""
    root = tmp_path_factory.mktemp("drafter-sync")
    return run_all(lambda name: _run(name, root, checkpoints), SCENARIOS)


@pytest.mark.parametrize("name", WITH_SET)
def test_plugin_applies_the_set_in_main_engine_core_and_worker(runs: dict[str, Any], name: str) -> None:
    """With PATCHREG_PATCHSETS set, the plugin applied the set in the main, EngineCore and worker processes."""
    run = runs[name]
    assert SYNC_PATCH in {p for p, _state in run["main_patches"]}
    core, workers = run["core_fingerprint"], run["worker_fingerprints"]
    assert any(line.startswith(f"install {SYNC_PATCH}|") for line in core["lines"])
    assert all(
        any(line.startswith(f"install {SYNC_PATCH}|") and line.endswith("|active") for line in w["lines"])
        for w in workers
    )
    if name == "inproc":
        assert run["pid"] == core["pid"] == workers[0]["pid"]
    else:  # the engine core and the worker are processes of their own
        assert len({run["pid"], core["pid"], workers[0]["pid"]}) == 3


@pytest.mark.parametrize("name", WITH_SET)
def test_fingerprint_answers_by_name(runs: dict[str, Any], name: str) -> None:
    """collective_rpc('patchreg_fingerprint') gives each worker's pid, fingerprint and lines (issue 35's contract)."""
    for answer in runs[name]["worker_fingerprints"]:
        assert isinstance(answer["pid"], int)
        assert isinstance(answer["fingerprint"], str) and len(answer["fingerprint"]) == 16
        assert all(isinstance(line, str) for line in answer["lines"]) and answer["lines"]


@pytest.mark.parametrize("name", WITH_SET)
def test_reload_from_path_syncs_the_drafter(runs: dict[str, Any], name: str) -> None:
    """reload_weights from known's path: acceptance 1.0 / 0.0 / about 0.5 by range, and the status is in sync."""
    run = runs[name]
    assert run["sync_path"] == "ok", run["sync_path"]
    acceptance = run["acceptance_path"]
    assert by_range(acceptance)
    status = one_record(run["status_path"])
    assert status["in_sync"] and status["stale"] == [] and status["stale_model"] is None
    assert (status["target_syncs"], status["drafter_syncs"], status["drafter_tensors"]) == (1, 1, DRAFTER_TENSORS)
    assert status["sets"] == status["caller_sets"] and status["matches_caller"] and SET in status["sets"]


@pytest.mark.parametrize("name", WITH_SET)
def test_reload_from_a_one_pass_iterator_syncs_the_drafter(runs: dict[str, Any], name: str) -> None:
    """Second and third syncs, by a one-pass iterator in the worker: random then known; acceptance follows known."""
    run = runs[name]
    assert run["sync_iter_random"] == ["ok"] and run["sync_iter_known"] == ["ok"]
    acceptance = run["acceptance_iter_known"]
    assert by_range(acceptance)
    for key, syncs in (("status_iter_random", 2), ("status_iter_known", 3)):
        status = one_record(run[key])
        assert status["in_sync"] and (status["target_syncs"], status["drafter_syncs"]) == (syncs, syncs)
        assert status["source"] == "iterator"


def test_drafter_tensors_equal_the_checkpoint(runs: dict[str, Any]) -> None:
    """After each sync from known, every drafter tensor with a checkpoint counterpart equals it."""
    for key in ("drafter_equals_known", "drafter_equals_known_iter"):
        compared = one_record(runs["inproc"][key])
        assert len(compared) >= 8 and all(compared.values()), compared


@pytest.mark.parametrize("name", WITH_SET)
def test_a_sync_failing_midway_names_the_stale_drafter(runs: dict[str, Any], name: str) -> None:
    """A drafter tensor of the wrong shape: a PatchError saying the drafter is stale; the status names it; it runs on."""
    run = runs[name]
    (error,) = run["sync_bad_shape"]
    assert error.startswith("PatchError:") and "drafter" in error and "stale" in error and "640" in error
    status = one_record(run["status_bad_shape"])
    assert not status["in_sync"] and status["stale_model"] == "drafter" and "AssertionError" in status["error"]
    assert "model.layers.1.eh_proj.weight" in status["stale"]
    assert set(run["acceptance_bad_shape"]) == {"full", "never", "partial"}  # the engine still generates


@pytest.mark.parametrize("name", WITHOUT_SET)
def test_without_the_set_the_drafter_stays_stale(runs: dict[str, Any], name: str) -> None:
    """The same reloads without the set: acceptance on full at most 0.1 (the case bites on this release)."""
    run = runs[name]
    assert run["acceptance_path"]["full"] <= 0.1
    assert run["acceptance_iter_known"]["full"] <= 0.1


def test_without_the_sync_the_status_lists_the_stale_tensors(runs: dict[str, Any]) -> None:
    """With only the channel set, the status after a reload lists the drafter's 15 tensors it does not share."""
    run = runs["inproc-channel"]
    required = run["status_required_start"]
    assert "PatchError" in required["error"] and "PATCHREG_PATCHSETS=vllm-mtp-drafter-sync" in required["error"]
    status = one_record(run["status_path"])
    assert not status["in_sync"] and not status["sync_active"]
    assert len(status["stale"]) == DRAFTER_TENSORS - SHARED
    assert "model.layers.1.eh_proj.weight" in status["stale"] and "model.embed_tokens.weight" not in status["stale"]
    assert (status["target_syncs"], status["drafter_syncs"]) == (1, 0)


def test_unset_installs_nothing_anywhere(runs: dict[str, Any]) -> None:
    """PATCHREG_PATCHSETS unset: nothing in the main process, the engine core or the worker; the status says what to set."""
    run = runs["mp-unset"]
    assert run["main_patches"] == []
    assert "patchreg_fingerprint" in run["core_fingerprint"]["error"]
    assert "patchreg_fingerprint" in run["worker_fingerprints"]["error"]
    for key in ("status_start", "status_path"):
        assert run[key]["error"].startswith("PatchError:") and "PATCHREG_PATCHSETS" in run[key]["error"]


# One process: which general plugins vLLM loads under each VLLM_PLUGINS value (read at each call), then the real
# load_general_plugins() with the variable unset, and what patchreg has active afterwards.
PLUGIN_PROBE = """
import json, os, patchreg
from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_general_plugins, load_plugins_by_group
out = {}
for value in ("patchreg", "lora_filesystem_resolver", "", "patchreg,lora_filesystem_resolver", " patchreg"):
    os.environ["VLLM_PLUGINS"] = value
    out[value] = "patchreg" in load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
os.environ.pop("VLLM_PLUGINS")
out["unset"] = "patchreg" in load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
load_general_plugins()
out["active"] = sorted(e.patch for e in patchreg.registry.active())
print(json.dumps(out))
"""


def test_vllm_plugins_filters_the_plugin_by_exact_name() -> None:
    """VLLM_PLUGINS unset or naming 'patchreg' loads the plugin (which applies the set); other names or '' do not."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    env.update({"PATCHREG_PATCHSETS": SET, "PYTHONPATH": str(REPO)})
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN_PROBE], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert SYNC_PATCH in out.pop("active")
    assert out == {
        "patchreg": True,
        "lora_filesystem_resolver": False,
        "": False,
        "patchreg,lora_filesystem_resolver": True,
        " patchreg": False,  # no whitespace stripping: the name must match exactly
        "unset": True,
    }
