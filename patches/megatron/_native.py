"""``mtp_patched`` on upstream's own RL mode (megatron-core 0.19.2+): no reimplementation of an upstream body.

Where the release has both ``process_mtp_loss(..., input_ids=)`` (``labels=None`` derives the MTP labels from
``input_ids``) and ``TransformerConfig.mtp_detach_heads`` (detaches the MTP block's input, its embeddings and
the output head), the block installs three patches in place of today's replacements:

- ``mtp_detach_heads`` / ``mtp_heads_attached``: ``config.mtp_detach_heads`` set to ``detach_encoder`` for the
  block (a ``kind="value"`` patch on the model's own config object);
- ``rl_mode_forward``: the model's ``forward`` (on the instance) calling upstream's forward with ``labels=None`` (it
  returns logits ``[b, s, vocab/tp]``) and keeps the user's labels and label-aligned mask for the MTP loss; a
  user ``output_processor`` (GPTModel) still gets the user's labels and mask;
- ``rl_mode_mtp_loss`` (GPTModel) / ``rl_mode_hybrid_mtp_loss`` (HybridModel): a wrap of ``process_mtp_loss`` as
  the model's module imported it. For a model in the block it hands upstream's body the user's labels and
  label-aligned mask, which the ``labels=None`` forward kept: upstream's own label mode, under
  ``mtp_detach_heads``, exact for any labels and mask (nothing is checked or translated per call). A user's own
  ``labels=None`` call is upstream's RL mode (labels from ``input_ids``). Any other model's call goes to upstream
  untouched.

The per-depth losses (``report.mtp_losses``) come from the same per-token losses upstream computes (its
``compute_language_model_loss`` call is observed) under the same rolled masks, so both routes record them; where
the roll needs no collective and no pack they are computed when first read.
"""

from __future__ import annotations

import types
from typing import Any

from patches.megatron._compat import GPT, MTP, absent, binder, mcore_version, refusal, upstream
from patches.megatron._hybrid import Call, call_in_block, run_in_block
from patches.megatron._loss import (
    RL_MODE,
    Deferred,
    last_losses,
    masked_means,
    mtp_cp_group,
    process_groups,
    rolls,
    unmet_calls,
)
from patches.megatron._models import HYBRID
from patches.megatron._postprocess import in_inference
from patches.megatron._verified import GPT_MTP_LOSS_BODY, HYBRID_MTP_LOSS_BODY
from patchreg import Answer, Patch, check, has, not_needed_when, on_refresh

__all__ = [
    "NATIVE",
    "NATIVE_ROUTE",
    "RL_MODE_FORWARD",
    "RL_MODE_HYBRID_MTP_LOSS",
    "RL_MODE_MTP_LOSS",
    "HEADS_ATTACHED",
    "HEADS_DETACHED",
    "UPSTREAM",
    "route_of",
    "natively_covered",
    "native",
    "rl_mode_forward",
    "rl_mode_mtp_loss",
]

UPSTREAM = "upstream does this natively here"
_CONFIG = "megatron.core.transformer.transformer_config:TransformerConfig"
_PROBE_IDS = (1, 2, 3, 4)  # the probe's input_ids; the depth-1 labels upstream's RL mode gives are 3, 4, 0, 0
_PROBE_LABELS = (3, 4, 0, 0)
_MASK = ("loss_mask",)


