"""vLLM's own worker, model runner and MTP speculator objects, built without an engine config.

vLLM 0.34's CPU platform refuses to build an engine config without triton-cpu, so no worker can be
constructed the usual way there. :func:`bare_worker` allocates the real classes without running their
``__init__`` (``object.__new__``) and sets the attributes their weight-update methods read, as
``Worker.__init__``, ``Worker.load_model`` and the runner's ``load_model`` set them:
``vllm.v1.worker.gpu_worker.Worker`` holding a ``vllm.v1.worker.gpu.model_runner.GPUModelRunner`` (0.34's
only runner; 0.32 and 0.33 have it beside the old one) whose ``speculator`` is vLLM's ``MTPSpeculator``
holding the draft (``get_draft_model()`` returns ``speculator.model`` there), and a weight-transfer engine
(:mod:`tests.vllm.cpu_transfer`). vLLM's methods then run as they are: ``get_draft_model``,
``start_weight_update`` / ``start_draft_weight_update`` / ``update_weights`` / ``finish_weight_update``,
``reload_weights`` (kernel format) and, on 0.34, ``_discardable_parameters`` (level 2 sleep's rule).

The weights are held by plain ``torch.nn.Module`` trees named as vLLM's DeepSeek-V3 target and its
``DeepSeekMTP`` drafter name them (:func:`tiny_pair`), the drafter sharing the embedding and the LM head.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch

DRAFT_OWN = ("model.layers.1.eh_proj.weight", "model.layers.1.enorm.weight")
"""The tiny drafter's own tensors (the MTP layer, past the target's one decoder layer)."""
SHARED = ("model.embed_tokens.weight", "model.layers.1.shared_head.head.weight")
"""The tiny drafter's tensors shared with the target (vLLM shares the embedding and the LM head)."""


def tiny_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A target (embedding, one layer, LM head) and an MTP drafter sharing its embedding and head, named as
    vLLM's DeepSeek-V3 and ``DeepSeekMTP`` name theirs; every tensor zero."""
    target, draft = torch.nn.Module(), torch.nn.Module()
    target.model = torch.nn.Module()
    target.model.embed_tokens = torch.nn.Embedding(4, 2)
    target.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2, bias=False)])
    target.lm_head = torch.nn.Linear(2, 4, bias=False)
    layer = torch.nn.Module()
    layer.eh_proj = torch.nn.Linear(4, 2, bias=False)
    layer.enorm = torch.nn.LayerNorm(2, elementwise_affine=True, bias=False)
    layer.shared_head = torch.nn.Module()
    layer.shared_head.head = target.lm_head
    draft.model = torch.nn.Module()
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleDict({"1": layer})
    for model in (target, draft):
        model.requires_grad_(False)
        for param in model.parameters():
            param.zero_()
    return target, draft


def bare_worker(target: torch.nn.Module, draft: torch.nn.Module, preserve: tuple[str, ...] = ()) -> Any:
    """vLLM's ``Worker`` over ``target`` and ``draft`` (see the module doc), with the CPU weight-transfer engine;
    ``preserve``: the model config's ``sleep_preserve_parameter_names``."""
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator
    from vllm.v1.worker.gpu_worker import Worker

    from tests.vllm.cpu_transfer import BACKEND, register

    model_config = SimpleNamespace(
        hf_config=SimpleNamespace(num_hidden_layers=1), sleep_preserve_parameter_names=list(preserve), quantization=None
    )
    spec = SimpleNamespace(method="mtp", draft_model_config=SimpleNamespace(hf_config=model_config.hf_config))
    config = SimpleNamespace(
        model_config=model_config,
        speculative_config=spec,
        parallel_config=SimpleNamespace(data_parallel_index=0, world_size=1),
        load_config=None,
        lora_config=None,
        weight_transfer_config=WeightTransferConfig(backend=BACKEND),
    )
    speculator = object.__new__(MTPSpeculator)
    speculator.model = draft
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(model=target, speculator=speculator, vllm_config=config, lora_config=None)
    runner.__dict__.update(model_config=model_config, encoder_cache=None, pooling_runner=None)
    worker = object.__new__(Worker)
    worker.__dict__.update(model_runner=runner, vllm_config=config, model_config=model_config, rank=0)
    worker.__dict__.update(speculative_config=spec, _weight_update_active=False, _weight_update_is_draft=False)
    worker.__dict__.update(_incomplete_weight_updates=set(), _kv_cache_reclaimable=False)  # vLLM 0.34
    worker.__dict__.update(_weight_update_kv_cache_loan=contextlib.ExitStack())  # vLLM 0.34
    register()
    worker.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
        config.weight_transfer_config, config, torch.device("cpu"), target
    )
    return worker
