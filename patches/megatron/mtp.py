"""Multi-Token Prediction for PPO/RL training on Megatron-Core: ``with mtp_patched(model): ...``.

Inside the block the model returns logits ``[b, s, vocab/tp]`` (never the LM loss) and, when
labels are given (or, on releases with upstream's RL mode, 0.19+, derived from ``input_ids`` with
``labels=None``), the MTP loss rides on the graph through ``MTPLossAutoScaler``; after it the
model is the upstream model again. On releases with upstream's RL mode and ``mtp_detach_heads`` (0.19.2,
probed) the block installs no reimplementation of an upstream body: ``mtp_detach_heads`` / ``mtp_heads_attached``
(the config flag, a value), ``rl_mode_forward`` and ``rl_mode_mtp_loss`` / ``rl_mode_hybrid_mtp_loss``
(:mod:`patches.megatron._native`: upstream's ``labels=None`` forward, its ``process_mtp_loss`` on the user's
labels), and the patches below are skipped as natively covered. Elsewhere, each gated per release:

- GPTModel: ``postprocess`` / ``postprocess_detached`` (the model's ``_postprocess``)
- HybridModel / MambaModel 0.17: ``hybrid_forward`` / ``hybrid_forward_detached`` (the model's
  ``forward``), ``hybrid_mtp_loss`` / ``mamba_mtp_loss`` (a wrap of ``process_mtp_loss`` as the
  model's module imported it; other models' calls pass through), ``mtp_input_detached`` (the MTP
  block's ``forward``; ``detach_encoder=True`` only)
- both: ``detach_embeddings`` (each MTP layer's ``_get_embeddings``; ``detach_encoder=True`` only)
  and ``checkpointed_forward`` (each MTP layer's ``_checkpointed_forward``, where upstream recompute is broken)
- fix-ups of upstream bugs that give wrong numbers silently, gated by a probe of upstream's behaviour and
  applied by the patched forwards around a forward that needs them: ``packed_padded_roll`` (a wrap of
  ``roll_tensor``: padded packed sequences roll on their padded boundaries); alone in ``MTP_FIXUPS_SET``
  for users of upstream's own MTP
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from typing import Any, cast

import patchreg
from patches.megatron._compat import GPT, MTP, mcore_version, parameters, upstream
from patches.megatron._fixups import MTP_FIXUPS_SET, PACKED_PADDED_ROLL, fixup_lines
from patches.megatron._hybrid import (
    hybrid_forward,
    hybrid_forward_detached,
    mtp_block_forward_detached,
    process_mtp_loss_in_block,
)
from patches.megatron._layers import checkpointed_forward, get_embeddings_detached
from patches.megatron._loss import Deferred, last_losses, resolved
from patches.megatron._models import GPT_FAMILY, HYBRID, HYBRID_FAMILY, MAMBA, language_models, model_family
from patches.megatron._native import (
    HEADS_ATTACHED,
    HEADS_DETACHED,
    RL_MODE_FORWARD,
    RL_MODE_HYBRID_MTP_LOSS,
    RL_MODE_MTP_LOSS,
    natively_covered,
    route_lines,
    route_of,
)
from patches.megatron._postprocess import calls_known, postprocess, postprocess_detached
from patches.megatron._verified import (
    CHECKPOINTED_FORWARD_BODY,
    GET_EMBEDDINGS_BODY,
    HYBRID_FORWARD_BODY,
    HYBRID_MTP_LOSS_BODY,
    MAMBA_MTP_LOSS_BODY,
    MTP_BLOCK_FORWARD_BODY,
    POSTPROCESS_BODY,
)
from patches.megatron.errors import MTPConflictError
from patchreg import Patch, PatchConflictError, PatchSet, accepts, check, has, not_needed_when, requires

__all__ = [
    "CHECKPOINTED_FORWARD",
    "HEADS_ATTACHED",
    "HEADS_DETACHED",
    "DETACH_EMBEDDINGS",
    "HYBRID_FORWARD",
    "HYBRID_FORWARD_DETACHED",
    "HYBRID_MTP_DETACH_SET",
    "HYBRID_MTP_LOSS",
    "HYBRID_MTP_SET",
    "MAMBA_MTP_LOSS",
    "MTP_DETACH_SET",
    "MTP_FIXUPS_SET",
    "MTP_INPUT_DETACHED",
    "PACKED_PADDED_ROLL",
    "MTP_SET",
    "POSTPROCESS",
    "POSTPROCESS_DETACHED",
    "RL_MODE_FORWARD",
    "RL_MODE_HYBRID_MTP_LOSS",
    "RL_MODE_MTP_LOSS",
    "MTPBlock",
    "MTPReport",
    "mtp_patched",
]

logger = logging.getLogger("patchreg")
_WIDTH = 100  # columns of str(report), as the engine's own reports

_POSTPROCESS_PATH = f"{GPT}:GPTModel._postprocess"
_LAYER = f"{MTP}:MultiTokenPredictionLayer"

# On releases with upstream's RL mode and mtp_detach_heads (0.19.2) the native route's patches
# (patches.megatron._native) take over, and each replacement below is skipped as natively covered.
_PATCHED = not_needed_when(natively_covered)

_POSTPROCESS_WHEN = (
    _PATCHED
    & requires("megatron-core>=0.13")
    & has(f"{MTP}:MTPLossAutoScaler")
    & accepts(_POSTPROCESS_PATH, "hidden_states", "labels", "loss_mask", "mtp_in_postprocess")
    & check(calls_known, "the patched postprocess can call the MTP block")  # else refused at the block's entry
)

POSTPROCESS = Patch(
    "postprocess",
    "_postprocess",
    postprocess,
    when=_POSTPROCESS_WHEN,
    doc="return logits [b, s, vocab/tp]; MTP loss (clamped, scaled) attached via MTPLossAutoScaler",
    verified=POSTPROCESS_BODY,
)

POSTPROCESS_DETACHED = Patch(
    "postprocess_detached",
    "_postprocess",
    postprocess_detached,
    when=_POSTPROCESS_WHEN,
    doc="as postprocess; MTP sees detached decoder states and a detached output head",
    verified=POSTPROCESS_BODY,
)

DETACH_EMBEDDINGS = Patch(
    "detach_embeddings",
    "mtp.layers[*]._get_embeddings",
    get_embeddings_detached,
    when=_PATCHED
    & has(f"{_LAYER}._get_embeddings"),  # 0.13: absent; the postprocess patch detaches the embeddings itself
    doc="MTP layers embed the shifted tokens without gradient to the embedding",
    verified=GET_EMBEDDINGS_BODY,
)


def _recompute_is_broken() -> tuple[bool | None, str]:
    """Whether this release's MTP recompute needs the patch, and why (read from the signatures); None: cannot tell."""
    try:
        layer = upstream(MTP, "MultiTokenPredictionLayer")
    except ImportError as exc:
        return None, f"megatron-core cannot be imported ({exc})"
    if layer is None or not hasattr(layer, "_checkpointed_forward"):
        return False, "MultiTokenPredictionLayer has no _checkpointed_forward (no MTP recompute on this release)"
    takes = parameters(layer._checkpointed_forward)[0]
    if "forward_func" in takes:
        return True, "_checkpointed_forward(forward_func, *args, **kwargs) checkpoints non-tensor arguments"
    if "padding_mask" in parameters(layer.forward)[0] and "padding_mask" not in takes:
        return True, "forward passes padding_mask=, which _checkpointed_forward does not take (TypeError)"
    return False, "_checkpointed_forward takes every argument and saves only tensors (fixed upstream)"


