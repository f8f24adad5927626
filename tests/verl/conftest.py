"""Fixtures for verl's own code on tiny real GPTModels (CPU, gloo): ``make test-verl`` puts verl on the path.

verl 0.9.1 is installed without its dependencies into ``.cache/verl-overlay`` (see the Makefile) with what
importing its engine, forward and rollout modules needs; without it every test here is skipped.

Two pieces stand in for what a GPU run gets from Transformer Engine, and only for that: a local
core-attention (:class:`PackedDotProductAttention`) that takes verl's packed ``thd`` batches and its
``[b, s]`` padding mask, and :class:`TinyEngine`, a ``MegatronEngineWithLMHead`` whose model-building steps
(mbridge, a Hugging Face checkpoint) return the tiny model instead; ``initialize()``, the forward and the
logits processor are verl's.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from tests.megatron.conftest import VOCAB, distributed, make_config

__all__ = ["distributed"]

HAVE_VERL = all(importlib.util.find_spec(m) is not None for m in ("verl", "ray", "tensordict", "omegaconf"))
needs_verl = pytest.mark.skipif(not HAVE_VERL, reason="verl 0.9.1 is not importable: `make test-verl` installs it")
LENGTHS = (5, 7)


def pytest_configure(config: Any) -> None:
    """The markers tests/megatron declares (its conftest is not loaded when only tests/verl runs)."""
    config.addinivalue_line("markers", "no_distributed: the test needs no process group")
    config.addinivalue_line("markers", "no_cpu_shims: the test manages cpu_patched itself")


def _cpu_platform() -> Any:
    """verl's platform plugin for the CPU: verl registers CUDA, NPU and ROCm only, and falls back to CUDA."""
    import torch
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class PlatformCPU(PlatformCUDA):
        """verl's CUDA platform with the CPU as its device (memory logging reads zeros, no CUDA call)."""

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> Any:
            return torch.cpu

        def is_available(self) -> bool:
            return True

    return PlatformCPU()


@pytest.fixture(scope="session")
def verl_on_cpu() -> None:
    """verl's platform set to the CPU through its own ``set_platform`` (once per run)."""
    from verl.plugin.platform.platform_manager import set_platform

    set_platform(_cpu_platform())


@pytest.fixture
def cpu(distributed: None, verl_on_cpu: None) -> Iterator[Any]:
    """gloo + parallel_state, verl on the CPU, the CPU shims, a clean MTP loss tracker."""
    import torch
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, MTPLossLoggingHelper

    from patches.megatron import cpu_patched

    with cpu_patched() as report:
        MTPLossAutoScaler.set_loss_scale(torch.tensor(1.0))
        MTPLossLoggingHelper.tracker.clear()
        yield report


def _attention_class() -> Any:
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class PackedDotProductAttention(DotProductAttention):
        """Local attention that reads verl's packed (``thd``) batches and ``[b, s]`` masks as masks."""

        def forward(self, query: Any, key: Any, value: Any, attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
            packed = kwargs.pop("packed_seq_params", None)
            if packed is not None:
                query, key, value = (x.unsqueeze(1) if x.dim() == 3 else x for x in (query, key, value))
                attention_mask = _packed_mask(packed, query.shape[0])
            elif attention_mask is None or attention_mask.dim() == 2:
                attention_mask = _causal_mask(query.shape[0], attention_mask)
            q, k, v = (x.contiguous() for x in (query, key, value))
            return super().forward(q, k, v, attention_mask, *args, packed_seq_params=None, **kwargs)

    def _packed_mask(packed: Any, total: int) -> Any:
        cu = packed.cu_seqlens_q_padded if packed.cu_seqlens_q_padded is not None else packed.cu_seqlens_q
        segment = torch.zeros(total, dtype=torch.long)
        for i in range(len(cu) - 1):
            segment[int(cu[i]) : int(cu[i + 1])] = i
        index = torch.arange(total)
        allowed = (segment[:, None] == segment[None, :]) & (index[None, :] <= index[:, None])
        return ~allowed[None, None]  # True = masked, as Megatron's attention_mask_func reads it

    def _causal_mask(s: int, valid: Any) -> Any:
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]
        return mask if valid is None else mask | ~valid.bool()[:, None, None, :]

    return PackedDotProductAttention


