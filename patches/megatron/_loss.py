"""The MTP loss of the postprocess patch: one semantics on every supported release.

Per depth ``d`` (1-based): logits of the d-th MTP hidden states through the shared output
layer, labels and loss mask rolled ``d`` positions left (``roll_tensor`` of the release),
masked cross-entropy normalised by the clamped number of valid tokens, attached to the
main hidden states with ``MTPLossAutoScaler`` and scaled by
``mtp_loss_scaling_factor / mtp_num_layers``. With ``calculate_per_token_loss`` each release's
own semantics: 0.17+ (``process_mtp_loss``) renormalises against the main loss's token count
(``masked * main tokens / depth tokens``); 0.13-0.16 attach the masked sum unnormalised.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from patches.megatron._compat import MTP, adapter, form, module, per_function, unmet, upstream
from patchreg import accepts, has, on_refresh

#: Upstream's RL mode (0.19+): ``process_mtp_loss(..., labels=None, input_ids=...)`` derives the MTP labels.
RL_MODE = accepts(f"{MTP}:process_mtp_loss", "input_ids")
_RL_MODE: list[bool] = []  # the predicate's answer, once read
#: 0.17+ renormalises a per-token MTP loss against the main loss's token count (in ``process_mtp_loss``);
#: 0.13-0.16 attach ``scale * masked`` as it is. The patches follow the installed release.
PER_TOKEN_RENORMALISED = has(f"{MTP}:process_mtp_loss")
_RENORMALISED: list[bool] = []

__all__ = [
    "PER_TOKEN_RENORMALISED",
    "RL_MODE",
    "Deferred",
    "LastLosses",
    "attach_mtp_loss",
    "last_losses",
    "masked_means",
    "mtp_cp_group",
    "process_groups",
    "resolved",
    "rl_mode",
    "roll",
    "roll_form",
    "rolls",
    "tracked_losses",
    "unmet_calls",
]


class Deferred:
    """Per-depth MTP losses computed when first read, from a step's per-token losses (held detached) and its
    label-aligned mask (held as a copy, so a reused batch buffer cannot change them): the masked means
    :func:`attach_mtp_loss` records, with the same ops, so the same numbers. Only where the roll needs no
    collective and no patched state (no context parallelism, no packing): a step whose losses nobody reads
    pays two tensor ops for them instead of nine per depth."""

    __slots__ = ("_mask", "_per_token", "_value")

    def __init__(self, per_token: Sequence[Any], mask: Any) -> None:
        self._per_token: Sequence[Any] | None = [loss.detach() for loss in per_token]
        self._mask = mask.clone()
        self._value: tuple[Any, ...] | None = None

    def value(self) -> tuple[Any, ...]:
        """The losses (detached tensors), computed at the first call."""
        if self._value is None:
            self._value = masked_means(self._per_token or (), self._mask, None, None)
            self._per_token, self._mask = None, None
        return self._value


def masked_means(
    per_token: Sequence[Any], mask: Any, cp_group: Any, packed: Any, context: Any = None, depth: int = 0
) -> tuple[Any, ...]:
    """Each depth's masked mean of its per-token losses (in depth order), under the label-aligned ``mask`` rolled
    once more per depth as upstream rolls it: what ``report.mtp_losses`` reads, detached. ``context`` and ``depth``:
    the microbatch's roll context (dev) and the rolls the mask had before."""
    losses = []
    for number, loss in enumerate(per_token, start=depth):
        if context is None:
            mask, num_tokens = roll(mask, cp_group, packed)
        else:
            mask = rolls((mask,), cp_group, packed, context, ("loss_mask",), number)[0]
            num_tokens = mask.sum()
        losses.append(((mask * loss).sum() / num_tokens.clamp(min=1)).detach())
    return tuple(losses)


def resolved(losses: tuple[Any, ...] | Deferred) -> tuple[Any, ...]:
    """``losses`` as a tuple of tensors (a :class:`Deferred` computed now)."""
    return losses if isinstance(losses, tuple) else losses.value()


