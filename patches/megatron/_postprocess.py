"""The replacement of ``GPTModel._postprocess`` used by the MTP patch sets.

It returns logits ``[b, s, vocab/tp]`` instead of the language-model loss and, when labels
are given and the model has MTP layers, runs them and attaches their loss to the graph
(see :mod:`patches.megatron._loss`). Arguments are read by name from the installed
``_postprocess`` signature; upstream callees get what their own signatures accept.
"""

from __future__ import annotations

from typing import Any

from patches.megatron import _fixups
from patches.megatron._compat import MTP, adapter, binder, parameters, per_function, refusal, unmet, upstream
from patches.megatron._loss import attach_mtp_loss, process_groups, rl_mode, roll

__all__ = ["calls_known", "in_inference", "postprocess", "postprocess_detached"]

_NO_INFERENCE_MODE = object()
_inference_mode: Any = None
_TAKES_DECODER_INPUT: dict[Any, bool] = {}


def postprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Return logits [b, s, vocab/tp] and attach the MTP loss (the trunk is trained by it)."""
    return _postprocess(self, args, kwargs, detach=False)


def postprocess_detached(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Return logits [b, s, vocab/tp] and attach the MTP loss, detached from embedding, decoder and head."""
    return _postprocess(self, args, kwargs, detach=True)


def _bind(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults filled in, against the class's own ``_postprocess``."""
    return binder(type(self)._postprocess).bind(self, args, kwargs)


def _inference_mode_cls() -> Any:
    """The release's ``InferenceMode`` (0.18+) when it can say whether inference is active, else a sentinel."""
    global _inference_mode
    if _inference_mode is None:
        try:
            mode = upstream("megatron.core.inference.utils", "InferenceMode")
        except ImportError:
            mode = None
        _inference_mode = mode if mode is not None and hasattr(mode, "is_active") else _NO_INFERENCE_MODE
    return _inference_mode


def in_inference(self: Any, a: dict[str, Any]) -> bool:
    """Inference as the release itself decides it (0.18+: InferenceMode; before: a context outside training)."""
    mode = _inference_mode_cls()
    if mode is not _NO_INFERENCE_MODE:
        return bool(mode.is_active())
    context = a.get("inference_context") or a.get("inference_params")
    return context is not None and not self.training


def _postprocess(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any], detach: bool) -> Any:
    a = _bind(self, args, kwargs)
    if in_inference(self, a):
        return type(self)._postprocess(self, *args, **kwargs)
    fixups = _fixups.around_forward(a.get("packed_seq_params"))  # a padded pack: upstream's roll is fixed up
    if fixups is None:
        return _train(self, a, detach)
    with fixups:
        return _train(self, a, detach)


def _train(self: Any, a: dict[str, Any], detach: bool) -> Any:
    """The patched postprocess outside inference: MTP, its loss attached, logits."""
    import torch

    hidden, depth = a["hidden_states"], self.config.mtp_num_layers or 0
    output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
    states: list[Any] = []
    if _runs_mtp_here(self, a, depth):
        states = _run_mtp(self, a, hidden, detach)
        if not self.post_process:
            return torch.cat([hidden, *states], dim=0)
    elif depth and self.post_process and _mtp_on_earlier_stage(self):
        hidden, *states = torch.chunk(hidden, 1 + depth, dim=0)
    if not self.post_process:
        return hidden
    if states and (a["labels"] is not None or rl_mode()):
        hidden = attach_mtp_loss(self, hidden, states, a, output_weight, detach)
    if a.get("output_processor") is not None:
        return _output_processor(self, a, hidden, output_weight)
    logits, _ = self.output_layer(hidden, weight=output_weight, runtime_gather_output=a.get("runtime_gather_output"))
    if hasattr(self, "_scale_logits"):
        logits = self._scale_logits(logits)
    return logits.transpose(0, 1).contiguous()


def _runs_mtp_here(self: Any, a: dict[str, Any], depth: int) -> bool:
    """MTP layers live on this chunk, and labels are given (or derived: upstream's RL mode), or a later stage expects their output."""
    if not (a.get("mtp_in_postprocess") and depth and getattr(self, "mtp", None) is not None):
        return False
    return a["labels"] is not None or not self.post_process or rl_mode()


def _mtp_on_earlier_stage(self: Any) -> bool:
    """The hidden states arrive concatenated with MTP outputs from an earlier pipeline stage.

    Asked of a last stage whose config has MTP depth: it holds no MTP layers (``mtp_process`` is
    False, whether or not it was given an MTP block spec), so a standalone MTP stage before it ran them.
    """
    return not getattr(self, "mtp_process", False)


