"""Megatron-Bridge fix-ups: a DeepSeek-V3-layout model built, trained and exported on CPU (bridge 0.6.2).

NVIDIA's Megatron-Bridge maps HF configs and weights to Megatron-Core models and back
(``AutoBridge.export_hf_weights`` is what verl's Megatron engine streams to its rollout). Release
0.6.2 breaks on a machine without Transformer Engine, and maps two DeepSeek-V3 configs wrongly on
any device. Two sets, entered in order by :func:`bridge_patched` (the import set first, since the
fix-up set's targets live in modules that import the bridge):

``megatron-bridge-import`` (CPU-only, i.e. no Transformer Engine):

- ``lora_layers_without_te``: ``megatron/bridge/peft/lora_layers.py`` imports ``transformer_engine.pytorch``
  unconditionally, and ``import megatron.bridge`` reaches it. While *that one module* executes, a stand-in
  ``transformer_engine`` sits in ``sys.modules`` (taken out again right after, so every other
  ``HAVE_TE`` check still sees no TE); its LoRA classes raise if used. Not needed where TE imports.

``megatron-bridge`` (the fix-ups):

- ``mtp_spec_without_te`` (CPU-only): ``gpt_provider.mtp_block_spec`` hard-codes
  ``use_transformer_engine=True``; built from the decoder's local spec instead. Not needed where TE imports.
- ``fusions_off_without_cuda`` (CPU-only): the DeepSeek-V3 provider turns on CUDA/TE fusions
  (gradient accumulation, bias-activation, softmax, permute, grouped GEMM, TE cross-entropy, persisted norm);
  off where CUDA is not available.
- ``rope_without_scaling`` (wrong mapping, any device): ``MLATransformerConfig`` defaults
  ``rope_type="yarn"`` and the bridge changes it only when the HF config says yarn; an HF config with no
  ``rope_scaling`` (or ``"default"``) gets plain RoPE (``"rope"``), what HF and vLLM compute.
- ``dense_layer_freq`` (wrong mapping, any device): ``moe_layer_freq`` from ``first_k_dense_replace``
  is a list of ``first_k_dense_replace`` entries when that exceeds the layer count (every layer dense, the
  MTP layer too), which Megatron-Core refuses; cut to the layer count.
- ``qk_layernorm_needs_q_lora`` (wrong mapping, any device): the bridge forces ``qk_layernorm=True``; with
  ``q_lora_rank=None`` Megatron-Core refuses it, and turning it off drops ``kv_a_layernorm``. Refused up
  front with a :class:`~patchreg.PatchError` naming the remedy (a q LoRA rank) instead of a ``ValueError``
  deep in the model build.

Each is gated on the bridge releases it was verified on (:data:`VERIFIED_ON`). Usage::

    with cpu_patched(), bridge_patched():
        from megatron.bridge import AutoBridge
        provider = AutoBridge.from_hf_config(config).to_megatron_provider(load_weights=False)
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import patchreg
from patches.megatron._compat import absent
from patchreg import Patch, PatchError, PatchSet, check, not_needed_when, requires

__all__ = ["BRIDGE_IMPORT_SET", "BRIDGE_SET", "VERIFIED_ON", "bridge_patched"]

#: The Megatron-Bridge releases these shims were verified on.
VERIFIED_ON = "megatron-bridge>=0.6.2,<=0.6.2"
_LORA_LAYERS = "megatron.bridge.peft.lora_layers"
_GPT_PROVIDER = "megatron.bridge.models.gpt_provider"
_DSV3 = "megatron.bridge.models.deepseek.deepseek_v3_bridge:DeepSeekV3Bridge"
_FUSIONS_OFF = {
    "gradient_accumulation_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "masked_softmax_fusion": False,
    "persist_layer_norm": False,
    "apply_rope_fusion": False,
    "cross_entropy_loss_fusion": False,
    "moe_permute_fusion": False,
    "moe_grouped_gemm": False,
}


def _te_importable() -> tuple[bool, str]:
    """Whether Transformer Engine is installed (then the CPU-only shims are not needed)."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return True, "transformer_engine is installed"
    return False, "transformer_engine is not installed"