def _rl_mode_probe() -> tuple[bool, str]:
    """Whether upstream's ``process_mtp_loss`` derives the MTP labels from ``input_ids`` with ``labels=None`` and
    detaches the output head under ``mtp_detach_heads`` (a one-depth call on four tokens, no model needed)."""
    missing = absent("torch", "megatron.core")
    if missing:
        return False, missing
    import torch

    if not RL_MODE.evaluate().ok:
        return False, "process_mtp_loss takes no input_ids: no labels=None RL mode on this release (0.19+)"
    if not has(f"{_CONFIG}.mtp_detach_heads").evaluate().ok:
        return False, "TransformerConfig has no mtp_detach_heads on this release (0.19.2+)"
    try:
        process = upstream(MTP, "process_mtp_loss")
    except ImportError as exc:
        return False, f"megatron-core cannot be imported ({exc})"
    process = getattr(process, "__wrapped__", process)  # upstream's own, under any wrap
    seen: dict[str, Any] = {}

    def output_layer(hidden: Any, weight: Any = None, runtime_gather_output: Any = None) -> tuple[Any, None]:
        seen["head"] = weight is not None and weight.requires_grad
        return hidden, None

    def loss(labels: Any, logits: Any) -> Any:
        seen["labels"] = labels[0].tolist()
        return torch.zeros(labels.shape)

    config = _probe_config(mtp_num_layers=1, mtp_detach_heads=True, calculate_per_token_loss=False,
                           mtp_loss_scaling_factor=0.1)  # fmt: skip
    try:
        process(hidden_states=torch.zeros(8, 1, 1), labels=None, loss_mask=None, output_layer=output_layer,
                output_weight=torch.ones(1, requires_grad=True), runtime_gather_output=None, is_training=False,
                compute_language_model_loss=loss, config=config, input_ids=torch.tensor([_PROBE_IDS]))  # fmt: skip
    except Exception as exc:
        return False, f"upstream's process_mtp_loss failed the RL-mode probe ({type(exc).__name__}: {exc})"
    if seen.get("labels") != list(_PROBE_LABELS) or seen.get("head", True):
        return False, f"upstream's RL mode did not behave as verified (probe saw {seen})"
    return True, f"labels=None and mtp_detach_heads probed on megatron-core {mcore_version()}"


def _probe_config(**fields: Any) -> Any:
    """A stand-in config for the probe: every field of the release's ``TransformerConfig`` at its default (what
    upstream's body may read: dev reads ``cross_entropy_loss_fusion``), then ``fields``; no ``__post_init__`` checks."""
    import dataclasses

    defaults: dict[str, Any] = {}
    config_class = upstream(_CONFIG.partition(":")[0], _CONFIG.partition(":")[2])
    for field in dataclasses.fields(config_class) if dataclasses.is_dataclass(config_class) else ():
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
    return types.SimpleNamespace(**{**defaults, **fields})


def _probe() -> tuple[bool, str]:
    return _rl_mode_probe()  # looked up at each evaluation (after patchreg.refresh(): a test can take today's route)


NATIVE = check(_probe, "upstream's RL mode (labels=None) with mtp_detach_heads")


def _route() -> Answer:
    """The probe's answer, once the upstream functions the route it picks calls have a form the patches can call;
    else the block is refused here, at its entry, naming them (never with a failure in the middle of a forward)."""
    answer = NATIVE.evaluate()
    if absent("torch", "megatron.core"):  # nothing to call: the probe's no says why
        return answer
    unmet = unmet_calls(todays=not answer.ok)
    if unmet:
        raise refusal(unmet, "upstream's RL mode (the native route)" if answer.ok else "today's patches")
    return answer


def _covered() -> tuple[bool, str]:
    answer = _route()
    if answer.ok:
        return True, f"{UPSTREAM} ({answer.reason})"
    return False, f"patched: {answer.reason}"


#: today's replacements are ``not_needed_when(natively_covered)``: skipped where the native route installs
natively_covered = check(_covered, UPSTREAM)


def _todays_patches() -> tuple[bool, str]:
    missing = absent("torch", "megatron.core")
    if missing:  # no release to judge: TODAYS answers no (through _importable), not "not needed"
        return False, missing
    answer = _route()
    return not answer.ok, (
        f"{UPSTREAM}: {answer.reason}" if answer.ok else f"patched: today's patches carry it ({answer.reason})"
    )


#: the native route's patches are ``not_needed_when(TODAYS)``: a release without the RL mode needs none of them
#: (``doctor`` counts them as fine there, as today's replacements on 0.19.2)
def _importable() -> tuple[bool, str]:
    missing = absent("torch", "megatron.core")  # found without importing; a source checkout has no metadata
    return (False, missing) if missing else (True, "torch and megatron.core can be imported")


