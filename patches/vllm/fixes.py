"""Version-gated patches for vLLM releases whose per-request spec-decode metrics get lost.

vLLM 0.29.0 to 0.31.x record ``CompletionOutput.spec_decode_metrics`` on the
finished output, but ``RequestOutput.add(next_output, aggregate=True)`` (used by
``AsyncLLM`` to merge queued DELTA outputs when the consumer falls behind)
copies text, tokens and logprobs into the earlier completion and drops the
metrics. vLLM 0.32.0 carries them over itself, so the patch is skipped there.
"""

from __future__ import annotations

from typing import Any

from patchreg import Patch, PatchSet, not_needed_when, requires

__all__ = ["SPEC_DECODE_METRICS_FIXES", "keep_spec_decode_metrics"]


def keep_spec_decode_metrics(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``RequestOutput.add``: after a DELTA merge, carry the newer completions' metrics over."""
    next_output = args[0] if args else kwargs.get("next_output")
    aggregate = args[1] if len(args) > 1 else kwargs.get("aggregate", False)
    carried = {
        c.index: c.spec_decode_metrics
        for c in getattr(next_output, "outputs", None) or ()
        if getattr(c, "spec_decode_metrics", None) is not None
    }
    result = wrapped(*args, **kwargs)
    if aggregate and carried:
        for completion in instance.outputs:
            if completion.index in carried:
                completion.spec_decode_metrics = carried[completion.index]
    return result


SPEC_DECODE_METRICS_FIXES = PatchSet(
    "vllm-spec-decode-metrics-fixes",
    [
        Patch(
            name="vllm.request-output-add-keeps-spec-decode-metrics",
            target="vllm.outputs:RequestOutput.add",
            replacement=keep_spec_decode_metrics,
            kind="wrap",
            # needed on 0.29-0.31 only: older releases have no per-request metrics, 0.32 fixed the merge
            when=requires("vllm") & not_needed_when(requires("vllm<0.29") | requires("vllm>=0.32")),
            doc="vLLM 0.29-0.31 drop CompletionOutput.spec_decode_metrics when merging DELTA outputs.",
        )
    ],
    "vLLM 0.29-0.31: keep per-request spec-decode metrics when AsyncLLM merges DELTA outputs",
)
"""Apply once per process that runs an ``AsyncLLM`` with ``output_kind=DELTA``; skipped elsewhere."""
