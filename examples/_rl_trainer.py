"""The trainer side of the RL loop (``examples/rl_loop.py``): Megatron-Core 0.19 + Megatron-Bridge 0.6.2 on CPU.

Runs in ``.venv`` (Python 3.12) with Megatron-Bridge from ``make bridge-overlay`` on ``PYTHONPATH``.

- :func:`build`: a tiny DeepSeek-V3-layout ``GPTModel`` with one MTP layer, built by Megatron-Bridge's
  provider (``AutoBridge.from_hf_config(...).to_megatron_provider()``) from the HF config this module
  writes (:func:`hf_config`: the byte-level model of ``patches.vllm.checkpoints`` with a q LoRA), under
  ``cpu_patched()`` and ``bridge_patched()``.
- :func:`train`: a policy objective (PPO's clipped loss, one epoch per batch) on rollouts of a
  deterministic token rule (:func:`rule_next`: a single 64-cycle over the bytes 0x80-0xBF), under
  ``mtp_patched(model, detach_encoder=True)``: the main head learns the rule from the policy loss, the MTP
  head learns it from the MTP loss on the same rollouts, which trains only the MTP layer. Adam, a handful of
  steps.
- :func:`greedy`: the trainer's own argmax continuation (what the engine's greedy output must equal).
- :func:`export`: ``AutoBridge.export_hf_weights`` (what verl's Megatron engine streams to its rollout
  engine) written as a checkpoint directory vLLM reloads in place.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron(\.|$)")
warnings.filterwarnings(
    "ignore", message=r".*(Transformer Engine|Apex is not installed|absl\.logging|scope is deprecated|torch_dtype)"
)
for _name in ("megatron", "megatron.bridge", "megatron.core", "torch.utils.cpp_extension", "transformers"):
    logging.getLogger(_name).setLevel(logging.ERROR)
# The bridge's import_utils sets its own logger to INFO with a handler when imported, and logs every optional
# TE symbol it cannot import, with a traceback: a filter on the logger outlives that.
logging.getLogger("megatron.bridge.utils.import_utils").addFilter(lambda record: record.levelno >= logging.ERROR)

#: The rule's tokens: bytes 0x80-0xBF. Inside the range the next token is ``0x80 + (5 * i + 3) % 64``
#: (``i``: the current token's offset), a single cycle through all 64 (an affine map mod 2**6 with an odd
#: step and a multiplier of 1 mod 4), so any start continues forever inside the range.
RULE_BASE, RULE_SIZE = 0x80, 64
PROMPT_LENGTHS_TRAIN = (2, 3, 4)
PROMPT_LENGTH_HELD_OUT = 5  # held-out prompts: a length never trained on
RESPONSE = 24
SEQ = 32
BATCH = 16
STEPS = 30
LR = 3e-3
SEED = 1234


def rule_next(token: int) -> int:
    """The rule's next token after ``token`` (a byte in 0x80-0xBF)."""
    return RULE_BASE + (5 * (token - RULE_BASE) + 3) % RULE_SIZE


def rule_chain(prompt: list[int], n: int) -> list[int]:
    """The ``n`` tokens the rule continues ``prompt`` with."""
    out, last = [], prompt[-1]
    for _ in range(n):
        last = rule_next(last)
        out.append(last)
    return out


def rule_prompt(start: int, length: int) -> list[int]:
    """A prompt of the rule: ``length`` tokens from ``start`` (a byte in the range)."""
    return [start, *rule_chain([start], length - 1)]


def held_out_prompts(n: int = 6) -> list[list[int]]:
    """Prompts the trainer never saw (length :data:`PROMPT_LENGTH_HELD_OUT`), spread over the cycle."""
    return [rule_prompt(RULE_BASE + (11 * k + 5) % RULE_SIZE, PROMPT_LENGTH_HELD_OUT) for k in range(n)]


def hf_config() -> dict[str, Any]:
    """The HF ``config.json``: the tiny DeepSeek-V3 MTP model with a q LoRA of 32 (what the bridge can map)."""
    from patches.vllm.checkpoints import tiny_mtp_config

    config = tiny_mtp_config()
    config["q_lora_rank"] = 32
    return config


