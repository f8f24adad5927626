"""Tiny real HybridModels (megatron-core 0.18.2+) and MambaModels (0.17.1) on CPU, from local specs.

The stock ``hybrid_stack_spec`` uses Transformer Engine modules; these specs use Megatron-Core's
local ones (ColumnParallelLinear / DotProductAttention / RowParallelLinear, torch norms). The
stack's final norm is hard-coded ``TENorm`` upstream: ``cpu_patched()`` swaps it while the model
is built (the ``hybrid_final_norm`` shim). Pattern ``"*-*-/*-"``: two attention + MLP main layers,
then one MTP depth (one attention + MLP pair) per ``/*-``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tests.megatron.conftest import SEQ, VOCAB, make_config

__all__ = [
    "HYBRID_MODULE",
    "build_hybrid",
    "hybrid_class",
    "hybrid_reference",
    "hybrid_skip_reason",
    "inner",
    "mtp_params",
    "pattern",
    "trunk_params",
]

#: Where each release keeps its hybrid model class, newest first: (module, class, stack module, stack class).
_CLASSES = (
    ("megatron.core.models.hybrid.hybrid_model", "HybridModel", "megatron.core.models.hybrid.hybrid_block",
     "HybridStack", "HybridStackSubmodules"),
    ("megatron.core.models.mamba.mamba_model", "MambaModel", "megatron.core.ssm.mamba_block",
     "MambaStack", "MambaStackSubmodules"),
)  # fmt: skip

HYBRID_MODULE = _CLASSES[0][0]


def _found() -> tuple[str, ...] | None:
    """The first entry of ``_CLASSES`` this release has, with MTP support (a ``mtp_block_spec`` submodule)."""
    for entry in _CLASSES:
        try:
            if importlib.util.find_spec(entry[0]) is None:
                continue
        except ModuleNotFoundError:
            continue
        stack = importlib.import_module(entry[2])
        submodules = getattr(stack, entry[4], None)
        if submodules is not None and "mtp_block_spec" in getattr(submodules, "__dataclass_fields__", {}):
            return entry
    return None


def hybrid_skip_reason() -> str | None:
    """Why this release has no hybrid model with MTP to test, or None."""
    from tests.megatron.conftest import MCORE

    if _found() is None:
        return f"megatron-core {MCORE} has no HybridModel / MambaModel with MTP"
    return None


def hybrid_class() -> Any:
    """The release's hybrid model class (HybridModel 0.18+, MambaModel 0.17)."""
    entry = _found()
    assert entry is not None
    return getattr(importlib.import_module(entry[0]), entry[1])


def pattern(depth: int = 1) -> str:
    """The layer pattern: two attention+MLP main layers and ``depth`` MTP depths of one attention+MLP pair."""
    return "*-*-" + "/*-" * depth


def _stack_spec() -> Any:
    import importlib

    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
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

    entry = _found()
    assert entry is not None
    stack = importlib.import_module(entry[2])
    attention = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=ColumnParallelLinear,
                    core_attention=DotProductAttention,
                    linear_proj=RowParallelLinear,
                    q_layernorm=IdentityOp,
                    k_layernorm=IdentityOp,
                ),
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
    submodules = getattr(stack, entry[4])(attention_layer=attention, mlp_layer=mlp, mtp_block_spec=mtp_block)
    return ModuleSpec(module=getattr(stack, entry[3]), submodules=submodules)


def build_hybrid(seed: int = 1234, tied: bool = False, depth: int = 1, mtp: bool = True, **overrides: Any) -> Any:
    """A tiny real HybridModel (MambaModel on 0.17) with ``depth`` MTP depths (none if ``mtp=False``)."""
    import inspect

    import torch
    from megatron.core.tensor_parallel import random as tp_random

    cls = hybrid_class()
    pre, post = overrides.pop("pre_process", True), overrides.pop("post_process", True)
    position = overrides.pop("position_embedding_type", "learned_absolute")
    fields = {"num_layers": 4, **overrides}
    config = make_config(mtp_num_layers=depth, **fields) if mtp else make_config(mtp_num_layers=None, **fields)
    torch.manual_seed(seed)
    tp_random.model_parallel_cuda_manual_seed(seed)
    spec_arg = "hybrid_stack_spec" if "hybrid_stack_spec" in inspect.signature(cls).parameters else "mamba_stack_spec"
    pattern_arg = next(
        name
        for name in ("hybrid_layer_pattern", "hybrid_override_pattern")
        if name in inspect.signature(cls).parameters
    )
    return cls(
        config=config,
        vocab_size=VOCAB,
        max_sequence_length=SEQ * 2,
        pre_process=pre,
        post_process=post,
        share_embeddings_and_output_weights=tied,
        position_embedding_type=position,
        **{spec_arg: _stack_spec(), pattern_arg: pattern(depth) if mtp else "*-*-"},
    )


def inner(model: Any) -> Any:
    """The hybrid model inside ``.module`` / ``.language_model`` wrappers."""
    cls = hybrid_class()
    while not isinstance(model, cls):
        model = getattr(model, "module", None) or model.language_model
    return model


def mtp_params(model: Any) -> dict[str, Any]:
    """The MTP block's parameters by name."""
    return {n: p for n, p in inner(model).named_parameters() if n.startswith("mtp.")}


def trunk_params(model: Any) -> dict[str, Any]:
    """Embedding, decoder and output-layer parameters by name (shared weights once)."""
    return {n: p for n, p in inner(model).named_parameters() if not n.startswith("mtp.")}


def hybrid_reference(model: Any, batch: Any) -> Any:
    """Main-head logits and the MTP loss from the model's own modules, forward hooks and plain torch."""
    import torch
    import torch.nn.functional as F

    from tests.megatron.conftest import Reference, roll_left

    hybrid = inner(model)
    captured: dict[str, Any] = {"mtp": []}
    hooks = [hybrid.decoder.register_forward_hook(lambda m, i, o: captured.__setitem__("decoder", _first(o)))]
    for layer in hybrid.mtp.layers:
        hooks.append(layer.register_forward_hook(lambda m, i, o: captured["mtp"].append(_first(o))))
    try:
        hybrid(*batch.args(), **batch.kwargs())
    finally:
        for hook in hooks:
            hook.remove()
    weight = hybrid.shared_embedding_or_output_weight() if hybrid.share_embeddings_and_output_weights else None
    logits = hybrid.output_layer(captured["decoder"], weight=weight)[0].transpose(0, 1)
    losses = []
    for depth, states in enumerate(captured["mtp"], start=1):
        labels, mask = roll_left(batch.labels, depth), roll_left(batch.loss_mask, depth)
        depth_logits = hybrid.output_layer(states, weight=weight)[0].transpose(0, 1)
        ce = F.cross_entropy(depth_logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none")
        losses.append((ce.view_as(mask) * mask).sum() / mask.sum().clamp(min=1))
    scale = hybrid.config.mtp_loss_scaling_factor / hybrid.config.mtp_num_layers
    return Reference(logits, tuple(losses), scale * torch.stack(losses).sum())


def _first(output: Any) -> Any:
    return output[0] if isinstance(output, tuple) else output