class LastLosses:
    """Each model's per-depth MTP losses of its last step with labels, numbered in step order.

    A block (``MTPReport``) notes ``count`` when it starts and reads its models' entries numbered
    after that, so nothing is registered per block; the entries are held weakly by model.
    """

    __slots__ = ("_by_model", "_numbers", "count")  # read at every enter and exit: no instance dict to look through

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self.count = 0  # the number of the newest entry (0: none yet)
        self._by_model: dict[int, tuple[weakref.ref[Any], int, tuple[Any, ...] | Deferred]] = {}

    def record(self, model: Any, losses: tuple[Any, ...] | Deferred) -> None:
        """Keep ``losses`` as ``model``'s newest, numbered after every entry so far."""
        number = next(self._numbers)
        self._by_model[_identity(model)] = (weakref.ref(model, self._forget), number, losses)
        self.count = number

    def newest(self, models: Sequence[Any], after: int) -> tuple[int, tuple[Any, ...] | Deferred] | None:
        """``(number, losses)`` of the newest entry of any of ``models`` numbered after ``after`` (losses as
        recorded: read them through :func:`resolved`)."""
        best = None
        for model in models:
            entry = self._by_model.get(_identity(model))
            if entry is not None and entry[1] > after and entry[0]() is model and (best is None or entry[1] > best[0]):
                best = (entry[1], entry[2])
        return best

    def _forget(self, dead: weakref.ref[Any]) -> None:
        for key, entry in list(self._by_model.items()):
            if entry[0] is dead:
                self._by_model.pop(key, None)


#: An object's identity without ``id()`` (whose audit event runs any audit hook, ~0.4 µs with torch).
_identity = object.__hash__

#: The losses of every model's last step (read by ``MTPReport``).
last_losses = LastLosses()


def mtp_cp_group(packed_seq_params: Any, model_cp: Any) -> Any:
    """The CP group the MTP rolls of one microbatch use: the pack's own (dynamic CP, dev), else the model's
    (``model_cp``, from :func:`process_groups`)."""
    found = getattr(packed_seq_params, "cp_group", None) if packed_seq_params is not None else None
    return found if found is not None else model_cp


def process_groups(model: Any) -> tuple[Any, Any]:
    """The (cp, tp) process groups of a GPTModel on any release (None when unknown)."""
    pgs = getattr(model, "pg_collection", None) or getattr(model, "model_comm_pgs", None)
    cp = getattr(pgs, "cp", None) if pgs is not None else getattr(model, "cp_group", None)
    tp = getattr(pgs, "tp", None) if pgs is not None else getattr(model, "tp_group", None)
    return cp, tp


#: upstream's names of the tensors an MTP loss rolls, for its roll context: labels given, or derived from input_ids
_GIVEN, _DERIVED = ("labels", "loss_mask"), ("input_ids", "loss_mask")
_ROLL_ARGS = frozenset(("tensor", "shifts", "dims", "cp_group", "packed_seq_params"))
_ROLL_TAKES_ALL: dict[Any, bool] = {}
#: The forms of ``roll_tensor`` the patches call, by the name of its first parameter: ``tensor`` (one tensor in,
#: ``(rolled, sum)`` out: 0.13-0.19.2 and main, which adds ``return_sum``) and ``tensors`` (a list in, a list out, with
#: per-tensor ``fill_values`` and the microbatch's ``roll_context``: dev, Megatron-LM #6246).
ROLL_FORMS = ("tensor", "tensors")
_ROLL_FORM: dict[Any, str] = {}


def roll_form(roll_tensor: Any) -> str:
    """Which of :data:`ROLL_FORMS` ``roll_tensor`` has (``""``: none, the patches cannot call it); read once."""
    return per_function(_ROLL_FORM, _read_roll_form, roll_tensor)


def _read_roll_form(roll_tensor: Any) -> str:
    found = adapter(roll_tensor)
    for first in ROLL_FORMS:
        if first in found.names and set(found.required) <= {first}:
            return first
    return ""


on_refresh(_ROLL_FORM.clear)