TODAYS = check(_importable, "torch and megatron.core can be imported") & not_needed_when(
    check(_todays_patches, "upstream has no RL mode with mtp_detach_heads here")
)
_NATIVE: list[bool] = []


def native() -> bool:
    """Whether this release takes the native route (the probe's answer, read once until ``patchreg.refresh()``)."""
    if not _NATIVE:
        _NATIVE.append(NATIVE.evaluate().ok)
    return _NATIVE[0]


on_refresh(_NATIVE.clear)


def route_of(newest: Any) -> str | None:
    """How a block's newest MTP loss (its entry in ``last_losses``, None: no step yet) was computed: ``UPSTREAM`` on
    the native route (every call of a model in the block runs upstream's body), None before a step or elsewhere."""
    return UPSTREAM if newest is not None and native() else None


def rl_mode_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Upstream's forward with ``labels=None`` (logits back); the user's labels and mask kept for the MTP loss.

    Installed as a method on the model instance that calls the class's own ``forward`` (not a ``wrap``: a
    ``wrapt`` proxy on an instance holds the bound method of that instance, so ``copy.deepcopy(model)`` inside
    the block would fail, or a copy would call the original model)."""
    model, wrapped = self, type(self).forward.__get__(self, type(self))
    a = binder(type(model).forward).bind(model, args, kwargs)
    if in_inference(model, a):
        return wrapped(*args, **kwargs)
    labels, mask = a["labels"], a.get("loss_mask")
    call = {**a, "labels": None}
    processor = a.get("output_processor")
    if processor is not None:  # GPTModel 0.18+: the user's hook sees the user's labels and mask, as before
        call["output_processor"] = _user_view(processor, labels, mask)
    return run_in_block(Call(model, labels, mask, False), wrapped, call)  # (the loss reads the flag, not detach)


def _user_view(processor: Any, labels: Any, mask: Any) -> Any:
    def with_user_labels(**kwargs: Any) -> Any:
        return processor(**{**kwargs, "labels": labels, "loss_mask": mask})

    return with_user_labels


def rl_mode_mtp_loss(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A model in the block: upstream's ``process_mtp_loss`` on the user's labels and label-aligned mask (its label
    mode: exact for any labels, nothing to check per call); the user's own ``labels=None`` call as upstream's RL
    mode; any other model's call: upstream's, untouched."""
    kwargs, call = call_in_block(wrapped, args, kwargs)
    if call is None:
        return wrapped(**kwargs)
    model, labels, mask = call.model, call.labels, call.loss_mask
    ids = kwargs.get("input_ids")
    if labels is None and ids is None:
        return wrapped(**kwargs)  # nothing to derive labels from: no MTP loss, as upstream
    import torch

    packed, context = kwargs.get("packed_seq_params"), kwargs.get("sequence_roll_context")
    cp_group = kwargs.get("cp_group")  # the group upstream's own rolls use (0.17+ pass it)
    cp_group = mtp_cp_group(packed, process_groups(model)[0]) if cp_group is None else cp_group
    rolled = labels is None
    if rolled:  # the user's own RL mode: the labels from input_ids, the mask aligned with them
        label_mask = rolls((torch.ones_like(ids) if mask is None else mask,), cp_group, packed, context, _MASK)[0]
    else:  # upstream's label mode: without a mask it trains every label (rolled per depth)
        label_mask = torch.ones_like(labels) if mask is None else mask
    kwargs = {**kwargs, "labels": labels, "loss_mask": mask}
    return _upstream_loss(wrapped, kwargs, model, (label_mask, cp_group, packed, context, int(rolled)))