def _cuda_available() -> tuple[bool, str]:
    """Whether torch sees a CUDA device (then the fusions stay as the bridge sets them)."""
    missing = absent("torch")
    if missing:
        return False, missing
    import torch

    if torch.cuda.is_available():
        return True, "torch.cuda.is_available() is True"
    return False, "no CUDA device"


class _AbsentTE(type):
    """Transformer Engine's names, for a module that only names them: any attribute is another absent class."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AbsentTE(f"{cls.__name__}.{name}", (), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        msg = f"{cls.__name__} is Transformer Engine's, which is not installed: LoRA of Megatron-Bridge needs it."
        raise PatchError(msg)


class _AbsentModule(types.ModuleType):
    """A stand-in ``transformer_engine`` / ``transformer_engine.pytorch`` module."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AbsentTE(f"{self.__name__}.{name}", (), {})


def _exec_lora_layers_without_te(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Execute ``megatron.bridge.peft.lora_layers`` with a stand-in ``transformer_engine`` (only that module)."""
    module = args[0] if args else kwargs["module"]
    if getattr(module, "__name__", None) != _LORA_LAYERS:
        return wrapped(*args, **kwargs)
    top = _AbsentModule("transformer_engine")
    sub = _AbsentModule("transformer_engine.pytorch")
    top.pytorch = sub  # type: ignore[attr-defined]
    names = ("transformer_engine", "transformer_engine.pytorch")
    before = {name: sys.modules.get(name) for name in names}
    sys.modules.update(zip(names, (top, sub), strict=True))
    try:
        return wrapped(*args, **kwargs)
    finally:
        for name, old in before.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def _mtp_block_spec(config: Any, vp_stage: int | None = None) -> Any:
    """The MTP block spec from the decoder's own (local) layer spec (upstream asks for Transformer Engine)."""
    import inspect

    if not getattr(config, "mtp_num_layers", None):
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    spec = config.transformer_layer_spec
    if callable(spec):
        takes_vp = "vp_stage" in inspect.signature(spec).parameters
        spec = spec(config, vp_stage=vp_stage) if takes_vp else spec(config)
    if hasattr(spec, "layer_specs"):
        if not spec.layer_specs:
            msg = (
                "mtp_spec_without_te: the last pipeline stage has no decoder layer to build the MTP layer from; "
                "run the MTP layer on a stage with decoder layers, or install Transformer Engine."
            )
            raise PatchError(msg)
        spec = spec.layer_specs[-1]
    return get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False, vp_stage=vp_stage)


