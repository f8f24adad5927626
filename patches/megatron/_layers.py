"""Replacements on each ``MultiTokenPredictionLayer``: detached embeddings, a working recompute."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from patches.megatron._compat import RANDOM, upstream
from patchreg import PatchWarning

__all__ = ["checkpointed_forward", "get_embeddings_detached"]


def get_embeddings_detached(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Embed the shifted tokens without gradient to the embedding; keep the hidden-state input differentiable."""
    hidden = kwargs.get("hidden_states")  # every release passes it by keyword
    if hidden is not None and not hidden.requires_grad:  # detached trunk states (a view of a chunk): as a leaf
        kwargs["hidden_states"] = hidden.detach().requires_grad_(True)  # upstream need not make it viewless
    *head, decoder_input, hidden_states = type(self)._get_embeddings(self, *args, **kwargs)
    if not hidden_states.requires_grad:  # detached trunk states: recompute needs one input with grad
        hidden_states = hidden_states.detach().requires_grad_(True)
    return (*head, decoder_input.detach(), hidden_states)


def checkpointed_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Recompute the MTP layer with only tensors saved (non-tensors ride in a closure), every argument kept."""
    if args and callable(args[0]):  # 0.14-0.17: (forward_func, *args, **kwargs)
        forward, args = args[0], args[1:]
    else:  # 0.18: keyword form; upstream's own signature drops padding_mask
        forward = self._proj_and_transformer_layer
    method = self.config.recompute_method
    if method == "block":
        msg = "recompute_method='block' is not supported for MTP layers; they run without recompute."
        warnings.warn(msg, PatchWarning, stacklevel=2)
        return forward(*args, **kwargs)
    if method != "uniform":
        msg = f"Invalid activation recompute method {method!r} for MTP; use 'uniform'."
        raise ValueError(msg)
    if self.config.recompute_num_layers != 1:
        msg = "MTP recompute needs recompute_num_layers=1."
        raise ValueError(msg)
    run, tensors = _closure(forward, args, kwargs)
    return _checkpoint(self.config, run, tensors)


def _closure(forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
    """``run(*tensors)`` calling ``forward`` with every argument; tensors listed hidden_states first."""
    import torch

    names = sorted(kwargs, key=lambda name: name != "hidden_states")
    values = [*args, *(kwargs[name] for name in names)]
    is_tensor = [torch.is_tensor(v) for v in values]
    tensors = [v for v, t in zip(values, is_tensor, strict=True) if t]
    values = [None if t else v for v, t in zip(values, is_tensor, strict=True)]  # the closure keeps no tensor

    def run(*flat: Any) -> Any:
        it = iter(flat)
        filled = [next(it) if t else v for v, t in zip(values, is_tensor, strict=True)]
        return forward(*filled[: len(args)], **dict(zip(names, filled[len(args) :], strict=True)))

    return run, tensors


def _checkpoint(config: Any, run: Callable[..., Any], tensors: list[Any]) -> Any:
    tensor_parallel = upstream("megatron.core", "tensor_parallel")
    if config.fp8 or getattr(config, "fp4", None):
        from megatron.core import parallel_state
        from megatron.core.extensions.transformer_engine import te_checkpoint

        tracker = upstream(RANDOM, "get_cuda_rng_tracker")
        group = parallel_state.get_tensor_model_parallel_group()
        return te_checkpoint(run, config.distribute_saved_activations, tracker, group, *tensors)
    return tensor_parallel.checkpoint(run, config.distribute_saved_activations, *tensors)
