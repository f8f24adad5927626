"""PPO-style steps on a tiny real Megatron-Core GPTModel with MTP, on CPU (``make demo``).

Inside ``with cpu_patched(), mtp_patched(model, detach_encoder=True)`` the model returns
logits, the PPO clipped policy loss is computed from them, and the MTP loss rides along
through MTPLossAutoScaler (training only the MTP layers). After the block the model
returns the upstream per-token language-model loss again.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch
import torch.distributed as dist

from patches.megatron import cpu_patched, mtp_patched

VOCAB, SEQ, BATCH, STEPS = 128, 16, 4, 3


def setup() -> None:
    """One gloo process and Megatron-Core's parallel state (TP=PP=1)."""
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as sock:  # a free port, so two demos can run side by side
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def build_model() -> Any:
    """A tiny GPTModel with two MTP depths (hidden 64, 2 heads, 2 layers, fp32)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=2, use_cpu_initialization=True,
        hidden_dropout=0.0, attention_dropout=0.0, mtp_num_layers=2, mtp_loss_scaling_factor=0.1,
    )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(0)
    tp_random.model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )  # fmt: skip


def rollout(step: int) -> dict[str, Any]:
    """A fake rollout batch: prompt tokens masked out, advantages and old log-probs."""
    gen = torch.Generator().manual_seed(step)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ)
    mask[:, :4] = 0  # the prompt
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ),
        "attention_mask": torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None],
        "labels": torch.roll(ids, -1, dims=1),
        "loss_mask": mask,
        "advantages": torch.randn(BATCH, SEQ, generator=gen),
        "old_logp": None,
    }


def ppo_loss(logits: Any, batch: dict[str, Any], clip: float = 0.2) -> Any:
    """Clipped policy-gradient loss over the response tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    old = logp.detach() if batch["old_logp"] is None else batch["old_logp"]
    ratio = torch.exp(logp - old)
    adv = batch["advantages"]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


def main() -> None:
    start = time.time()
    setup()
    with cpu_patched():
        model = build_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        probe = rollout(100)
        model_args = (probe["input_ids"], probe["position_ids"], probe["attention_mask"])
        upstream = model(*model_args, labels=probe["labels"])
        print(f"upstream loss before the block: shape {tuple(upstream.shape)}, mean {upstream.mean():.4f}")
        with mtp_patched(model, detach_encoder=True) as report:
            for step in range(STEPS):
                batch = rollout(step)
                optimizer.zero_grad()
                logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"],
                               labels=batch["labels"], loss_mask=batch["loss_mask"])  # fmt: skip
                loss = ppo_loss(logits, batch)
                loss.backward()  # the MTP loss's gradient reaches the MTP layers only
                optimizer.step()
                depths = ", ".join(f"depth {i + 1} {v:.4f}" for i, v in enumerate(report.mtp_losses))
                print(f"step {step}: logits {tuple(logits.shape)}  policy loss {loss.item():+.4f}  mtp loss {depths}")
        print(report)
        after = model(*model_args, labels=probe["labels"])
        print(f"after the block the model returns the upstream loss again: shape {tuple(after.shape)}")
    dist.destroy_process_group()
    print(f"done in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