def _hf_config(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    pretrained = args[0] if args else kwargs["hf_pretrained"]
    return pretrained.config


def _fusions_off(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Turn off the CUDA / Transformer Engine fusions the DeepSeek-V3 provider turns on (no CUDA here)."""
    provider = wrapped(*args, **kwargs)
    for field, value in _FUSIONS_OFF.items():
        if hasattr(provider, field):
            setattr(provider, field, value)
    return provider


def _rope_type(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Plain RoPE where the HF config has no ``rope_scaling`` (the bridge leaves MLA's default, yarn)."""
    provider = wrapped(*args, **kwargs)
    scaling = getattr(_hf_config(args, kwargs), "rope_scaling", None) or {}
    kind = scaling.get("type") or scaling.get("rope_type") if isinstance(scaling, dict) else None
    if kind in (None, "default") and getattr(provider, "rope_type", None) == "yarn":
        provider.rope_type = "rope"
    return provider


def _dense_layer_freq(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``moe_layer_freq`` cut to the layer count (``first_k_dense_replace`` may exceed it: every layer dense)."""
    provider = wrapped(*args, **kwargs)
    freq, layers = getattr(provider, "moe_layer_freq", None), getattr(provider, "num_layers", None)
    if isinstance(freq, list) and isinstance(layers, int) and len(freq) > layers:
        provider.moe_layer_freq = freq[:layers]
    return provider


def _q_lora_required(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Refuse ``q_lora_rank=None`` up front: the bridge's forced ``qk_layernorm`` needs a q LoRA."""
    provider = wrapped(*args, **kwargs)
    if getattr(provider, "q_lora_rank", 0) is None and getattr(provider, "qk_layernorm", False):
        msg = (
            "Megatron-Bridge's DeepSeek-V3 mapping forces qk_layernorm=True, which Megatron-Core refuses with "
            "q_lora_rank=None (and turning it off drops kv_a_layernorm): give the HF config a q_lora_rank "
            "(e.g. 32) to build and export this model."
        )
        raise PatchError(msg)
    return provider


_BRIDGE = requires(VERIFIED_ON)
_NO_TE = not_needed_when(check(_te_importable, "Transformer Engine is installed"))
_NO_CUDA = not_needed_when(check(_cuda_available, "CUDA is available"))

BRIDGE_IMPORT_SET = PatchSet(
    "megatron-bridge-import",
    (
        Patch("lora_layers_without_te", "importlib.machinery:SourceFileLoader.exec_module",
              _exec_lora_layers_without_te, kind="wrap", when=_NO_TE & _BRIDGE,
              doc="[CPU-only] import megatron.bridge without Transformer Engine (peft/lora_layers.py imports it)"),
    ),
    doc="CPU-only: lets `import megatron.bridge` (0.6.2) run without Transformer Engine; enter before importing it",
)  # fmt: skip

BRIDGE_SET = PatchSet(
    "megatron-bridge",
    (
        Patch("mtp_spec_without_te", f"{_GPT_PROVIDER}:mtp_block_spec", _mtp_block_spec, when=_NO_TE & _BRIDGE,
              doc="[CPU-only] the MTP block spec from the local decoder spec (upstream hard-codes TE)"),
        Patch("fusions_off_without_cuda", f"{_DSV3}.provider_bridge", _fusions_off, kind="wrap",
              when=_NO_CUDA & _BRIDGE,
              doc="[CPU-only] the DeepSeek-V3 provider's CUDA/TE fusions off where there is no CUDA"),
        Patch("rope_without_scaling", f"{_DSV3}.provider_bridge", _rope_type, kind="wrap", when=_BRIDGE,
              doc="[any device] plain RoPE for an HF config without rope_scaling (the bridge leaves yarn)"),
        Patch("dense_layer_freq", f"{_DSV3}.provider_bridge", _dense_layer_freq, kind="wrap", when=_BRIDGE,
              doc="[any device] moe_layer_freq cut to the layer count when first_k_dense_replace exceeds it"),
        Patch("qk_layernorm_needs_q_lora", f"{_DSV3}.provider_bridge", _q_lora_required, kind="wrap",
              when=_BRIDGE,
              doc="[any device] q_lora_rank=None refused up front (forced qk_layernorm), naming the remedy"),
    ),
    doc="Megatron-Bridge 0.6.2 fix-ups: DeepSeek-V3 layout built on CPU, two config mappings corrected",
)  # fmt: skip


@contextlib.contextmanager
def bridge_patched(registry: patchreg.Registry | None = None) -> Iterator[patchreg.Report]:
    """``with bridge_patched():`` both sets for a block: the import set, ``import megatron.bridge``, the fix-ups.

    Yields the fix-up set's report. Enter it inside ``cpu_patched()`` on a machine without a GPU (the
    provider builds the model through Megatron-Core's CUDA reach-points).
    """
    reg = registry if registry is not None else patchreg.registry
    with reg.patched(BRIDGE_IMPORT_SET):
        try:
            importlib.import_module("megatron.bridge")
        except ModuleNotFoundError as exc:
            if exc.name is not None and "megatron.bridge".startswith(exc.name):
                msg = "megatron.bridge is not installed: run `make bridge-overlay` (Megatron-Bridge 0.6.2, --no-deps)."
                raise PatchError(msg) from exc
            raise
        with reg.patched(BRIDGE_SET) as report:
            yield report
