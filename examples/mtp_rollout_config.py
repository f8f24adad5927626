"""MTP speculative rollout on vLLM, on CPU: the config we hand vLLM, what vLLM makes of it, and the stats.

Run: ``python examples/mtp_rollout_config.py`` (needs ``pip install -e '.[vllm]'``).

1. Writes a tiny DeepSeek-V3-style Hugging Face config (one MTP layer) to a temp dir.
2. Builds the engine keywords with ``mtp_engine_kwargs`` (the speculative config,
   plus ``per_request_spec_decode_metrics`` so the stats arrive at all).
3. Lets vLLM resolve them (``EngineArgs(...).create_engine_config()``) and prints
   the draft model vLLM derived from the target's MTP layer.
4. Builds sample finished ``RequestOutput`` objects carrying vLLM's own
   ``RequestSpecDecodeMetrics`` (as the engine would on a GPU) and prints the
   per-request stats and the batch metrics a trainer logs.

vLLM's engine cannot generate on CPU, so step 4 constructs the outputs instead.
The first run inspects two model classes in subprocesses (about 30 s); vLLM
caches that under ``VLLM_CACHE_ROOT`` (``<repo>/.cache/vllm`` by default here).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CACHE_ROOT", str(REPO / ".cache" / "vllm"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from patches.vllm import mtp_engine_kwargs, rollout_metrics, spec_decode_stats  # noqa: E402

TINY_DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "num_nextn_predict_layers": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}

# What a user might put under rollout.engine_kwargs.vllm.speculative_config (None means "unset").
USER_OVERRIDES = '{"enforce_eager": true, "draft_tensor_parallel_size": null}'


def resolve(model_dir: Path, kwargs: dict[str, Any]) -> Any:
    """Let vLLM build its engine config from our keywords (no engine is started)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(model_dir), skip_tokenizer_init=True, max_model_len=256, **kwargs
    ).create_engine_config()


def sample_output(request_id: str, steps_per_completion: list[list[tuple[int, int]]]) -> Any:
    """A finished RequestOutput whose completions carry vLLM's metrics for (drafted, accepted) verify steps."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    completions = []
    for index, steps in enumerate(steps_per_completion):
        metrics = RequestSpecDecodeMetrics.new(2)
        for drafted, accepted in steps:
            metrics.observe(num_draft_tokens=drafted, num_accepted=accepted)
        completions.append(
            CompletionOutput(index, "", [7] * (len(steps) + 1), None, None, "stop", spec_decode_metrics=metrics)
        )
    return RequestOutput(request_id, None, [0], None, completions, finished=True)


def main() -> None:
    kwargs = mtp_engine_kwargs(
        "deepseek_mtp", 2, USER_OVERRIDES, setting="rollout.engine_kwargs.vllm.speculative_config"
    )
    print("engine keywords we pass to vLLM:")
    print(json.dumps(kwargs, indent=2))

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-deepseek-v3"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(TINY_DEEPSEEK_V3))
        config = resolve(model_dir, kwargs)

    spec = config.speculative_config
    draft = spec.draft_model_config
    print("\nvLLM's resolved speculative config:")
    print(f"  method={spec.method!r} num_speculative_tokens={spec.num_speculative_tokens}")
    print(f"  draft architectures={draft.architectures} model_type={draft.hf_config.model_type!r}")
    passes = spec.num_speculative_tokens // draft.hf_config.n_predict
    print(f"  draft n_predict={draft.hf_config.n_predict} (its MTP layers run {passes}x per verify step)")
    print(f"  per_request_spec_decode_metrics={config.observability_config.per_request_spec_decode_metrics!r}")

    outputs = [
        sample_output("req-0", [[(2, 2), (2, 1), (2, 2)]]),
        sample_output("req-1", [[(2, 0), (2, 1)], [(2, 2)]]),  # n=2: summed over both completions
        sample_output("req-2", [[]]),  # finished before any verify step
    ]
    print("\nper-request stats:")
    stats = [spec_decode_stats(out) for out in outputs]
    for out, s in zip(outputs, stats, strict=True):
        assert s is not None
        print(
            f"  {out.request_id}: drafted={s.num_draft_tokens} accepted={s.num_accepted_tokens} "
            f"verify_steps={s.num_verify_steps} rate={s.acceptance_rate:.3f} "
            f"mean_len={s.mean_acceptance_length:.3f} histogram={list(s.acceptance_histogram)}"
        )
    print("\nbatch metrics for the trainer's logger:")
    for key, value in rollout_metrics([*stats, None]).items():
        print(f"  {key} = {value:.4g}")


if __name__ == "__main__":
    main()
