"""Tiny real architectures for the MTP tests, built from Megatron-Core's own local specs on the CPU.

Each :class:`Arch` names a config (MoE with the allgather dispatcher and aux loss, MLA + MoE as in
DeepSeek-V3, GQA + RoPE + RMSNorm + SwiGLU as in GLM / MiMo) and how the model is built
(``get_gpt_layer_local_spec`` and ``get_gpt_mtp_block_spec`` of the installed release). What a release
cannot build on the CPU even with ``cpu_patched()`` is named by :func:`unbuildable`, the reason a
test skips with. Nothing here is mocked.
"""

from __future__ import annotations

from typing import Any

import attrs

from tests.megatron.conftest import BATCH, HIDDEN, MCORE, SEQ, VOCAB, make_batch

__all__ = ["ARCHS", "Arch", "ArchBatch", "arch_batch", "build_arch", "unbuildable"]

_BASE: dict[str, Any] = dict(
    num_layers=1,
    hidden_size=HIDDEN,
    num_attention_heads=2,
    use_cpu_initialization=True,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    mtp_num_layers=1,
    mtp_loss_scaling_factor=0.3,
)

_MOE: dict[str, Any] = dict(
    num_moe_experts=4,
    moe_router_topk=2,
    moe_token_dispatcher_type="allgather",
    moe_router_load_balancing_type="aux_loss",
    moe_aux_loss_coeff=0.01,
    moe_ffn_hidden_size=16,
    add_bias_linear=False,  # MoE experts with biases fail upstream on the local path (in-place view error)
)

_MLA: dict[str, Any] = dict(
    multi_latent_attention=True,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_head_dim=8,
    qk_pos_emb_head_dim=8,
    v_head_dim=8,
    rope_type="rope",
)

_GQA: dict[str, Any] = dict(
    num_attention_heads=4,
    num_query_groups=2,
    add_qkv_bias=True,
    add_bias_linear=False,
    normalization="RMSNorm",
    gated_linear_unit=True,
)

_RECOMPUTE: dict[str, Any] = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


@attrs.frozen
class Arch:
    """One tiny architecture: config overrides, local-spec arguments, position embedding, tying, dtype."""

    name: str
    config: dict[str, Any]
    spec: dict[str, Any] = attrs.field(factory=dict)
    position_embedding_type: str = "learned_absolute"
    tied: bool = False
    bf16: bool = False

    @property
    def moe(self) -> bool:
        """Whether the layers route through experts (their routers take an aux-loss gradient)."""
        return bool(self.config.get("num_moe_experts"))

    @property
    def mla(self) -> bool:
        """Whether attention is multi-latent (MLATransformerConfig)."""
        return bool(self.config.get("multi_latent_attention"))

    @property
    def depth(self) -> int:
        """The number of MTP depths."""
        return int(self.config.get("mtp_num_layers", 1))


ARCHS: dict[str, Arch] = {
    arch.name: arch
    for arch in (
        Arch("moe", {**_MOE}, {"num_experts": 4}),
        Arch("moe_recompute", {**_MOE, **_RECOMPUTE, "mtp_num_layers": 2}, {"num_experts": 4}),
        Arch(
            "mla_moe",
            {**_MOE, **_MLA, "mtp_num_layers": 2, "moe_shared_expert_intermediate_size": 16},
            {"num_experts": 4, "multi_latent_attention": True},
            position_embedding_type="rope",
        ),
        Arch("gqa_rope", {**_GQA}, {"normalization": "RMSNorm"}, position_embedding_type="rope", tied=True),
        Arch("gqa_rope_bf16", {**_GQA, "bf16": True}, {"normalization": "RMSNorm"}, "rope", tied=True, bf16=True),
    )
}


def unbuildable(arch: Arch) -> str | None:
    """Why the installed release cannot run ``arch`` on the CPU even under ``cpu_patched()`` (None: it can)."""
    import dataclasses

    from megatron.core.transformer.transformer_config import MLATransformerConfig

    fields = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    missing = sorted(k for k in arch.config if k not in fields)
    if missing:
        return f"megatron-core {MCORE}'s TransformerConfig has no {', '.join(missing)}"
    return None


def build_arch(arch: Arch, seed: int = 1234, **overrides: Any) -> Any:
    """The tiny GPTModel of ``arch`` (Float16Module-wrapped when bf16), weights from ``seed``."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    fields = {**_BASE, **arch.config, **overrides}
    config = (MLATransformerConfig if arch.mla else TransformerConfig)(**fields)
    spec = get_gpt_layer_local_spec(**arch.spec)
    torch.manual_seed(seed)
    tp_random.model_parallel_cuda_manual_seed(seed)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ * 2,
        share_embeddings_and_output_weights=arch.tied,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
        position_embedding_type=arch.position_embedding_type,
    )
    if arch.bf16:
        from megatron.core.transformer.module import Float16Module

        return Float16Module(config, model)
    return model


@attrs.frozen
class ArchBatch:
    """A batch for GPTModel.forward with optional extras (``padding_mask``, no attention mask)."""

    input_ids: Any
    position_ids: Any
    attention_mask: Any
    labels: Any
    loss_mask: Any
    extra: dict[str, Any] = attrs.field(factory=dict)

    def args(self) -> tuple[Any, Any, Any]:
        """Positional arguments of GPTModel.forward."""
        return self.input_ids, self.position_ids, self.attention_mask

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments: labels, loss mask and the extras."""
        return {"labels": self.labels, "loss_mask": self.loss_mask, **self.extra}


def arch_batch(padded: bool = False, no_mask: bool = False, seed: int = 7) -> ArchBatch:
    """conftest's batch; ``padded``: the second row's last 3 tokens are padding (``padding_mask`` True, loss
    masked); ``no_mask``: no attention mask (upstream builds its default causal one)."""
    import torch

    base = make_batch(seed)
    extra: dict[str, Any] = {}
    mask = base.loss_mask
    if padded:
        padding = torch.zeros(BATCH, SEQ, dtype=torch.bool)
        padding[1, -3:] = True
        mask = mask.masked_fill(padding, 0.0)
        extra["padding_mask"] = padding
    attention = None if no_mask else base.attention_mask
    return ArchBatch(base.input_ids, base.position_ids, attention, base.labels, mask, extra)