def _recompute_is_fixed() -> tuple[bool, str]:
    """Whether :func:`_recompute_is_broken` says fixed, for ``not_needed_when`` (not when it cannot tell)."""
    broken, reason = _recompute_is_broken()
    return broken is False, reason


CHECKPOINTED_FORWARD = Patch(
    "checkpointed_forward",
    "mtp.layers[*]._checkpointed_forward",
    checkpointed_forward,
    when=requires("megatron-core>=0.14")
    & has(f"{_LAYER}._checkpointed_forward")
    & not_needed_when(check(_recompute_is_fixed, "MTP recompute is fixed upstream")),
    doc="MTP recompute saves only tensors and passes every argument (padding_mask included)",
    verified=CHECKPOINTED_FORWARD_BODY,
)

# Fix-ups of upstream bugs that give wrong numbers without raising (patches.megatron._fixups): declared there,
# applied by the patched forwards of every set below around a forward that needs them, and alone by
# MTP_FIXUPS_SET for users of upstream's own RL mode.
# Each set holds both routes, gated so that one installs: upstream's RL mode (a config value and two wraps)
# where the release has it, today's replacements elsewhere.
MTP_SET = PatchSet(
    "megatron-mtp",
    (HEADS_ATTACHED, RL_MODE_FORWARD, RL_MODE_MTP_LOSS, POSTPROCESS, CHECKPOINTED_FORWARD),
    doc="MTP for PPO; trunk trained by MTP",
)
MTP_DETACH_SET = PatchSet(
    "megatron-mtp-detached",
    (HEADS_DETACHED, RL_MODE_FORWARD, RL_MODE_MTP_LOSS, POSTPROCESS_DETACHED, DETACH_EMBEDDINGS, CHECKPOINTED_FORWARD),
    doc="MTP for PPO; only MTP layers trained by the MTP loss",
)