def init_single_process() -> None:
    """torch.distributed on gloo with one rank, and Megatron-Core's parallel state for TP=PP=1."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        with socket.socket() as sock:  # a free port of our own (one inherited from a parent may be taken)
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


@contextmanager
def on_cpu() -> Iterator[Any]:
    """``cpu_patched()`` and ``bridge_patched()`` for a block; yields the bridge set's report."""
    from patches.megatron import cpu_patched
    from patches.megatron.bridge import bridge_patched

    with ExitStack() as stack:
        stack.enter_context(cpu_patched())
        yield stack.enter_context(bridge_patched())


def build(seed: int = SEED) -> tuple[Any, Any]:
    """``(bridge, model)``: the model built by Megatron-Bridge's provider from :func:`hf_config`, fp32 on CPU."""
    import torch
    from transformers import DeepseekV3Config

    init_single_process()
    with on_cpu():
        from megatron.bridge import AutoBridge
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.tensor_parallel import random as tp_random

        config = {k: v for k, v in hf_config().items() if k != "torch_dtype"}
        bridge = AutoBridge.from_hf_config(DeepseekV3Config(**config))
        provider = bridge.to_megatron_provider(load_weights=False)
        provider.params_dtype, provider.bf16, provider.fp16 = torch.float32, False, False
        provider.use_cpu_initialization = True
        provider.finalize()
        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()  # what provide_distributed_model sets
        torch.manual_seed(seed)
        tp_random.model_parallel_cuda_manual_seed(seed)
        model = provider.provide(pre_process=True, post_process=True)
    return bridge, model


def _causal_mask(seq: int) -> Any:
    import torch

    return torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)[None, None]


def rollouts(step: int) -> dict[str, Any]:
    """A batch of rollouts of the rule with token rewards.

    Each row is a training prompt and a response of :data:`RESPONSE` tokens. Half the responses follow the
    rule; in the other half every fourth token is off the rule (as a policy's sample would be). A response
    token's advantage is +1 where it follows the rule, -1 where not; the MTP loss sees the rule's tokens only.
    """
    import torch

    gen = torch.Generator().manual_seed(SEED + step)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    advantages = torch.zeros(BATCH, SEQ)
    response = torch.zeros(BATCH, SEQ)
    follows = torch.zeros(BATCH, SEQ)
    for row in range(BATCH):
        length = PROMPT_LENGTHS_TRAIN[int(torch.randint(len(PROMPT_LENGTHS_TRAIN), (1,), generator=gen))]
        tokens = rule_prompt(RULE_BASE + int(torch.randint(RULE_SIZE, (1,), generator=gen)), length)
        noisy = row % 2 == 1
        while len(tokens) < SEQ:
            position = len(tokens)
            right = rule_next(tokens[-1]) if tokens[-1] >= RULE_BASE else RULE_BASE
            if noisy and (position - length) % 4 == 3:
                token = int(torch.randint(256, (1,), generator=gen))
                token = token if token != right else (token + 1) % 256
            else:
                token = right
            tokens.append(token)
            if position < length + RESPONSE:
                response[row, position] = 1.0
                advantages[row, position] = 1.0 if token == right else -1.0
                follows[row, position] = float(token == right)
        ids[row] = torch.tensor(tokens)
    # Label-aligned (labels[i] = ids[i + 1]): the loss at position i scores the token at i + 1.
    shift = lambda t: torch.roll(t, -1, dims=1)  # noqa: E731
    mask = shift(response)
    mask[:, -1] = 0
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ).contiguous(),
        "attention_mask": _causal_mask(SEQ),
        "labels": shift(ids),
        "loss_mask": mask,
        "mtp_mask": mask * shift(follows),
        "advantages": shift(advantages),
    }


