"""verl's vLLM rollout on ``patches.vllm``: the strict MTP speculative config, per-request stats on and read.

verl 0.9's ``vllm_async_server`` (names imported from ``verl.workers.rollout.vllm_rollout.utils``):

- ``build_mtp_speculative_config(method, num_speculative_tokens, engine_speculative_config)`` merges the
  overrides *over* ``method`` / ``num_speculative_tokens``, so an override silently replaces them.
  :func:`build_mtp_speculative_config` is ``patches.vllm.build_mtp_speculative_config``: an override may
  repeat them with an equal value, never change them (``ValueError`` naming both).
- ``build_cli_args_from_config(args)`` turns the server's arguments into vLLM's command line;
  :func:`with_per_request_metrics` adds ``per_request_spec_decode_metrics`` (from
  ``patches.vllm.mtp_engine_kwargs``) when the arguments carry an MTP speculative config and do not set it,
  so vLLM records per-request acceptance numbers.
- Each finished request goes through ``extract_prompt_logprobs(output=final_res, ...)`` before verl reads
  ``final_res.metrics.request_spec_decode_stats`` (an attribute no vLLM sets); :func:`with_spec_decode_stats`
  puts ``patches.vllm.spec_decode_stats(final_res)`` there first, so verl's ``spec_num_*`` fields arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from patches.vllm import build_mtp_speculative_config as strict_speculative_config
from patches.vllm import mtp_engine_kwargs, spec_decode_stats

__all__ = ["SETTING", "build_mtp_speculative_config", "with_per_request_metrics", "with_spec_decode_stats"]

logger = logging.getLogger("patchreg.verl")

#: The verl setting the overrides come from, named in error messages.
SETTING = "rollout.engine_kwargs.vllm.speculative_config"
_METRICS_KEY = "per_request_spec_decode_metrics"
_STATS_ATTR = "request_spec_decode_stats"


def build_mtp_speculative_config(
    method: str, num_speculative_tokens: int, engine_speculative_config: Any = None
) -> dict[str, Any]:
    """verl's signature, ``patches.vllm``'s rules: overrides never change ``method`` or ``num_speculative_tokens``."""
    return strict_speculative_config(method, num_speculative_tokens, engine_speculative_config, setting=SETTING)


def with_per_request_metrics(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap of ``build_cli_args_from_config(config)``: MTP rollout asks vLLM for per-request acceptance stats."""
    config = kwargs.get("config", args[0] if args else None)
    if isinstance(config, Mapping) and _METRICS_KEY not in config and _METRICS_KEY.replace("_", "-") not in config:
        spec = config.get("speculative_config")
        if isinstance(spec, Mapping) and spec.get("method") == "mtp":
            rest = {k: v for k, v in spec.items() if k not in ("method", "num_speculative_tokens")}
            extra = mtp_engine_kwargs("mtp", spec.get("num_speculative_tokens", 1), rest, setting=SETTING)
            if _METRICS_KEY in extra:
                config = {**config, _METRICS_KEY: extra[_METRICS_KEY]}
                args, kwargs = ((config, *args[1:]), kwargs) if args else (args, {**kwargs, "config": config})
    return wrapped(*args, **kwargs)


def with_spec_decode_stats(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap of ``extract_prompt_logprobs(output, ...)``: the request's stats where verl reads them."""
    output = kwargs.get("output", args[0] if args else None)
    _attach_stats(output)
    return wrapped(*args, **kwargs)


def _attach_stats(output: Any) -> None:
    completions = getattr(output, "outputs", None) or ()
    if not any(getattr(c, "spec_decode_metrics", None) is not None for c in completions):
        return  # no speculative decoding recorded: verl's own warning says so when MTP rollout is on
    metrics = getattr(output, "metrics", None)
    if metrics is None:
        logger.info("patchreg: a RequestOutput without metrics (stats logging off): verl cannot read its stats.")
        return
    stats = spec_decode_stats(output)
    if stats is not None:
        setattr(metrics, _STATS_ATTR, stats)  # SpecDecodeStats has the three num_* fields verl reads
