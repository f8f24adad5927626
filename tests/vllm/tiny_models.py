"""Tiny Hugging Face configs for three MTP families, and what vLLM derives from them."""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v3": {
        **_COMMON,
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "moe_intermediate_size": 32,
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
    },
    "qwen3_next": {
        **_COMMON,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "full_attention_interval": 4,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "partial_rotary_factor": 0.25,
    },
    "mimo": {  # MiMo checkpoints ship remote code; vLLM keys on the architecture name
        **_COMMON,
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
    },
}

# kind -> (the MTP alias vLLM used to name this family, the draft architecture vLLM derives)
EXPECTED_DRAFT: dict[str, tuple[str, str]] = {
    "deepseek_v3": ("deepseek_mtp", "DeepSeekMTPModel"),
    "qwen3_next": ("qwen3_next_mtp", "Qwen3NextMTP"),
    "mimo": ("mimo_mtp", "MiMoMTPModel"),
}
