"""MTP for PPO on ``HybridModel`` (0.18+) and ``MambaModel`` 0.17, whose MTP and loss are inline in ``forward``.

Three pieces, installed together by the hybrid patch sets:

- ``forward`` on the model instance: upstream's own forward, called with ``labels=None`` so it
  returns logits ``[b, s, vocab/tp]`` (never the LM loss); the user's labels and loss mask ride
  in a per-thread context for the MTP loss.
- a wrap of ``process_mtp_loss`` as the model's module imported it: for a model inside a block
  (found through ``compute_language_model_loss.__self__`` and the context) the MTP loss is ours
  (:func:`patches.megatron._loss.attach_mtp_loss`: the user's labels and mask, or upstream's RL mode
  with ``labels=None`` where the release has it; a detached output head with ``detach_encoder=True``);
  any other model's call goes to upstream's function untouched.
- ``mtp.forward`` on the model's MTP block (``detach_encoder=True`` only): the block sees detached
  decoder states; the main hidden states it hands back are the caller's own, with their graph.
"""

from __future__ import annotations

import threading
import types
from typing import Any

from patches.megatron import _fixups
from patches.megatron._compat import binder, parameters
from patches.megatron._loss import attach_mtp_loss, rl_mode
from patches.megatron._postprocess import in_inference

__all__ = [
    "Call",
    "call_in_block",
    "hybrid_forward",
    "hybrid_forward_detached",
    "mtp_block_forward_detached",
    "process_mtp_loss_in_block",
    "run_in_block",
]


class Call:
    """One patched forward in progress: the model and what its MTP loss needs from the caller."""

    __slots__ = ("detach", "labels", "loss_mask", "model")

    def __init__(self, model: Any, labels: Any, loss_mask: Any, detach: bool) -> None:
        self.model, self.labels, self.loss_mask, self.detach = model, labels, loss_mask, detach


_calls = threading.local()  # .stack: the patched forwards running on this thread, innermost last


def hybrid_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Return logits [b, s, vocab/tp] and attach the MTP loss (the trunk is trained by it)."""
    return _forward(self, args, kwargs, detach=False)


def hybrid_forward_detached(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Return logits [b, s, vocab/tp] and attach the MTP loss, detached from embedding, decoder and head."""
    return _forward(self, args, kwargs, detach=True)


def _forward(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any], detach: bool) -> Any:
    forward = type(self).forward
    a = binder(forward).bind(self, args, kwargs)
    if in_inference(self, a):
        return forward(self, *args, **kwargs)
    call = Call(self, a["labels"], a.get("loss_mask"), detach)
    return run_in_block(call, types.MethodType(forward, self), {**a, "labels": None})


def run_in_block(call: Call, forward: Any, arguments: dict[str, Any]) -> Any:
    """``forward(**arguments)`` with ``call`` on this thread's stack (where the MTP loss wrap finds the user's labels
    and mask) and, for a padded pack, upstream's roll fixed up. Shared by the native route (patches.megatron._native)."""
    stack = getattr(_calls, "stack", None)
    if stack is None:
        stack = _calls.stack = []
    stack.append(call)
    fixups = _fixups.around_forward(arguments.get("packed_seq_params"))  # a padded pack: upstream's roll fixed up
    try:
        if fixups is None:
            return forward(**arguments)
        with fixups:
            return forward(**arguments)
    finally:
        stack.pop()


def call_in_block(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Call | None]:
    """A ``process_mtp_loss`` call's arguments by name, and the call in progress of the model whose loss it computes
    (None: that model is not inside a block, its loss is upstream's)."""
    if args:  # upstream passes every argument by keyword; bind any positional ones by name
        kwargs = {**dict(zip(parameters(wrapped)[0], args, strict=False)), **kwargs}
    model = getattr(kwargs.get("compute_language_model_loss"), "__self__", None)
    if model is not None:
        for call in reversed(getattr(_calls, "stack", None) or ()):
            if call.model is model:
                return kwargs, call
    return kwargs, None


def process_mtp_loss_in_block(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The MTP loss of a model inside ``mtp_patched`` (the user's labels and mask); upstream's for any other."""
    import torch

    kwargs, call = call_in_block(wrapped, args, kwargs)
    if call is None:
        return wrapped(**kwargs)
    model = call.model
    a = {
        "labels": call.labels,
        "loss_mask": call.loss_mask,
        "input_ids": kwargs.get("input_ids"),
        "packed_seq_params": kwargs.get("packed_seq_params"),
        "runtime_gather_output": kwargs.get("runtime_gather_output"),
        "sequence_roll_context": kwargs.get("sequence_roll_context"),  # dev: the microbatch's roll context
    }
    hidden, *states = torch.chunk(kwargs["hidden_states"], 1 + model.config.mtp_num_layers, dim=0)
    if call.labels is None and not (rl_mode() and a["input_ids"] is not None):
        return hidden  # no labels and no RL mode on this release: no MTP loss, as upstream
    return attach_mtp_loss(model, hidden, states, a, kwargs.get("output_weight"), call.detach)


def mtp_block_forward_detached(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Run the MTP block on detached decoder states; hand back the caller's main states with their graph."""
    import torch

    hidden = kwargs.get("hidden_states")
    if hidden is None or args:
        msg = (
            "The detached MTP block expects hidden_states= by keyword, as HybridModel.forward passes it; "
            "call the model, not its MTP block, inside mtp_patched(detach_encoder=True)."
        )
        raise TypeError(msg)
    out = type(self).forward(self, **{**kwargs, "hidden_states": hidden.detach()})
    return torch.cat([hidden, out[hidden.shape[0] :]], dim=0)