def build_model(tied: bool = False, seed: int = 1234) -> Any:
    """A tiny real GPTModel with one MTP depth whose core attention takes packed batches."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random

    config = make_config()
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = _attention_class()
    torch.manual_seed(seed)
    tp_random.model_parallel_cuda_manual_seed(seed)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=64,
        share_embeddings_and_output_weights=tied,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )


def tiny_engine_class() -> Any:
    """``MegatronEngineWithLMHead`` building the tiny model instead of loading a checkpoint through mbridge."""
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead

    class TinyEngine(MegatronEngineWithLMHead):
        """verl's engine with its model-building steps returning given chunks; ``initialize()`` is verl's."""

        def __init__(self, chunks: list[Any], detach_encoder: bool) -> None:  # verl's needs mbridge + a checkpoint
            from verl.workers.config import McoreEngineConfig
            from verl.workers.config.model import MtpConfig

            mtp = MtpConfig(enable=True, enable_train=True, detach_encoder=detach_encoder)
            self.model_config = SimpleNamespace(mtp=mtp)
            self.engine_config = McoreEngineConfig(forward_only=True)
            self._qat_enabled = False
            self._is_offload_param = False
            self._chunks = chunks

        def _build_tf_config(self) -> None:
            self.tf_config = self._chunks[0].config

        def _build_megatron_module(self) -> list[Any]:
            chunks, self._chunks = self._chunks, []
            return chunks

    return TinyEngine


def make_engine(detach_encoder: bool = True, tied: bool = False, seed: int = 1234) -> Any:
    """An initialized TinyEngine on one fresh tiny model (``initialize()`` calls ``patch_engine_mtp``)."""
    engine = tiny_engine_class()([build_model(tied, seed)], detach_encoder)
    engine.initialize()
    return engine


@pytest.fixture
def verl_mtp() -> Iterator[Any]:
    """``VERL_MTP`` applied lazily to the default registry for one test (the rollout module is never imported)."""
    import patchreg
    from patches.verl import VERL_MTP

    report = patchreg.apply(VERL_MTP, lazy=True)
    yield report
    patchreg.revert(report)


def micro_batch(seed: int = 3) -> dict[str, Any]:
    """Two sequences (5 and 7 tokens) as verl's engine gets them: jagged nested tensors, a prompt masked."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.nested.nested_tensor(
        [torch.randint(0, VOCAB, (n,), generator=gen) for n in LENGTHS], layout=torch.jagged
    )
    masks = [torch.ones(n) for n in LENGTHS]
    masks[0][:2] = 0
    return {
        "input_ids": ids,
        "loss_mask": torch.nested.nested_tensor(masks, layout=torch.jagged).bool(),
        "temperature": torch.nested.nested_tensor([torch.ones(n) for n in LENGTHS], layout=torch.jagged),
    }


def verl_forward(engine: Any, data_format: str, batch: dict[str, Any] | None = None) -> dict[str, Any]:
    """verl's per-micro-batch path: ``gptmodel_forward_model_engine`` + ``_lm_head_logits_processor``, MTP on.

    The result also has ``logits``: the model's logits as the processor received them (unpacked by verl too).
    """
    from verl.models.mcore.model_forward import gptmodel_forward_model_engine

    batch = batch or micro_batch()
    processor = partial(
        engine._lm_head_logits_processor,
        calculate_sum_pi_squared=False,
        calculate_entropy=True,
        distillation_use_topk=False,
        distillation_only=False,
        logits_processor_func=None,
        batch=None,
        data_format=data_format,
    )
    args = {
        "label": batch["input_ids"].clone(),
        "temperature": batch["temperature"],
        "loss_mask": batch["loss_mask"],
        "response_attention_mask": None,
    }

    def logits_processor(logits: Any, **kwargs: Any) -> dict[str, Any]:
        seen = logits.detach().clone()  # what the model returned, before verl divides it by the temperature
        return {**processor(logits, **kwargs), "logits": seen}

    return gptmodel_forward_model_engine(
        engine.module[0],
        batch["input_ids"],
        {},
        logits_processor=logits_processor,
        logits_processor_args=args,
        data_format=data_format,
        mtp_enable_train=True,
    )


def flat(tensor: Any) -> Any:
    """A nested tensor's values (a plain tensor as it is)."""
    return tensor.values() if tensor.is_nested else tensor
