"""vLLM patch sets: MTP speculative rollout config, per-request spec-decode stats, the drafter sync."""

from __future__ import annotations

from patches.vllm._compat import mtp_method_names
from patches.vllm.drafter import DRAFTER_SYNC, WORKER_CHANNEL
from patches.vllm.fixes import SPEC_DECODE_METRICS_FIXES
from patches.vllm.mtp import (
    PER_REQUEST_METRICS_LEVELS,
    SpecDecodeStats,
    build_mtp_speculative_config,
    mtp_engine_kwargs,
    rollout_metrics,
    spec_decode_stats,
)
from patches.vllm.status import DrafterStatus, drafter_status

__all__ = [
    "DRAFTER_SYNC",
    "PER_REQUEST_METRICS_LEVELS",
    "SPEC_DECODE_METRICS_FIXES",
    "DrafterStatus",
    "SpecDecodeStats",
    "WORKER_CHANNEL",
    "build_mtp_speculative_config",
    "drafter_status",
    "mtp_engine_kwargs",
    "mtp_method_names",
    "rollout_metrics",
    "spec_decode_stats",
]
