"""Opt-in only: verl with patchreg installed is verl, until ``VERL_USE_EXTERNAL_MODULES=patches.verl`` (subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.verl.conftest import needs_verl

pytestmark = [needs_verl, pytest.mark.no_distributed]
ROOT = Path(__file__).resolve().parents[2]


def _scan(*args: str, env_var: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    if env_var is not None:
        env["VERL_USE_EXTERNAL_MODULES"] = env_var
    proc = subprocess.run(
        [sys.executable, "-m", "tests.verl.scan", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SCAN ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][5:])
    return result


def test_without_the_opt_in_every_verl_function_is_verls() -> None:
    """Importing verl's engine and rollout modules, and patches.verl itself, installs nothing and wraps nothing."""
    result = _scan("--import-patches")
    assert result["patches_verl_imported"]
    assert result["foreign"] == []
    assert result["active"] == []
    assert result["engine_fn"] == "verl.utils.megatron_utils"
    assert result["server_fn"] == "verl.workers.rollout.vllm_rollout.utils"


def test_verl_use_external_modules_turns_it_on_in_the_process() -> None:
    """With VERL_USE_EXTERNAL_MODULES=patches.verl, `import verl` applies VERL_MTP lazily: verl's call sites see ours."""
    result = _scan(env_var="patches.verl")
    assert result["patches_verl_imported"]
    assert result["engine_fn"] == "patches.verl.engine"
    assert result["server_fn"] == "patches.verl.rollout"
    assert sorted(name.split()[0] for name in result["active"]) == [
        "engine_initialize",
        "engine_patch_engine_mtp",
        "rollout_per_request_metrics",
        "rollout_spec_decode_stats",
        "rollout_speculative_config",
    ]
    assert {name.rsplit(".", 1)[-1] for name in result["foreign"]} == {  # each where verl looks it up
        "patch_engine_mtp",
        "initialize",
        "build_mtp_speculative_config",
        "build_cli_args_from_config",
        "extract_prompt_logprobs",
    }


def test_opted_in_reads_the_variable_as_verl_splits_it() -> None:
    """The variable names this package among others (comma-separated, spaces tolerated); nothing else opts in."""
    from patches.verl import opted_in

    assert opted_in({"VERL_USE_EXTERNAL_MODULES": "my.plugin, patches.verl"})
    assert not opted_in({"VERL_USE_EXTERNAL_MODULES": "patches.verl_extra"})
    assert not opted_in({})
