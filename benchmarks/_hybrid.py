"""A tiny real Megatron-Core HybridModel with MTP, on CPU, from local specs (mirrors tests/megatron/hybrid_models.py;
not imported from tests/). None where the release has no HybridModel with MTP."""

from __future__ import annotations

import importlib.util
from typing import Any

from benchmarks._model import SEQ, VOCAB, init_parallel, tiny_config


def available() -> bool:
    """Whether this megatron-core has a HybridModel whose stack takes an MTP block."""
    try:
        if importlib.util.find_spec("megatron.core.models.hybrid.hybrid_model") is None:
            return False
        from megatron.core.models.hybrid import hybrid_block
    except ModuleNotFoundError:
        return False
    fields = getattr(getattr(hybrid_block, "HybridStackSubmodules", None), "__dataclass_fields__", {})
    return "mtp_block_spec" in fields


def _spec() -> Any:
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.multi_token_prediction import (
        MultiTokenPredictionBlock,
        MultiTokenPredictionBlockSubmodules,
        MultiTokenPredictionLayer,
        MultiTokenPredictionLayerSubmodules,
    )
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

    attention_submodules = SelfAttentionSubmodules(
        linear_qkv=ColumnParallelLinear,
        core_attention=DotProductAttention,
        linear_proj=RowParallelLinear,
        q_layernorm=IdentityOp,
        k_layernorm=IdentityOp,
    )
    attention = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal}, submodules=attention_submodules
            ),
            self_attn_bda=get_bias_dropout_add,
        ),
    )
    mlp = ModuleSpec(
        module=MLPLayer,
        submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=ModuleSpec(
                module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
            ),
            mlp_bda=get_bias_dropout_add,
        ),
    )
    mtp_layer = ModuleSpec(
        module=MultiTokenPredictionLayer,
        submodules=MultiTokenPredictionLayerSubmodules(
            enorm=WrappedTorchNorm,
            hnorm=WrappedTorchNorm,
            eh_proj=ColumnParallelLinear,
            mtp_model_layer=None,  # built from the MTP pattern by the block
            layer_norm=WrappedTorchNorm,
        ),
    )
    mtp_block = ModuleSpec(
        module=MultiTokenPredictionBlock, submodules=MultiTokenPredictionBlockSubmodules(layer_specs=[mtp_layer])
    )
    submodules = HybridStackSubmodules(attention_layer=attention, mlp_layer=mlp, mtp_block_spec=mtp_block)
    return ModuleSpec(module=HybridStack, submodules=submodules)


def build(mtp_layers: int = 1, *, seed: int = 0) -> Any:
    """A HybridModel (two attention + MLP main layers, ``mtp_layers`` MTP depths of one pair), CPU-initialised."""
    import torch
    from megatron.core.models.hybrid.hybrid_model import HybridModel

    init_parallel()
    torch.manual_seed(seed)
    config = tiny_config(4, mtp_layers)
    from patches.megatron.cpu import cpu_patched

    with cpu_patched():  # HybridStack's final norm is a hard-coded TENorm: the CPU shims build a torch one
        return HybridModel(
            config=config,
            vocab_size=VOCAB,
            max_sequence_length=SEQ * 2,
            position_embedding_type="learned_absolute",
            hybrid_stack_spec=_spec(),
            hybrid_layer_pattern="*-*-" + "/*-" * mtp_layers,
        )
