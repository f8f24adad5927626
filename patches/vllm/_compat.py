"""What the installed vLLM release offers, as patchreg predicates and lazy look-ups.

Facts checked against the vLLM wheels on PyPI (0.9.2 to 0.34.0):

- ``method="mtp"`` exists from 0.11.0; from then on every ``*_mtp`` alias is
  deprecated and rewritten to ``"mtp"`` by ``SpeculativeConfig.__post_init__``.
  The aliases are ``typing.get_args(vllm.config.speculative.MTPModelTypes)``
  from 0.11.1 (0.11.0 has the tuple ``MTP_MODEL_TYPES`` instead).
- Per-request spec-decode numbers (``CompletionOutput.spec_decode_metrics``,
  ``vllm.v1.metrics.stats.RequestSpecDecodeMetrics`` and the engine setting
  ``per_request_spec_decode_metrics``) exist from 0.29.0.
- 0.29.0 to 0.31.x drop ``spec_decode_metrics`` when ``RequestOutput.add``
  merges DELTA outputs (``aggregate=True``); 0.32.0 carries it over.

Nothing here imports vLLM at module import time.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import logging
import typing

from patchreg import Predicate, has, requires

__all__ = [
    "BUILTIN_MTP_METHODS",
    "ENGINE_PROVIDED_KEYS",
    "HAS_MTP_METHOD",
    "HAS_PER_REQUEST_METRICS",
    "LOSES_METRICS_ON_DELTA_MERGE",
    "VLLM_INSTALLED",
    "mtp_method_names",
    "speculative_config_keys",
    "vllm_version",
]

logger = logging.getLogger("patchreg.vllm")

VLLM_INSTALLED: Predicate = requires("vllm")
"""vLLM is installed (any release)."""

HAS_MTP_METHOD: Predicate = requires("vllm>=0.11")
"""``method="mtp"`` exists and the ``*_mtp`` aliases are deprecated in its favour."""

HAS_PER_REQUEST_METRICS: Predicate = requires("vllm>=0.29") & has("vllm.outputs:CompletionOutput.spec_decode_metrics")
"""The engine can record per-request acceptance numbers on each ``CompletionOutput``."""

LOSES_METRICS_ON_DELTA_MERGE: Predicate = requires("vllm>=0.29,<0.32")
"""``RequestOutput.add(..., aggregate=True)`` drops the terminal ``spec_decode_metrics``."""

BUILTIN_MTP_METHODS: tuple[str, ...] = (
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
)
"""``MTPModelTypes`` of vLLM 0.33.0, used only when vLLM is not installed."""

ENGINE_PROVIDED_KEYS: frozenset[str] = frozenset(
    {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config"}
)
"""``SpeculativeConfig`` fields the engine fills in itself; a user override may not set them."""


def vllm_version() -> str | None:
    """The installed vLLM version string, or None when vLLM is not installed."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


@functools.cache
def mtp_method_names() -> tuple[str, ...]:
    """The MTP method names the installed vLLM knows (``"mtp"`` and its aliases).

    Read from ``vllm.config.speculative.MTPModelTypes``; the built-in list of
    vLLM 0.33.0 is used only when vLLM is not installed.
    """
    if not (VLLM_INSTALLED.evaluate().ok and _vllm_importable()):
        return BUILTIN_MTP_METHODS
    from vllm.config import speculative

    literal = getattr(speculative, "MTPModelTypes", None)
    if literal is not None:
        return tuple(typing.get_args(literal))
    legacy = tuple(getattr(speculative, "MTP_MODEL_TYPES", ()))  # vLLM 0.11.0
    return (*legacy, "mtp") if "mtp" not in legacy else legacy


@functools.cache
def speculative_config_keys() -> frozenset[str] | None:
    """The keyword names ``vllm.config.SpeculativeConfig`` takes, or None without vLLM."""
    if not (VLLM_INSTALLED.evaluate().ok and _vllm_importable()):
        return None
    from vllm.config import SpeculativeConfig

    return frozenset(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init)