def roll(tensor: Any, cp_group: Any, packed_seq_params: Any, roll_tensor: Any = None) -> tuple[Any, Any]:
    """``roll_tensor(tensor, -1)`` of the installed release (or the given one), with the CP/packing arguments it
    takes: (rolled, sum)."""
    roll_tensor = upstream(MTP, "roll_tensor") if roll_tensor is None else roll_tensor
    if per_function(_ROLL_TAKES_ALL, _takes_all_roll_args, roll_tensor):  # read once per roll_tensor
        return roll_tensor(  # type: ignore[no-any-return]
            tensor=tensor, shifts=-1, dims=-1, cp_group=cp_group, packed_seq_params=packed_seq_params
        )
    if roll_form(roll_tensor) == "tensors":
        rolled = rolls((tensor,), cp_group, packed_seq_params, roll_tensor=roll_tensor)[0]
        return rolled, rolled.sum()
    available = {"tensor": tensor, "shifts": -1, "dims": -1, "cp_group": cp_group}
    available["packed_seq_params"] = packed_seq_params
    return roll_tensor(**adapter(roll_tensor).kwargs(available))  # type: ignore[no-any-return]


def rolls(
    tensors: Sequence[Any],
    cp_group: Any,
    packed_seq_params: Any,
    context: Any = None,
    fields: Sequence[str] = (),
    depth: int = 0,
    roll_tensor: Any = None,
) -> list[Any]:
    """Each of ``tensors`` rolled left once as the release rolls them: one call of the list form (dev), with fill
    value 0 and the microbatch's roll ``context`` (``fields``: upstream's names of the tensors, ``depth``: how many
    rolls came before, which select its prefetched halo rows); one ``roll_tensor`` call per tensor elsewhere."""
    roll_tensor = upstream(MTP, "roll_tensor") if roll_tensor is None else roll_tensor
    if roll_form(roll_tensor) != "tensors":
        return [roll(tensor, cp_group, packed_seq_params, roll_tensor)[0] for tensor in tensors]
    available = {"tensors": list(tensors), "shifts": -1, "dims": -1, "cp_group": cp_group}
    available.update(packed_seq_params=packed_seq_params, fill_values=[0] * len(tensors), roll_depth=depth)
    if context is not None:
        available.update(roll_context=context, sequence_fields=list(fields))
    return list(roll_tensor(**adapter(roll_tensor).kwargs(available)))


def unmet_calls(todays: bool) -> list[str]:
    """The upstream functions an MTP loss of this route calls (``todays``: today's patches, which also log to the
    tracker; else the native route, which only records the losses) in a form the patches cannot call."""
    found = []
    roll_tensor = upstream(MTP, "roll_tensor")
    if roll_tensor is not None and not roll_form(roll_tensor):
        found.append(
            f"{form(roll_tensor)} is in neither form the patches call: roll_tensor(tensor, ...) -> (rolled, sum) "
            "(0.13-0.19.2, main) or roll_tensor(tensors=[...], ...) -> [rolled] (dev)"
        )
    helper = upstream(MTP, "MTPLossLoggingHelper")
    if todays and helper is not None:
        save, counts = _tracker_save(helper)
        why = unmet(save, _TRACKED_WITH_COUNTS if counts else _TRACKED)
        found += [why] if why else []
    return found


def _roll_pair(
    labels: Any, mask: Any, cp_group: Any, packed: Any, context: Any, fields: Sequence[str], depth: int
) -> tuple[Any, Any, Any]:
    """Labels and mask rolled once more for the next depth (together, as upstream does, on the list form), and the
    mask's sum: the depth's valid tokens."""
    if roll_form(upstream(MTP, "roll_tensor")) == "tensors":
        labels, mask = rolls((labels, mask), cp_group, packed, context, fields, depth)
        return labels, mask, mask.sum()
    labels, _ = roll(labels, cp_group, packed)
    mask, num_tokens = roll(mask, cp_group, packed)
    return labels, mask, num_tokens


def _takes_all_roll_args(roll_tensor: Any) -> bool:
    """0.16+ ``roll_tensor`` takes all five arguments: it can be called directly."""
    return _ROLL_ARGS.issubset(adapter(roll_tensor).names)