def policy_loss(logits: Any, batch: dict[str, Any], clip: float = 0.2) -> Any:
    """PPO's clipped policy-gradient loss over the response tokens (one epoch: old log-probs = current)."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    adv = batch["advantages"]
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    # A rule-breaking token's probability is pushed down only while it is not already small (clipped below).
    per_token = torch.where(adv < 0, per_token * logp.detach().exp(), per_token)
    return (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


def train(model: Any, steps: int = STEPS, log: Any = print) -> list[dict[str, float]]:
    """Train the main and the MTP head on the rule: ``steps`` Adam steps under ``mtp_patched(detach_encoder=True)``."""
    import torch

    from patches.megatron import mtp_patched

    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    history = []
    model.train()
    with on_cpu(), mtp_patched(model, detach_encoder=True) as report:
        for step in range(steps):
            batch = rollouts(step)
            optimizer.zero_grad()
            logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"],
                           labels=batch["labels"], loss_mask=batch["mtp_mask"])  # fmt: skip
            loss = policy_loss(logits, batch)
            loss.backward()  # the MTP loss rides along (MTPLossAutoScaler) and reaches the MTP layer only
            optimizer.step()
            loss = loss.detach()
            mtp = float(report.mtp_losses[0]) if report.mtp_losses else float("nan")
            right = (logits.argmax(-1) == batch["labels"]).float()
            main_acc = float((right * batch["mtp_mask"]).sum() / batch["mtp_mask"].sum())
            history.append({"step": step, "policy_loss": float(loss), "mtp_loss": mtp, "main_accuracy": main_acc})
            if log is not None and (step % 5 == 0 or step == steps - 1):
                log(
                    f"  step {step:2d}: policy loss {float(loss):+.4f}  mtp loss {mtp:.4f}  main head on rule {main_acc:.2f}"
                )
    model.eval()
    return history


def greedy(model: Any, prompts: list[list[int]], max_tokens: int = RESPONSE) -> list[list[int]]:
    """The trainer's argmax continuation of each prompt (no MTP patch: the upstream model), prompts of one length."""
    import torch

    if len({len(p) for p in prompts}) != 1:
        msg = f"greedy() takes prompts of one length (a batch without padding), got lengths {[len(p) for p in prompts]}"
        raise ValueError(msg)
    tokens = torch.tensor(prompts)
    with on_cpu(), torch.no_grad():
        for _ in range(max_tokens):
            seq = tokens.shape[1]
            positions = torch.arange(seq).expand(len(prompts), seq)
            logits = model(tokens, positions, _causal_mask(seq))
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, len(prompts[0]) :].tolist()


def mtp_accuracy(model: Any, prompts: list[list[int]]) -> float:
    """How often the trainer's own MTP head predicts the rule's token two ahead on ``prompts`` and their rule chains."""
    import torch

    from patches.megatron import mtp_patched

    ids = torch.tensor([p + rule_chain(p, RESPONSE) for p in prompts])
    batch, seq = ids.shape
    captured: dict[str, Any] = {}

    def keep(module: Any, args: Any, output: Any) -> None:
        captured["hidden"] = output[0] if isinstance(output, tuple) else output

    handle = model.mtp.register_forward_hook(keep)
    try:
        with on_cpu(), mtp_patched(model, detach_encoder=True), torch.no_grad():
            model(ids, torch.arange(seq).expand(batch, seq), _causal_mask(seq),
                  labels=torch.roll(ids, -1, dims=1), loss_mask=torch.ones(batch, seq))  # fmt: skip
    finally:
        handle.remove()
    mtp_hidden = captured["hidden"].chunk(1 + model.config.mtp_num_layers, dim=0)[1]  # [s, b, h], normed
    predicted = (mtp_hidden.transpose(0, 1) @ model.output_layer.weight.t()).argmax(-1)  # at i: the token at i + 2
    return float((predicted[:, : seq - 2] == ids[:, 2:]).float().mean())


def export_tensors(bridge: Any, model: Any) -> Iterator[tuple[str, Any]]:
    """``AutoBridge.export_hf_weights``: the HF name and tensor of every exported weight, streamed."""
    with on_cpu():
        yield from bridge.export_hf_weights([model], cpu=True, show_progress=False)


def export(bridge: Any, model: Any, directory: str | Path) -> Path:
    """Write the exported weights (bf16), the HF config and the byte tokenizer to ``directory``."""
    import torch
    from safetensors.torch import save_file

    from patches.vllm.checkpoints import write_byte_tokenizer

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in export_tensors(bridge, model)}
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(hf_config(), indent=1))
    write_byte_tokenizer(root)
    return root
