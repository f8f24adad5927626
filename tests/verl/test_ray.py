"""Ray 2.60 on a local cluster: PATCHREG_PATCHSETS and the setup hook reach every actor; assert_consistent over them.

The cluster is started by the test (2 CPUs, no dashboard, its own HOME: Ray writes ~/.ray/auth_token) and shut
down after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.verl.conftest import HAVE_VERL, needs_verl

pytestmark = needs_verl
ROOT = Path(__file__).resolve().parents[2]
SETS = ["megatron-cpu", "verl-mtp"]


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A local Ray cluster whose job runtime_env is patchreg.ray_runtime_env(SETS); shut down after the test."""
    import ray

    import patchreg

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("PATCHREG_PATCHSETS", "PATCHREG_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    runtime_env = patchreg.ray_runtime_env(SETS)
    runtime_env["env_vars"].update(PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT)), OMP_NUM_THREADS="1")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.skipif(not HAVE_VERL, reason="ray is not importable")
def test_ray_actors_bootstrapped_by_the_setup_hook_agree_and_a_disabled_one_is_named(cluster: Any) -> None:
    """Two actors get the sets from the setup hook before __init__, enter mtp_patched and agree; a third whose
    PATCHREG_DISABLE names a patch is named, with the patch, by the agreement check."""
    import patchreg
    from patchreg.distributed import assert_consistent
    from tests.verl.ray_actor import Trainer

    ray = cluster
    actor = ray.remote(num_cpus=0)(Trainer)
    actors = [actor.remote(), actor.remote()]
    states = ray.get([a.enter.remote() for a in actors])
    for state in states:
        assert state["held_at_init"] == SETS
        assert state["active"] is True and state["installed"] >= 1
        assert state["shape"][-1] == 64
    assert states[0]["pid"] != states[1]["pid"]
    common = assert_consistent(actors)

    odd = actor.options(runtime_env={"env_vars": {"PATCHREG_DISABLE": "verl-mtp.rollout_spec_decode_stats"}}).remote()
    state = ray.get(odd.enter.remote())
    assert state["disable"] == "verl-mtp.rollout_spec_decode_stats" and state["held_at_init"] == SETS
    with pytest.raises(patchreg.PatchError) as info:
        assert_consistent([*actors, odd])
    message = str(info.value)
    assert message.startswith(f"Patch state differs across actors: actor(s) [0, 1] (Trainer pid {states[0]['pid']}")
    assert f"have fingerprint {common}" in message
    assert f"but actor(s) [2] (Trainer pid {state['pid']})" in message
    assert "missing install rollout_spec_decode_stats" in message
    ray.get([a.leave.remote() for a in [*actors, odd]])
