"""vLLM patch set: MTP speculative rollout config and per-request spec-decode stats."""

from __future__ import annotations

from patches.vllm._compat import mtp_method_names
from patches.vllm.fixes import SPEC_DECODE_METRICS_FIXES
from patches.vllm.mtp import (
    PER_REQUEST_METRICS_LEVELS,
    SpecDecodeStats,
    build_mtp_speculative_config,
    mtp_engine_kwargs,
    rollout_metrics,
    spec_decode_stats,
)

__all__ = [
    "PER_REQUEST_METRICS_LEVELS",
    "SPEC_DECODE_METRICS_FIXES",
    "SpecDecodeStats",
    "build_mtp_speculative_config",
    "mtp_engine_kwargs",
    "mtp_method_names",
    "rollout_metrics",
    "spec_decode_stats",
]
