"""``VERL_MTP``: verl 0.9's MTP hooks routed through patchreg (opt-in; apply it lazily, before verl is imported).

Each patch sits where verl looks the name up (a module global of the module that calls it), so it
works whichever of verl's modules is imported first:

- ``engine_patch_engine_mtp``: ``transformer_impl.patch_engine_mtp`` -> :func:`patches.verl.engine.patch_engine_mtp`
- ``engine_initialize``: a wrap of ``MegatronEngine.initialize`` that tells it which engine it is patching for
- ``rollout_speculative_config``: ``vllm_async_server.build_mtp_speculative_config`` -> the strict builder
- ``rollout_per_request_metrics``: a wrap of ``vllm_async_server.build_cli_args_from_config``
- ``rollout_spec_decode_stats``: a wrap of ``vllm_async_server.extract_prompt_logprobs``
"""

from __future__ import annotations

from patches.verl.engine import initializing, patch_engine_mtp
from patches.verl.rollout import build_mtp_speculative_config, with_per_request_metrics, with_spec_decode_stats
from patchreg import Patch, PatchSet, accepts, requires

__all__ = ["ENGINE_INITIALIZE", "ENGINE_PATCH", "ROLLOUT_CONFIG", "ROLLOUT_METRICS", "ROLLOUT_STATS", "VERL_MTP"]

ENGINE = "verl.workers.engine.megatron.transformer_impl"
SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_VERL = requires("verl>=0.9,<0.10")

ENGINE_PATCH = Patch(
    "engine_patch_engine_mtp",
    f"{ENGINE}:patch_engine_mtp",
    patch_engine_mtp,
    when=_VERL & accepts(f"{ENGINE}:patch_engine_mtp", "module", "model_config"),
    doc="the engine's chunks get patchreg's MTP set (detach_encoder from verl's model config), held for its life",
)

ENGINE_INITIALIZE = Patch(
    "engine_initialize",
    f"{ENGINE}:MegatronEngine.initialize",
    initializing,
    kind="wrap",
    when=_VERL & accepts(f"{ENGINE}:MegatronEngine.initialize", "self"),
    doc="names the engine whose initialize() calls patch_engine_mtp (its MTP installs go when it goes)",
)

ROLLOUT_CONFIG = Patch(
    "rollout_speculative_config",
    f"{SERVER}:build_mtp_speculative_config",
    build_mtp_speculative_config,
    when=_VERL
    & accepts(
        f"{SERVER}:build_mtp_speculative_config", "method", "num_speculative_tokens", "engine_speculative_config"
    ),
    doc="vLLM's speculative_config from patches.vllm: overrides may not change method or num_speculative_tokens",
)

ROLLOUT_METRICS = Patch(
    "rollout_per_request_metrics",
    f"{SERVER}:build_cli_args_from_config",
    with_per_request_metrics,
    kind="wrap",
    when=_VERL & accepts(f"{SERVER}:build_cli_args_from_config", "config"),
    doc="an MTP rollout server starts vLLM with per_request_spec_decode_metrics (mtp_engine_kwargs)",
)

ROLLOUT_STATS = Patch(
    "rollout_spec_decode_stats",
    f"{SERVER}:extract_prompt_logprobs",
    with_spec_decode_stats,
    kind="wrap",
    when=_VERL & accepts(f"{SERVER}:extract_prompt_logprobs", "output"),
    doc="each finished request carries spec_decode_stats() where verl reads request_spec_decode_stats",
)

VERL_MTP = PatchSet(
    "verl-mtp",
    (ENGINE_PATCH, ENGINE_INITIALIZE, ROLLOUT_CONFIG, ROLLOUT_METRICS, ROLLOUT_STATS),
    doc="verl 0.9's MTP through patchreg: the engine's MTP set per engine, the strict vLLM rollout config and stats",
)