# HybridModel (0.18+) and MambaModel 0.17: MTP and its loss are inline in forward (no _postprocess).
_HYBRID_FORWARD_WHEN = (
    _PATCHED
    & has(f"{MTP}:MTPLossAutoScaler")
    & accepts(f"{MTP}:process_mtp_loss", "hidden_states", "labels", "loss_mask", "compute_language_model_loss")
)

HYBRID_FORWARD = Patch(
    "hybrid_forward",
    "forward",
    hybrid_forward,
    when=_HYBRID_FORWARD_WHEN,
    doc="return logits [b, s, vocab/tp] (upstream forward with labels=None); the labels go to the MTP loss",
    verified=HYBRID_FORWARD_BODY,
)

HYBRID_FORWARD_DETACHED = Patch(
    "hybrid_forward_detached",
    "forward",
    hybrid_forward_detached,
    when=_HYBRID_FORWARD_WHEN,
    doc="as hybrid_forward; the MTP loss reaches neither the embedding, the decoder nor the output head",
    verified=HYBRID_FORWARD_BODY,
)


def _hybrid_loss_not_needed() -> tuple[bool, str]:
    """Before 0.18 there is no HybridModel; MambaModel 0.17 calls its own module's process_mtp_loss."""
    if has(f"{HYBRID}:HybridModel").evaluate().ok:
        return False, "HybridModel.forward calls hybrid_model's process_mtp_loss"
    if has(f"{MAMBA}:process_mtp_loss").evaluate().ok:
        return True, "no HybridModel before megatron-core 0.18; MambaModel calls mamba_model's (mamba_mtp_loss)"
    return False, "no HybridModel on this release"


HYBRID_MTP_LOSS = Patch(
    "hybrid_mtp_loss",
    f"{HYBRID}:process_mtp_loss",
    process_mtp_loss_in_block,
    kind="wrap",
    when=not_needed_when(check(_hybrid_loss_not_needed, "MambaModel 0.17 has its own process_mtp_loss"))
    & _PATCHED
    & has(f"{HYBRID}:process_mtp_loss"),
    doc="a model inside mtp_patched gets our MTP loss (its labels and mask, or RL mode); others upstream's",
    verified=HYBRID_MTP_LOSS_BODY,
)


def _mamba_loss_not_needed() -> tuple[bool, str]:
    """From 0.18 MambaModel is a HybridModel, whose forward calls hybrid_model's process_mtp_loss."""
    if has(f"{HYBRID}:HybridModel").evaluate().ok:
        return True, "MambaModel is a HybridModel on this release (hybrid_mtp_loss covers it)"
    return False, "MambaModel.forward calls mamba_model's own process_mtp_loss (0.17)"