def rl_mode() -> bool:
    """Whether this release trains MTP with ``labels=None`` (labels from ``input_ids``): upstream's RL mode."""
    if not _RL_MODE:
        _RL_MODE.append(RL_MODE.evaluate().ok)
    return _RL_MODE[0]


def per_token_renormalised() -> bool:
    """Whether this release renormalises a per-token MTP loss against the main token count (0.17+)."""
    if not _RENORMALISED:
        _RENORMALISED.append(PER_TOKEN_RENORMALISED.evaluate().ok)
    return _RENORMALISED[0]


def rl_labels(args: dict[str, Any], cp_group: Any, packed: Any) -> tuple[Any, Any]:
    """Upstream's RL mode: labels are ``input_ids`` rolled left once, and the mask (aligned with ``input_ids``)
    is rolled with them, so the fabricated last label is masked; no mask: all ones, then rolled."""
    import torch

    ids, mask = args["input_ids"], args.get("loss_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    labels, mask, _ = _roll_pair(ids, mask, cp_group, packed, args.get("sequence_roll_context"), _DERIVED, 0)
    return labels, mask


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
    packed, gather = args.get("packed_seq_params"), args.get("runtime_gather_output")
    model_cp, tp_group = process_groups(model)
    cp_group = mtp_cp_group(packed, model_cp)
    labels, mask = args["labels"], args.get("loss_mask")
    derived = labels is None  # upstream's RL mode (the callers ask rl_mode() first)
    if derived:
        if args.get("input_ids") is None:
            return hidden  # nothing to derive labels from: no MTP loss, as upstream
        labels, mask = rl_labels(args, cp_group, packed)
    context, fields = args.get("sequence_roll_context"), _DERIVED if derived else _GIVEN
    mask = torch.ones_like(labels) if mask is None else mask
    total_tokens = mask.sum()
    weight = _head_weight(model, output_weight, detach)
    scale = cfg.mtp_loss_scaling_factor / cfg.mtp_num_layers
    per_token = cfg.calculate_per_token_loss  # the release's own per-token semantics (see the module docstring)
    renormalise = per_token and per_token_renormalised()
    scaler = upstream(MTP, "MTPLossAutoScaler")
    log = _TrackerLog(model, tp_group, gather) if model.training else None
    losses = []
    for depth, states in enumerate(depth_states):
        logits = _mtp_logits(model, states, weight, gather)
        labels, mask, num_tokens = _roll_pair(labels, mask, cp_group, packed, context, fields, depth + derived)
        masked = mask * model.compute_language_model_loss(labels, logits)
        tokens = num_tokens.clamp(min=1)
        losses.append((masked.sum() / tokens).detach())
        if log is not None:
            log.save(losses[-1], logits, labels, mask, depth)
        if per_token:
            scaled = scale * masked * (total_tokens / tokens) if renormalise else scale * masked
        else:
            scaled = scale * masked / tokens
        hidden = scaler.apply(hidden, scaled)
    last_losses.record(model, tuple(losses))
    return hidden


def _mtp_logits(model: Any, states: Any, weight: Any, runtime_gather_output: Any) -> Any:
    logits, _ = model.output_layer(states, weight=weight, runtime_gather_output=runtime_gather_output)
    if getattr(model.config, "use_mup", False) and hasattr(model, "_scale_logits"):
        logits = model._scale_logits(logits)
    return logits


def _avg_group() -> Any:
    parallel_state = module("megatron.core.parallel_state")
    if not parallel_state.model_parallel_is_initialized():
        return None
    return parallel_state.get_data_parallel_group(with_context_parallel=True)


def tracked_losses(tracker: Mapping[str, Any]) -> Any:
    """The per-depth MTP losses upstream logged to its tracker this step (a tensor), None when none: ``values``
    (0.13-0.18), ``loss_values`` (0.19), ``loss_sums`` (dev; with per-token loss, over its ``num_tokens``)."""
    sums = tracker.get("loss_sums")
    if sums is not None:
        tokens = tracker.get("num_tokens") if tracker.get("calculate_per_token_loss") else None
        return sums if tokens is None else sums / tokens.clamp(min=1)
    found = tracker.get("loss_values")
    return found if found is not None else tracker.get("values")


#: What _TrackerLog passes the tracker's helper: save_loss_to_tracker (0.13-0.18), save_metrics_to_tracker (0.19+)
_TRACKED = frozenset(("loss", "layer_number", "num_layers", "avg_group"))
_TRACKED_WITH_COUNTS = _TRACKED | {"correct", "total"}


def _tracker_save(helper: Any) -> tuple[Any, bool]:
    """The helper's function today's patches log an MTP loss with, and whether it takes acceptance counts."""
    save = getattr(helper, "save_metrics_to_tracker", None)
    return (save, True) if save is not None else (helper.save_loss_to_tracker, False)


class _TrackerLog:
    """Megatron-Core's own MTP tracker for one forward, through whichever API the release has.

    0.19+ (``save_metrics_to_tracker``): the loss and the greedy acceptance counts of each depth,
    as upstream's ``process_mtp_loss`` logs them; before: the loss (``save_loss_to_tracker``).
    The helper, its API and the data-parallel group are looked up once per forward, not per depth.
    """

    __slots__ = ("available", "gather", "model", "save_fn", "saver", "tp_group", "wants_counts")

    def __init__(self, model: Any, tp_group: Any, runtime_gather_output: Any) -> None:
        self.save_fn, self.wants_counts = _tracker_save(upstream(MTP, "MTPLossLoggingHelper"))
        self.saver = adapter(self.save_fn)
        self.model, self.tp_group, self.gather = model, tp_group, runtime_gather_output
        self.available = {"num_layers": model.config.mtp_num_layers, "avg_group": _avg_group()}

    def save(self, loss: Any, logits: Any, labels: Any, mask: Any, depth: int) -> None:
        available = self.available
        available["loss"], available["layer_number"] = loss, depth
        if self.wants_counts:
            sharded = _vocab_sharded(self.model.output_layer, self.gather)
            available["correct"], available["total"] = _acceptance(logits, labels, mask, self.tp_group, sharded)
        self.save_fn(**self.saver.kwargs(available))


def _acceptance(logits: Any, labels: Any, mask: Any, tp_group: Any, sharded: bool) -> tuple[Any, Any]:
    """(correct, total) greedy predictions of one depth on valid tokens; vocab-parallel aware.

    ``logits`` are ``[s, b, v]``, ``labels`` and ``mask`` ``[b, s]``; no op here records autograd
    history (argmax and comparisons have no gradient), so no ``no_grad`` block is needed.
    """
    preds = _global_argmax(logits, tp_group, sharded).transpose(0, 1)  # [b, s], a view
    valid = mask.bool()
    correct = (preds == labels).logical_and_(valid).sum().float()
    return correct, valid.sum().float()


def _vocab_sharded(output_layer: Any, runtime_gather_output: Any) -> bool:
    """Whether the MTP logits are still split over the vocabulary across tensor-parallel ranks (as upstream)."""
    if runtime_gather_output is not None:
        return not runtime_gather_output
    return not getattr(output_layer, "gather_output", False)


def _global_argmax(logits: Any, tp_group: Any, sharded: bool) -> Any:
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group=tp_group) if sharded and tp_group is not None and dist.is_initialized() else 1
    if size == 1:
        return logits.argmax(dim=-1)
    with torch.no_grad():  # max() would record history for the values
        values, index = logits.max(dim=-1)
        all_values = [torch.empty_like(values) for _ in range(size)]
        all_index = [torch.empty_like(index) for _ in range(size)]
        dist.all_gather(all_values, values, group=tp_group)
        dist.all_gather(all_index, index, group=tp_group)
        winner = torch.stack(all_values).argmax(dim=0)
        local = torch.gather(torch.stack(all_index), 0, winner.unsqueeze(0)).squeeze(0)
        return winner * logits.size(-1) + local