def _run_mtp(self: Any, a: dict[str, Any], hidden: Any, detach: bool) -> list[Any]:
    """The hidden states of each MTP depth, from the block (0.14+) or driving the layers (0.13)."""
    import torch

    mtp_in = hidden.detach() if detach else hidden
    if _takes_decoder_input(type(self.mtp.layers[0]).forward):
        return _drive_layers(self, a, mtp_in, detach)
    available = _layer_inputs(a)
    available.update(hidden_states=mtp_in, embedding=self.embedding, input_ids=a["input_ids"])
    available["position_ids"] = a["position_ids"]
    out = self.mtp(**adapter(type(self.mtp).forward).kwargs(available, a.get("extra_block_kwargs")))
    return list(torch.chunk(out[hidden.shape[0] :], self.config.mtp_num_layers, dim=0))


def _takes_decoder_input(layer_forward: Any) -> bool:
    """0.13's MTP layers take the embedded shifted tokens (``decoder_input``); read once per forward function."""
    return per_function(_TAKES_DECODER_INPUT, _reads_decoder_input, layer_forward)


def _reads_decoder_input(layer_forward: Any) -> bool:
    return "decoder_input" in parameters(layer_forward)[0]


_LAYER_INPUTS = (
    "attention_mask",
    "rotary_pos_emb",
    "rotary_pos_cos",
    "rotary_pos_sin",
    "packed_seq_params",
    "sequence_len_offset",
    "padding_mask",
    "mhc_multistream",  # dev: hyper-connections hand the MTP block the decoder's multi-stream states
)


#: What _run_mtp passes the MTP block (0.14+), and _drive_layers each MTP layer (0.13), besides a user's
#: extra_block_kwargs.
_BLOCK_INPUTS = frozenset(
    (*_LAYER_INPUTS, "inference_params", "hidden_states", "embedding", "input_ids", "position_ids")
)
_LAYER_ONLY_INPUTS = frozenset((*_LAYER_INPUTS, "inference_params", "hidden_states", "decoder_input"))


def calls_known() -> tuple[bool, str]:
    """Whether the patched postprocess can call the release's MTP block (or, on 0.13, its layers); a block whose
    callee requires an argument it does not pass is refused here, at the block's entry (raised)."""
    layer, block = upstream(MTP, "MultiTokenPredictionLayer"), upstream(MTP, "MultiTokenPredictionBlock")
    if layer is None or block is None:
        return True, "no MTP block on this release"
    if _takes_decoder_input(layer.forward):
        why = unmet(layer.forward, _LAYER_ONLY_INPUTS)
    else:
        why = unmet(block.forward, _BLOCK_INPUTS)
    if why:
        raise refusal([why], "today's patches (GPTModel._postprocess)")
    return True, "the MTP block takes what the patched postprocess passes"


def _layer_inputs(a: dict[str, Any]) -> dict[str, Any]:
    found = {name: a.get(name) for name in _LAYER_INPUTS}
    found["inference_params"] = None  # MTP layers use no KV cache (as upstream 0.17+)
    return found


def _drive_layers(self: Any, a: dict[str, Any], hidden: Any, detach: bool) -> list[Any]:
    """0.13: the block computes its own loss, so run its layers here (embeddings of the shifted tokens)."""
    cp_group, _tp = process_groups(self)
    packed = a.get("packed_seq_params")
    ids, pos, states = a["input_ids"], a["position_ids"], []
    for layer in self.mtp.layers:
        ids, _ = roll(ids, cp_group, packed)
        pos, _ = roll(pos, cp_group, packed)
        embedded = self.embedding(input_ids=ids, position_ids=pos)
        inputs = {**_layer_inputs(a), "hidden_states": hidden}
        inputs["decoder_input"] = embedded.detach() if detach else embedded
        hidden = layer(**adapter(type(layer).forward).kwargs(inputs, a.get("extra_block_kwargs")))
        states.append(hidden)
    return states


def _output_processor(self: Any, a: dict[str, Any], hidden: Any, output_weight: Any) -> Any:
    """Hand over to a user ``output_processor`` (0.18+) with the keywords upstream passes."""
    names = ("labels", "loss_mask", "input_ids", "position_ids", "attention_mask", "decoder_input")
    kwargs = {name: a.get(name) for name in names}
    kwargs.update(inference_context=a.get("inference_context"), packed_seq_params=a.get("packed_seq_params"))
    kwargs.update(runtime_gather_output=a.get("runtime_gather_output"), context=a.get("output_processor_context"))
    kwargs.update(compute_language_model_loss=self.compute_language_model_loss, config=self.config)
    kwargs.update(scale_logits=self._scale_logits)
    return a["output_processor"](
        hidden_states=hidden, output_layer=self.output_layer, output_weight=output_weight, **kwargs
    )