MAMBA_MTP_LOSS = Patch(
    "mamba_mtp_loss",
    f"{MAMBA}:process_mtp_loss",
    process_mtp_loss_in_block,
    kind="wrap",
    when=not_needed_when(check(_mamba_loss_not_needed, "MambaModel is a HybridModel"))
    & has(f"{MAMBA}:process_mtp_loss"),
    doc="as hybrid_mtp_loss, for MambaModel 0.17",
    verified=MAMBA_MTP_LOSS_BODY,
)

MTP_INPUT_DETACHED = Patch(
    "mtp_input_detached",
    "mtp.forward",
    mtp_block_forward_detached,
    when=_HYBRID_FORWARD_WHEN,
    doc="the MTP block runs on detached decoder states; the main states keep their graph",
    verified=MTP_BLOCK_FORWARD_BODY,
)

HYBRID_MTP_SET = PatchSet(
    "megatron-mtp-hybrid",
    (
        HEADS_ATTACHED,
        RL_MODE_FORWARD,
        RL_MODE_HYBRID_MTP_LOSS,
        HYBRID_FORWARD,
        HYBRID_MTP_LOSS,
        MAMBA_MTP_LOSS,
        CHECKPOINTED_FORWARD,
    ),
    doc="MTP for PPO on HybridModel / MambaModel 0.17; trunk trained by MTP",
)
HYBRID_MTP_DETACH_SET = PatchSet(
    "megatron-mtp-hybrid-detached",
    (HEADS_DETACHED, RL_MODE_FORWARD, RL_MODE_HYBRID_MTP_LOSS, HYBRID_FORWARD_DETACHED, HYBRID_MTP_LOSS,
     MAMBA_MTP_LOSS, MTP_INPUT_DETACHED, DETACH_EMBEDDINGS, CHECKPOINTED_FORWARD),
    doc="MTP for PPO on HybridModel / MambaModel 0.17; only MTP layers trained by the MTP loss",
)  # fmt: skip

_SETS = {(GPT_FAMILY, False): MTP_SET, (GPT_FAMILY, True): MTP_DETACH_SET}
_SETS.update({(HYBRID_FAMILY, False): HYBRID_MTP_SET, (HYBRID_FAMILY, True): HYBRID_MTP_DETACH_SET})
patchreg.essential(
    POSTPROCESS, POSTPROCESS_DETACHED, HYBRID_FORWARD, HYBRID_FORWARD_DETACHED
)  # PATCHREG_DISABLE: refuse
patchreg.essential(HEADS_ATTACHED, HEADS_DETACHED, RL_MODE_FORWARD, RL_MODE_MTP_LOSS, RL_MODE_HYBRID_MTP_LOSS)


def patch_set_for(models: list[Any], detach_encoder: bool) -> PatchSet:
    """The patch set for ``models`` (found by :func:`language_models`: one family) and ``detach_encoder``."""
    return _SETS[model_family(models), detach_encoder]


