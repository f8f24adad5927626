"""One process of the PP=2 test: Megatron's standalone-MTP layout, the loss stage upstream and patched."""

from __future__ import annotations

import json
import os
from typing import Any


def run(rank: int, port: int, out_path: str) -> None:
    """Entry point for torch.multiprocessing.spawn (rank first): stage 0 embeds, decodes and runs MTP."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    import patchreg
    from patches.megatron import cpu_patched

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    # this test's own CPU shim: the PP embedding sync moves a weight to the GPU with Tensor.cuda()
    no_cuda = patchreg.Patch("tensor_cuda_is_cpu", "torch:Tensor.cuda", _stay)
    try:
        with cpu_patched(), patchreg.Registry("pp-test").patched(no_cuda):
            parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
            result = _stages(rank)
            parallel_state.destroy_model_parallel()
        if rank == 1:
            with open(out_path, "w", encoding="utf-8") as out:
                json.dump(result, out)
    finally:
        dist.destroy_process_group()


def _stay(self: Any, *args: Any, **kwargs: Any) -> Any:
    return self


def _stages(rank: int) -> dict[str, Any]:
    """Upstream's and the patched loss stage's output shape and MTP losses (rank 1; rank 0 feeds it)."""
    import torch
    import torch.distributed as dist
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    from patches.megatron import mtp_patched
    from patches.megatron._loss import tracked_losses
    from tests.megatron.conftest import HIDDEN, SEQ, VOCAB, make_batch

    config = standalone_config()
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(0)
    tp_random.model_parallel_cuda_manual_seed(0)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=rank == 0,
        post_process=rank == 1,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
        share_embeddings_and_output_weights=False,
    )
    batch = make_batch(masked="some")
    tracker = MTPLossLoggingHelper.tracker

    def step() -> Any:
        if rank == 0:  # the MTP stage sends the decoder's and MTP's hidden states, concatenated
            dist.send(model(*batch.args(), **batch.kwargs()).detach().contiguous(), 1)
            return None
        hidden = torch.empty((1 + config.mtp_num_layers) * SEQ, batch.input_ids.shape[0], HIDDEN)
        dist.recv(hidden, 0)
        model.set_input_tensor(hidden)
        return model(None, batch.position_ids, batch.attention_mask, **batch.kwargs())

    tracker.clear()
    upstream = step()
    upstream_losses = tracked_losses(tracker).tolist() if rank == 1 else []
    tracker.clear()
    with mtp_patched(model, detach_encoder=True) as report:
        patched = step()
    if rank == 0:
        return {}
    return {
        "standalone": bool(getattr(config, "mtp_standalone", False)),
        "upstream_shape": list(upstream.shape),
        "upstream_losses": upstream_losses,
        "patched_shape": list(patched.shape),
        "patched_losses": list(report.mtp_losses),
    }


def standalone_config() -> Any:
    """A tiny config for PP=2 with the layout [[embedding, decoder, mtp], [loss]] (MTP on its own stage)."""
    import torch

    from tests.megatron.conftest import make_config

    layout = [["embedding", "decoder", "mtp"], ["loss"]]
    return make_config(
        pipeline_model_parallel_size=2, pipeline_dtype=torch.float32, pipeline_model_parallel_layout=layout
    )
