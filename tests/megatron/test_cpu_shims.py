"""cpu_patched's shims for real architectures: installed or skipped per release with a reason, restored exactly.

What each shim makes run (MoE routing, MLA, RoPE, the default causal mask, packed sequences) is
tested on real models in test_architectures.py; here: which release gets which shim, and why.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

import torch

from patches.megatron import CPU_SET, cpu_patched

ARCH_SHIMS = (
    "causal_mask_on_cpu",
    "moe_router_on_cpu",
    "mla_no_te_linear",
    "mla_local_attention",
    "packed_local_attention",
    "rope_init_on_cpu",
    "rope_on_cpu",
    "rope_forward_on_cpu",
)


def _namespaces() -> list[Any]:
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.common.embeddings import rotary_pos_embedding
    from megatron.core.transformer import dot_product_attention, multi_latent_attention
    from megatron.core.transformer.moe import router

    return [
        fused_softmax,
        router.Router,
        multi_latent_attention,
        dot_product_attention.DotProductAttention,
        rotary_pos_embedding.RotaryEmbedding,
    ]


@pytest.mark.no_cpu_shims
def test_architecture_shims_restore_every_namespace() -> None:
    """Leaving cpu_patched puts back the router, attention, RoPE and softmax namespaces object for object."""
    before = [dict(vars(ns)) for ns in _namespaces()]
    with cpu_patched():
        pass
    for ns, snap in zip(_namespaces(), before, strict=True):
        now = vars(ns)
        assert now.keys() == snap.keys() and all(now[k] is snap[k] for k in snap), ns


def test_each_architecture_shim_is_installed_or_says_why(cpu: Any) -> None:
    """Every shim is in the set; one not installed on this release is skipped with its reason."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer import multi_latent_attention

    names = {p.name for p in CPU_SET}
    assert set(ARCH_SHIMS) <= names
    skipped = dict(cpu.skipped)
    has_get_emb = hasattr(RotaryEmbedding, "get_emb")
    assert ("not needed here" in skipped.get("rope_on_cpu", "")) is not has_get_emb
    assert ("not needed here" in skipped.get("rope_forward_on_cpu", "")) is has_get_emb
    shim = next(p for p in CPU_SET if p.name == "mla_no_te_linear")
    if "mla_no_te_linear" in skipped:  # TE's class, or None where HAVE_TE guards it (0.13, 0.17+)
        found = vars(multi_latent_attention).get("TELinear")
        assert found is None or isinstance(found, type)
    else:  # 0.14-0.16 without TE: a MagicMock stand-in, which isinstance() refuses
        assert not isinstance(shim.backup.get(multi_latent_attention), type)
        assert vars(multi_latent_attention)["TELinear"] is shim.replacement
    for name in ("causal_mask_on_cpu", "moe_router_on_cpu", "mla_local_attention", "packed_local_attention"):
        assert name not in skipped, skipped.get(name)
    assert all(reason for _, reason in cpu.skipped)


def test_default_causal_mask_is_the_upper_triangle_on_the_cpu() -> None:
    """What the softmax asks for without a mask is upstream's causal mask (True above the diagonal), on the CPU."""
    from megatron.core.fusions import fused_softmax

    mask = fused_softmax.get_default_causal_mask(4)
    assert mask.device.type == "cpu" and mask.dtype == torch.bool
    assert torch.equal(mask, torch.ones(4, 4).triu(1).bool())


def test_shims_that_reimplement_upstream_read_its_body_as_verified(cpu: Any) -> None:
    """While installed, a shim's drift check reads the upstream body it displaced: verified on every release."""
    declared = {p.name for p in CPU_SET if p.verified is not None}
    assert {"moe_router_on_cpu", "causal_mask_on_cpu"} <= declared
    drift = dict(cpu.drift)
    assert {"moe_router_on_cpu", "causal_mask_on_cpu"} <= drift.keys()
    for name, found in drift.items():
        assert found.ok, f"{name}: {found.text}"
