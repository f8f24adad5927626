"""Megatron-Bridge 0.6.2 under the bridge fix-ups (patches.megatron.bridge): import, config mapping, export."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

import patchreg
from patches.megatron.bridge import BRIDGE_IMPORT_SET, BRIDGE_SET, bridge_patched


def _provider(trainer: Any, **overrides: Any) -> Any:
    from megatron.bridge import AutoBridge
    from transformers import DeepseekV3Config

    config = {k: v for k, v in trainer.hf_config().items() if k != "torch_dtype"}
    config.update(overrides)
    return AutoBridge.from_hf_config(DeepseekV3Config(**config)).to_megatron_provider(load_weights=False)


def test_import_leaves_no_transformer_engine(built: Any) -> None:
    """The bridge imports without TE, and no stand-in TE is left for any other module's HAVE_TE check."""
    from megatron.bridge.models.deepseek import deepseek_v3_bridge
    from megatron.bridge.peft import lora_layers

    assert "transformer_engine" not in sys.modules and "transformer_engine.pytorch" not in sys.modules
    assert importlib.util.find_spec("transformer_engine") is None
    assert deepseek_v3_bridge.HAVE_TE is False
    with pytest.raises(patchreg.PatchError, match="Transformer Engine"):
        lora_layers.te.Linear(4, 4)


def test_provider_maps_the_config_right(trainer: Any, built: Any) -> None:
    """With the fix-ups: plain RoPE, a layer frequency of the layer count, no CUDA fusion; without: yarn and L+1."""
    with bridge_patched():
        fixed = _provider(trainer)
    assert fixed.rope_type == "rope"
    assert fixed.moe_layer_freq == [0] * fixed.num_layers
    assert not fixed.gradient_accumulation_fusion and not fixed.masked_softmax_fusion
    with patchreg.patched(BRIDGE_IMPORT_SET):
        upstream = _provider(trainer)  # the bridge as released: what the fix-ups correct
    assert upstream.rope_type == "yarn"
    assert len(upstream.moe_layer_freq) == upstream.num_layers + 1


def test_no_q_lora_is_refused_naming_the_remedy(trainer: Any, built: Any) -> None:
    """An HF config without a q LoRA is refused up front with a PatchError that names q_lora_rank."""
    with bridge_patched(), pytest.raises(patchreg.PatchError, match="q_lora_rank"):
        _provider(trainer, q_lora_rank=None)


def test_sets_restore_the_bridge_exactly(built: Any) -> None:
    """After the block the bridge's functions are its own again (the fix-ups live only inside it)."""
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.deepseek.deepseek_v3_bridge import DeepSeekV3Bridge

    before = (gpt_provider.mtp_block_spec, vars(DeepSeekV3Bridge)["provider_bridge"])
    with bridge_patched() as report:
        assert report.installed == len(BRIDGE_SET.patches)
        assert gpt_provider.mtp_block_spec is not before[0]
    assert (gpt_provider.mtp_block_spec, vars(DeepSeekV3Bridge)["provider_bridge"]) == before


def test_every_megatron_tensor_maps_to_hf_and_back(trainer: Any, built: Any, tmp_path: Path) -> None:
    """Export names: each Megatron tensor maps to exported HF tensors and back; reloaded, each is equal."""
    import torch
    from safetensors.torch import save_file

    bridge, model = built
    registry = bridge._model_bridge.mapping_registry()
    exported = dict(trainer.export_tensors(bridge, model))
    params = dict(model.named_parameters())
    covered: set[str] = set()
    for name, param in params.items():
        mapping = registry.megatron_to_hf_lookup(name)
        assert mapping is not None, f"{name} has no HF mapping"
        hf_names = list(mapping.hf_param.values()) if isinstance(mapping.hf_param, dict) else [mapping.hf_param]
        for hf_name in hf_names:
            assert hf_name in exported, f"{name} -> {hf_name} was not exported"
            back = registry.hf_to_megatron_lookup(hf_name)
            assert back is not None, f"{hf_name} maps back to nothing"
            # The registry lists the TE layout first for fused norms (linear_q_up_proj.layer_norm_weight): an alias
            # this local-spec model does not have; the reload below checks the values come back to `name`.
            assert back.megatron_param == name or back.megatron_param not in params, f"{hf_name} maps back elsewhere"
        sizes = sum(exported[h].numel() for h in hf_names)
        assert sizes == param.numel(), f"{name} {tuple(param.shape)} vs {[tuple(exported[h].shape) for h in hf_names]}"
        covered.update(hf_names)
    assert covered == set(exported), f"exported but from no Megatron tensor: {sorted(set(exported) - covered)}"
    assert any(".eh_proj." in h for h in covered) and any(h.startswith("model.layers.1.") for h in covered)

    save_file({k: v.contiguous() for k, v in exported.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(__import__("json").dumps(trainer.hf_config()))
    _, fresh = trainer.build(seed=7)
    eh_proj = "mtp.layers.0.eh_proj.weight"
    assert not torch.equal(dict(fresh.named_parameters())[eh_proj], params[eh_proj])
    with trainer.on_cpu():
        bridge.load_hf_weights([fresh], str(tmp_path))
    for name, param in fresh.named_parameters():
        assert torch.equal(param, params[name]), f"{name} changed through export and reload"