class MTPReport:
    """What ``mtp_patched`` installed or skipped, and the per-depth MTP losses of the last step.

    The block makes one at each enter (what ``with mtp_patched(model) as report:`` binds); what it shows is built
    when it is read. It is not built by hand.
    """

    __slots__ = ("_after", "_cls", "_has_mtp", "_losses", "_models", "_route", "active", "detach_encoder", "report")

    def __init__(self, report: patchreg.Report, block: MTPBlock) -> None:
        self.report = report  #: the engine's report of the block's apply
        self.detach_encoder = block.detach_encoder
        self.active = True  #: True while the block is entered
        self._models: Sequence[Any] = block.models  # held while the block is active
        self._has_mtp = block.has_mtp
        self._after = last_losses.count  # steps numbered after this one belong to the block
        self._losses: tuple[Any, ...] | Deferred = ()
        self._route: str | None = None
        self._cls: type | None = None  # the models' class, kept once they are let go

    @property
    def model_class(self) -> str:
        """The class name of the model (or chunks) the block patched."""
        return (self._cls or type(self._models[0])).__name__

    @property
    def note(self) -> str:
        """Set when no model (chunk) holds MTP layers: it returns logits and computes no MTP loss here."""
        return "" if self._has_mtp else _no_mtp_text(self.model_class)

    @property
    def installed(self) -> int:
        """How many installs this block made (shared ones with an outer block count 0)."""
        return self.report.installed

    @property
    def skipped(self) -> tuple[tuple[str, str], ...]:
        """``(patch name, reason)`` for each patch not installed on this release or model."""
        return self.report.skipped

    @property
    def entries(self) -> tuple[patchreg.Installed, ...]:
        """The installs this block holds (after the block: what it held, marked "reverted")."""
        return self.report.entries

    @property
    def mtp_losses(self) -> tuple[float, ...]:
        """Per-depth MTP loss (masked mean cross-entropy, unscaled) of the last forward with labels."""
        return tuple(float(loss) for loss in self.mtp_loss_tensors)

    @property
    def mtp_loss_tensors(self) -> tuple[Any, ...]:
        """The same losses as detached tensors (no device sync)."""
        if self.active:
            self._take_newest()
        losses = self._losses = resolved(self._losses)
        return losses

    @property
    def last_route(self) -> str | None:
        """How the newest MTP loss of the block's models was computed (0.19.2+: ``upstream does this natively
        here``); None on releases without the native route or before a step."""
        return route_of(last_losses.newest(self._models, self._after)) if self.active else self._route

    def _take_newest(self) -> Any:
        """The newest losses of the block's models since it began (None: no step yet), kept as the block's."""
        newest = last_losses.newest(self._models, self._after)
        if newest is not None:
            self._losses = newest[1]  # (computed when read, if deferred)
        return newest

    def _close(self) -> None:
        """The block ended: keep the losses of its last step, let go of the models."""
        if last_losses.count != self._after:  # a step ran since the block began (its route is numbered after it)
            self._route = route_of(self._take_newest())
        self._cls = type(self._models[0])
        self.active = False
        self._models = ()

    def __str__(self) -> str:
        state = "active" if self.active else "reverted"
        head = (
            f"mtp_patched(detach_encoder={self.detach_encoder}) on {self.model_class}, "
            f"megatron-core {mcore_version()} ({state})"
        )
        losses = ", ".join(f"depth {i + 1}: {loss:.4f}" for i, loss in enumerate(self.mtp_losses))
        lines = [head, str(self.report)]  # the engine's lines: each install, skip (why) and upstream body check
        lines += textwrap.wrap(f"note: {self.note}", _WIDTH, subsequent_indent="  ") if self.note else []
        for line in [*route_lines(self.report.entries, self.report.skipped), *fixup_lines()]:
            lines += textwrap.wrap(line, _WIDTH, subsequent_indent="  ")
        route = f" ({self.last_route})" if self.last_route is not None else ""  # 0.19.2+: which way, per call
        last = textwrap.wrap(f"mtp losses (last step): {losses or 'none yet'}{route}", _WIDTH, subsequent_indent="  ")
        return "\n".join([*lines, *last])

    def __repr__(self) -> str:
        return f"<MTPReport detach_encoder={self.detach_encoder} {self.report!r} mtp_losses={self.mtp_losses}>"


_LOGGED_NO_MTP: list[bool] = []  # the no-MTP note is logged once per process


def _has_mtp(models: Sequence[Any]) -> bool:
    """Whether any of ``models`` holds an MTP block (nn.Modules: read from ``_modules``, no ``__getattr__``)."""
    for model in models:  # noqa: SIM110 (a loop: it runs at every enter, where a generator costs a frame)
        if model._modules.get("mtp") is not None:
            return True
    return False


def _no_mtp_text(model_class: str) -> str:
    """The note for models of ``model_class`` that hold no MTP block."""
    return (
        f"no MTP layers in this {model_class} (no .mtp block on this model or chunk): it returns logits "
        "and computes no MTP loss here. That is normal for a pipeline stage without MTP; to train MTP, build the "
        "model with mtp_num_layers (GPTModel) or an MTP layer pattern such as '*-*-/*-' (HybridModel)."
    )