def _upstream_loss(wrapped: Any, kwargs: dict[str, Any], model: Any, rolling: tuple[Any, Any, Any, Any, int]) -> Any:
    """Upstream's ``process_mtp_loss`` with ``kwargs``; the per-depth losses recorded from its own per-token losses
    under ``rolling``: the label-aligned mask and how upstream rolls it once per depth (CP group, pack, roll context,
    the rolls it had before)."""
    per_token: list[Any] = []
    compute = kwargs["compute_language_model_loss"]

    def observed(labels: Any, logits: Any) -> Any:
        loss = compute(labels, logits)
        per_token.append(loss)
        return loss

    hidden = wrapped(**{**kwargs, "compute_language_model_loss": observed})
    mask, cp_group, packed = rolling[:3]
    if packed is None and (cp_group is None or cp_group.size() <= 1):  # a roll of torch's alone: when first read
        last_losses.record(model, Deferred(per_token, mask))
    else:  # now: the roll exchanges chunk boundaries across CP ranks, or reads the pack (and its fix-up)
        last_losses.record(model, masked_means(per_token, *rolling))
    return hidden


HEADS_DETACHED = Patch(
    "mtp_detach_heads",
    "config.mtp_detach_heads",
    True,
    kind="value",
    when=TODAYS,
    doc="upstream's mtp_detach_heads for the block: the MTP loss reaches neither embedding, decoder nor head",
)

HEADS_ATTACHED = Patch(
    "mtp_heads_attached",
    "config.mtp_detach_heads",
    False,
    kind="value",
    when=TODAYS,
    doc="mtp_detach_heads off for the block: the MTP loss trains the trunk too, as pretraining does",
)

RL_MODE_FORWARD = Patch(
    "rl_mode_forward",
    "forward",
    rl_mode_forward,
    when=TODAYS,
    doc="upstream's forward with labels=None (logits back); the user's labels and mask kept for the MTP loss",
)

RL_MODE_MTP_LOSS = Patch(
    "rl_mode_mtp_loss",
    f"{GPT}:process_mtp_loss",
    rl_mode_mtp_loss,
    kind="wrap",
    when=TODAYS & has(f"{GPT}:process_mtp_loss"),
    doc="a model in the block: upstream's process_mtp_loss on the user's labels and mask (its label mode)",
    verified=GPT_MTP_LOSS_BODY,
)

RL_MODE_HYBRID_MTP_LOSS = Patch(
    "rl_mode_hybrid_mtp_loss",
    f"{HYBRID}:process_mtp_loss",
    rl_mode_mtp_loss,
    kind="wrap",
    when=TODAYS & has(f"{HYBRID}:process_mtp_loss"),
    doc="as rl_mode_mtp_loss, for HybridModel",
    verified=HYBRID_MTP_LOSS_BODY,
)

#: the native route's patches (the rest of a set, where this route is taken, is skipped as natively covered)
NATIVE_ROUTE = frozenset(p.name for p in (HEADS_DETACHED, HEADS_ATTACHED, RL_MODE_FORWARD, RL_MODE_MTP_LOSS,
                                           RL_MODE_HYBRID_MTP_LOSS))  # fmt: skip


def route_lines(entries: Any, skipped: Any) -> list[str]:
    """Which way each patch of a block's set went here, and why (for ``str(MTPReport)``): one line naming what
    ``upstream does this natively here`` (today's replacements skipped as natively covered; the reasons are the
    engine's skip lines) and the native route's installs that hand the block to upstream's RL mode, then one
    ``<name>: patched: <reason>`` line per patch that replaces an upstream body."""
    answer = NATIVE.evaluate()
    routed, lines = [], []
    for name in dict.fromkeys(entry.patch for entry in entries):
        if name in NATIVE_ROUTE:
            routed.append(name)
        else:
            lines.append(f"{name}: patched: {_WHY.get(name, answer.reason)}")
    natively = [name for name, reason in dict(skipped).items() if name not in NATIVE_ROUTE and UPSTREAM in reason]
    if not natively and not routed:
        return lines
    via = f" ({', '.join(routed)}: installed, they hand the block to upstream's RL mode)" if routed else ""
    return [f"{UPSTREAM}: {', '.join(natively) or 'the MTP loss'}{via}", *lines]


_WHY: dict[str, str] = {"checkpointed_forward": "upstream's MTP recompute is broken on this release"}
