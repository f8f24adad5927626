"""One training step (forward + backward) on the tiny model, for each side; shared by section 5 and the RSS worker.

Kept free of the benchmark harness's other imports so the RSS worker loads only what its side needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks import _model


def forward_backward(model: Any, batch: dict[str, torch.Tensor], rl_mode: bool = False) -> float:
    """Logits from the (patched) model, cross-entropy against the labels, backward; the loss. With ``rl_mode``,
    upstream's own RL mode by hand (megatron-core 0.19.2+): ``labels=None`` and the loss mask shifted right
    (aligned with ``input_ids``; upstream rolls it left with the labels it derives: the mask again)."""
    labels, mask = (None, torch.roll(batch["loss_mask"], 1, -1)) if rl_mode else (batch["labels"], batch["loss_mask"])
    logits = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"], labels=labels, loss_mask=mask)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss)


def ours_step(model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], float]:
    """A step inside ``mtp_patched(model, detach_encoder=True)`` (entered and exited every step)."""
    from patches.megatron.mtp import mtp_patched

    def step() -> float:
        with mtp_patched(model, detach_encoder=True):
            return forward_backward(model, batch)

    return step


@contextlib.contextmanager
def verl_applied(verl: Any, model: Any) -> Iterator[None]:
    """verl's three patches applied to ``model`` for the block (as verl applies them: once, around training)."""
    with contextlib.redirect_stdout(None):
        verl.patch_postprocess(model)
        verl.patch_mtp_layer_get_embeddings(model)
        verl.patch_mtp_layer_checkpointed_forward(model)
    try:
        yield
    finally:
        with contextlib.redirect_stdout(None):
            verl.unpatch_mtp_layer_checkpointed_forward(model)
            verl.unpatch_mtp_layer_get_embeddings(model)
            verl.unpatch_postprocess(model)


def verl_every_step(verl: Any, model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], float]:
    """A step with verl's patches applied before it and removed after it (the per-step pattern)."""

    def step() -> float:
        with verl_applied(verl, model):
            return forward_backward(model, batch)

    return step


def verl_step(model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], float]:
    """A step with verl's patches in place (applied by :func:`verl_applied`)."""

    def step() -> float:
        return forward_backward(model, batch)

    return step


def upstream_rl_mode_step(model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], float]:
    """A step on upstream's own RL mode by hand, no patch (megatron-core 0.19.2+; ``config.mtp_detach_heads`` set
    once by the caller)."""

    def step() -> float:
        return forward_backward(model, batch, rl_mode=True)

    return step


@contextlib.contextmanager
def cpu_block() -> Iterator[None]:
    """The CPU shims every side needs to run Megatron-Core without CUDA, and Megatron's RNG tracker seeded."""
    from megatron.core import tensor_parallel

    from patches.megatron.cpu import cpu_patched

    with cpu_patched():
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        yield


def model_and_batch() -> tuple[Any, dict[str, torch.Tensor]]:
    """The tiny model (seed 0) and one batch; torch runs one intra-op thread so neighbours disturb it less."""
    torch.set_num_threads(1)
    return _model.build(seed=0), _model.batch(seed=0)