class MTPBlock(patchreg.Patched[MTPReport]):
    """What :func:`mtp_patched` returns: a :class:`patchreg.Patched` block of the MTP patch set on a model.

    A context manager (the ``with`` statement binds an :class:`MTPReport`) and a decorator. Enters nest
    and are per thread, and misuse (exit twice, exit without enter) is handled there. ``MTPBlock(model, ...)``
    is :func:`mtp_patched`: the model's patch set is found when the block is made.
    """

    __slots__ = ("detach_encoder", "has_mtp", "models")

    detach_encoder: bool  #: the MTP loss trains only the MTP layers (see :func:`mtp_patched`)
    models: list[Any]  #: the models the block patches: the model itself, what its wrappers hold, or each chunk's
    has_mtp: bool  #: whether any of them holds MTP layers (a pipeline stage may not)

    def __init__(
        self,
        model: Any,
        detach_encoder: bool = False,
        *,
        registry: patchreg.Registry | None = None,
        strict: bool = False,
    ) -> None:
        models = self.models = language_models(model)  # refused here, naming the model, when unsupported
        self.detach_encoder = bool(detach_encoder)
        self.has_mtp = _has_mtp(models)
        target = patch_set_for(models, self.detach_encoder)
        super().__init__(patchreg.registry if registry is None else registry, target, model, strict)

    @property
    def model(self) -> Any:
        """The model (or chunks) the block patches: the block's object."""
        return self.obj

    @property
    def patch_set(self) -> PatchSet:
        """The patch set for this model and ``detach_encoder``: the block's target."""
        return cast(PatchSet, self.target)

    def open(self) -> patchreg.Report:
        """The apply of the block's set on its models themselves (what the selectors find through any wrapper)."""
        models, has_mtp = self.models, self.has_mtp
        if not has_mtp and not _LOGGED_NO_MTP:  # a pipeline stage without MTP layers: the report's note
            _LOGGED_NO_MTP.append(True)
            logger.info("mtp_patched: %s", _no_mtp_text(type(models[0]).__name__))
        target = models[0] if len(models) == 1 else models
        try:
            return self.registry.apply(self.target, target, strict=self.strict, warn=None if has_mtp else False)
        except PatchConflictError as exc:
            raise self._conflict(exc) from exc

    def value(self, report: patchreg.Report) -> MTPReport:
        return MTPReport(report, self)

    def close(self, value: MTPReport) -> None:
        """After an exit reverted: the report keeps the losses of the block's last step and lets go of the models."""
        value._close()

    def fresh(self) -> MTPBlock:
        return MTPBlock(self.model, self.detach_encoder, registry=self.registry, strict=self.strict)

    def _conflict(self, exc: PatchConflictError) -> MTPConflictError:
        other = not self.detach_encoder
        msg = (
            f"mtp_patched(detach_encoder={self.detach_encoder}) cannot be entered while "
            f"mtp_patched(detach_encoder={other}) (or another patch of _postprocess or config.mtp_detach_heads) is "
            "active on this "
            f"model; exit that block first or use one detach_encoder value. Engine: {exc}"
        )
        return MTPConflictError(msg, patch=exc.patch, target=exc.target)

    def __repr__(self) -> str:
        return f"mtp_patched({type(self.model).__qualname__}, detach_encoder={self.detach_encoder})"


def mtp_patched(
    model: Any, detach_encoder: bool = False, *, registry: patchreg.Registry | None = None, strict: bool = False
) -> MTPBlock:
    """Context manager (and decorator): the MTP patch set on ``model`` for the duration of a block.

    ``model``: a Megatron-Core ``GPTModel`` or ``HybridModel`` (``MambaModel`` 0.17), bare, under wrappers
    (``Float16Module``, DDP), or a list of virtual-pipeline chunks. ``detach_encoder=True``: the MTP loss
    trains only the MTP layers (zero gradient to the embedding, the decoder and the output layer);
    ``False``: it trains the trunk too, as Megatron-Core pretraining does. The block yields an
    :class:`MTPReport`; ``registry`` (default ``patchreg.registry``) holds the installs, and ``strict=True``
    refuses a patch whose target is missing instead of skipping it. An unsupported model is refused here,
    with an :class:`UnsupportedModelError` naming it.
    """
    return MTPBlock(model, detach_encoder, registry=registry, strict=strict)
