"""The tiny real Megatron-Core GPTModel the examples run on: one process on gloo, CPU, fp32.

Shared by ``compose.py`` and ``verl_mtp.py`` (a script's own directory is on ``sys.path``).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist

VOCAB, SEQ, BATCH = 64, 8, 2


def init_single_process() -> None:
    """torch.distributed on gloo with one rank, and Megatron-Core's parallel state for TP=PP=1."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def tiny_gpt() -> Any:
    """A one-layer GPTModel with one MTP layer, fp32, initialised on CPU."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=1,
        mtp_loss_scaling_factor=0.3,
    )
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(0)
    tp_random.model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=2 * SEQ,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )


def batch() -> dict[str, Any]:
    """Token ids, positions, a causal mask, labels and a loss mask."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ).contiguous(),
        "attention_mask": torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None],
        "labels": torch.roll(ids, -1, dims=1),
        "loss_mask": torch.ones(BATCH, SEQ),
    }
