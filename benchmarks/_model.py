"""A tiny real Megatron-Core GPTModel with MTP layers, on CPU (mirrors the tests' builder; not imported from tests/)."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

VOCAB = 64
SEQ = 16
BATCH = 2


def init_parallel() -> None:
    """A one-process gloo group, Megatron's model-parallel state (tp = pp = 1), one torch thread; idempotent."""
    from megatron.core import parallel_state

    torch.set_num_threads(1)  # every side alike; a shared machine disturbs one thread less
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def tiny_config(num_layers: int, mtp_layers: int) -> Any:
    """The benchmarks' tiny TransformerConfig (hidden 16, two heads, no dropout, CPU-initialised), with MTP."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=16,
        ffn_hidden_size=32,
        num_attention_heads=2,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=mtp_layers,
        mtp_loss_scaling_factor=0.1,
    )


def build(mtp_layers: int = 1, *, seed: int = 0) -> Any:
    """A GPTModel (1 decoder layer, hidden 16, vocab 64) with ``mtp_layers`` MTP layers, CPU-initialised."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    init_parallel()
    torch.manual_seed(seed)
    config = tiny_config(1, mtp_layers)
    spec = get_gpt_layer_local_spec()
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        mtp_block_spec=mtp_spec,
    )


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids, positions, a causal mask (True = masked), labels and a loss mask for one step.

    As an RL actor builds them (verl's Megatron actor: ``label_mask[:, -1] = False``): the labels are the ids
    shifted left once, and the last position, whose label the shift wraps around from the first token, is masked."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ)
    mask[:, -1] = 0
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ),
        "attention_mask": torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None],
        "labels": torch.roll(ids, -1, dims=1),
        "loss_mask": mask,
    }
