"""One process of the TP=2 test: the same model under TP=2 and TP=1, patched; rank 0 writes the comparison."""

from __future__ import annotations

import json
import os
from typing import Any


def run(rank: int, world: int, port: int, out_path: str) -> None:
    """Entry point for torch.multiprocessing.spawn (rank first)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from patches.megatron import cpu_patched

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        with cpu_patched():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
            tp2 = _step()
            parallel_state.destroy_model_parallel()
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
            tp1 = _step()
            parallel_state.destroy_model_parallel()
        if rank == 0:
            with open(out_path, "w", encoding="utf-8") as out:
                json.dump(_compare(tp2, tp1), out)
    finally:
        dist.destroy_process_group()


def _step() -> dict[str, Any]:
    """Gathered logits, full MTP-layer gradients and MTP losses of one patched step (detach_encoder=True)."""
    from patches.megatron import mtp_patched
    from tests.megatron.conftest import build_gpt, make_batch, mtp_params

    model, batch = build_gpt(seed=99), make_batch(seed=3)
    with mtp_patched(model, detach_encoder=True) as report:
        logits = model(*batch.args(), **batch.kwargs())
        (logits * 0).sum().backward()
    grads = {n: _gather(p.grad, p) for n, p in mtp_params(model).items()}
    trunk = sum(
        float(p.grad.abs().sum())
        for n, p in model.named_parameters()
        if not n.startswith("mtp.") and p.grad is not None
    )
    return {"logits": _gather_vocab(logits.detach()), "grads": grads, "losses": report.mtp_losses, "trunk": trunk}


def _gather(tensor: Any, param: Any) -> Any:
    """The full tensor of a tensor-parallel shard (replicated tensors as they are)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    size = dist.get_world_size(group=group)
    if size == 1 or not getattr(param, "tensor_model_parallel", False):
        return tensor.detach().clone()
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.detach().contiguous(), group=group)
    return torch.cat(parts, dim=param.partition_dim)


def _gather_vocab(logits: Any) -> Any:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(parts, logits.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _compare(tp2: dict[str, Any], tp1: dict[str, Any]) -> dict[str, Any]:
    from tests.megatron.conftest import rel_err

    return {
        "logits_shape": list(tp2["logits"].shape),
        "logits_max_abs": float((tp2["logits"] - tp1["logits"]).abs().max()),
        "grad_rel": {n: rel_err(g, tp1["grads"][n]) for n, g in tp2["grads"].items()},
        "grad_max_abs": max(float((g - tp1["grads"][n]).abs().max()) for n, g in tp2["grads"].items()),
        "losses": [tp2["losses"], tp1["losses"]],
        "trunk": [tp2["trunk"], tp1["trunk"]],
    }
