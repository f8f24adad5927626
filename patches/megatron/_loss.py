"""The MTP loss of the postprocess patch: one semantics on every supported release.

Per depth ``d`` (1-based): logits of the d-th MTP hidden states through the shared output
layer, labels and loss mask rolled ``d`` positions left (``roll_tensor`` of the release),
masked cross-entropy normalised by the clamped number of valid tokens, attached to the
main hidden states with ``MTPLossAutoScaler`` and scaled by
``mtp_loss_scaling_factor / mtp_num_layers`` (``calculate_per_token_loss`` renormalises
against the main loss's token count, as Megatron-Core 0.17+ does).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from patches.megatron._compat import MTP, call, upstream

__all__ = ["attach_mtp_loss", "process_groups", "roll", "sinks"]

#: Reports that want the per-depth losses of a model's last step (see ``MTPReport``).
sinks: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def process_groups(model: Any) -> tuple[Any, Any]:
    """The (cp, tp) process groups of a GPTModel on any release (None when unknown)."""
    pgs = getattr(model, "pg_collection", None) or getattr(model, "model_comm_pgs", None)
    cp = getattr(pgs, "cp", None) if pgs is not None else getattr(model, "cp_group", None)
    tp = getattr(pgs, "tp", None) if pgs is not None else getattr(model, "tp_group", None)
    return cp, tp


def roll(tensor: Any, cp_group: Any, packed_seq_params: Any) -> tuple[Any, Any]:
    """``roll_tensor(tensor, -1)`` of the installed release, with the CP/packing arguments it takes."""
    roll_tensor = upstream(MTP, "roll_tensor")
    available = {"tensor": tensor, "shifts": -1, "dims": -1, "cp_group": cp_group}
    available["packed_seq_params"] = packed_seq_params
    return call(roll_tensor, available)  # type: ignore[no-any-return]


def _head_weight(model: Any, output_weight: Any, detach: bool) -> Any:
    """The output weight the MTP logits use: detached when the encoder (or the heads) are detached."""
    if not (detach or getattr(model.config, "mtp_detach_heads", False)):
        return output_weight
    weight = output_weight if output_weight is not None else model.output_layer.weight
    return weight.detach()


def attach_mtp_loss(
    model: Any, hidden: Any, depth_states: Sequence[Any], args: dict[str, Any], output_weight: Any, detach: bool
) -> Any:
    """Attach every depth's scaled MTP loss to ``hidden`` (returned) and record the per-depth losses."""
    import torch

    cfg = model.config
    labels, mask = args["labels"], args.get("loss_mask")
    mask = torch.ones_like(labels) if mask is None else mask
    total_tokens = mask.sum()
    cp_group, _tp = process_groups(model)
    weight = _head_weight(model, output_weight, detach)
    scale = cfg.mtp_loss_scaling_factor / cfg.mtp_num_layers
    losses = []
    for depth, states in enumerate(depth_states):
        logits = _mtp_logits(model, states, weight, args.get("runtime_gather_output"))
        labels, _ = roll(labels, cp_group, args.get("packed_seq_params"))
        mask, num_tokens = roll(mask, cp_group, args.get("packed_seq_params"))
        masked = mask * model.compute_language_model_loss(labels, logits)
        tokens = num_tokens.clamp(min=1)
        losses.append((masked.sum() / tokens).detach())
        if model.training:
            _log_to_tracker(model, losses[-1], logits, labels, mask, depth)
        per_token = cfg.calculate_per_token_loss  # renormalise against the main loss's token count
        scaled = scale * masked * (total_tokens / tokens) if per_token else scale * masked / tokens
        hidden = upstream(MTP, "MTPLossAutoScaler").apply(hidden, scaled)
    for report in list(sinks.get(model, ())):
        report._record(tuple(losses))
    return hidden


def _mtp_logits(model: Any, states: Any, weight: Any, runtime_gather_output: Any) -> Any:
    logits, _ = model.output_layer(states, weight=weight, runtime_gather_output=runtime_gather_output)
    if getattr(model.config, "use_mup", False) and hasattr(model, "_scale_logits"):
        logits = model._scale_logits(logits)
    return logits


def _avg_group() -> Any:
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def _log_to_tracker(model: Any, loss: Any, logits: Any, labels: Any, mask: Any, depth: int) -> None:
    """Megatron-Core's own MTP tracker, through whichever API the release has."""
    helper = upstream(MTP, "MTPLossLoggingHelper")
    available = {"loss": loss, "layer_number": depth, "num_layers": model.config.mtp_num_layers}
    available["avg_group"] = _avg_group()
    if hasattr(helper, "save_metrics_to_tracker"):
        correct, total = _acceptance(model, logits, labels, mask)
        call(helper.save_metrics_to_tracker, {**available, "correct": correct, "total": total})
    else:
        call(helper.save_loss_to_tracker, available)


def _acceptance(model: Any, logits: Any, labels: Any, mask: Any) -> tuple[Any, Any]:
    """(correct, total) greedy predictions of one depth on valid tokens; vocab-parallel aware."""
    import torch

    with torch.no_grad():
        preds = _global_argmax(logits, process_groups(model)[1], _vocab_sharded(model.output_layer))
        valid = mask.transpose(0, 1).bool()
        correct = ((preds == labels.transpose(0, 1)) & valid).sum().float()
        return correct, valid.sum().float()


def _vocab_sharded(output_layer: Any) -> bool:
    return not getattr(output_layer, "gather_output", False)


def _global_argmax(logits: Any, tp_group: Any, sharded: bool) -> Any:
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group=tp_group) if tp_group is not None and dist.is_initialized() else 1
    if size == 1 or not sharded:
        return logits.argmax(dim=-1)
    values, index = logits.max(dim=-1)
    all_values = [torch.empty_like(values) for _ in range(size)]
    all_index = [torch.empty_like(index) for _ in range(size)]
    dist.all_gather(all_values, values, group=tp_group)
    dist.all_gather(all_index, index, group=tp_group)
    winner = torch.stack(all_values).argmax(dim=0)
    local = torch.gather(torch.stack(all_index), 0, winner.unsqueeze(0)).squeeze(0)
    return winner * logits.size(-1) + local
