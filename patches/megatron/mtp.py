"""Multi-Token Prediction for PPO/RL training on Megatron-Core: ``with mtp_patched(model): ...``.

Inside the block the model returns logits ``[b, s, vocab/tp]`` (never the LM loss) and, when
labels are given, the MTP loss rides on the graph through ``MTPLossAutoScaler``; after it the
model is the upstream model again. Three patches, each gated per release by its predicate:

- ``postprocess`` / ``postprocess_detached`` (the model's ``_postprocess``)
- ``detach_embeddings`` (each MTP layer's ``_get_embeddings``; ``detach_encoder=True`` only)
- ``checkpointed_forward`` (each MTP layer's ``_checkpointed_forward``, where upstream recompute is broken)
"""

from __future__ import annotations

from typing import Any

import patchreg
from patches.megatron._compat import GPT, MTP, mcore_version, parameters, upstream
from patches.megatron._layers import checkpointed_forward, get_embeddings_detached
from patches.megatron._loss import last_losses
from patches.megatron._postprocess import postprocess, postprocess_detached
from patches.megatron.errors import MTPConflictError, UnsupportedModelError
from patchreg import Patch, PatchConflictError, PatchSet, accepts, check, has, not_needed_when, requires

__all__ = [
    "CHECKPOINTED_FORWARD",
    "DETACH_EMBEDDINGS",
    "MTP_DETACH_SET",
    "MTP_SET",
    "POSTPROCESS",
    "POSTPROCESS_DETACHED",
    "MTPReport",
    "mtp_patched",
]


_POSTPROCESS_PATH = f"{GPT}:GPTModel._postprocess"
_LAYER = f"{MTP}:MultiTokenPredictionLayer"

_POSTPROCESS_WHEN = (
    requires("megatron-core>=0.13")
    & has(f"{MTP}:MTPLossAutoScaler")
    & accepts(_POSTPROCESS_PATH, "hidden_states", "labels", "loss_mask", "mtp_in_postprocess")
)

POSTPROCESS = Patch(
    "postprocess",
    "_postprocess",
    postprocess,
    when=_POSTPROCESS_WHEN,
    doc="return logits [b, s, vocab/tp]; MTP loss (clamped, scaled) attached via MTPLossAutoScaler",
)

POSTPROCESS_DETACHED = Patch(
    "postprocess_detached",
    "_postprocess",
    postprocess_detached,
    when=_POSTPROCESS_WHEN,
    doc="as postprocess; MTP sees detached decoder states and a detached output head",
)

DETACH_EMBEDDINGS = Patch(
    "detach_embeddings",
    "mtp.layers[*]._get_embeddings",
    get_embeddings_detached,
    when=has(f"{_LAYER}._get_embeddings"),  # 0.13: absent; the postprocess patch detaches the embeddings itself
    doc="MTP layers embed the shifted tokens without gradient to the embedding",
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
)

MTP_SET = PatchSet("megatron-mtp", (POSTPROCESS, CHECKPOINTED_FORWARD), doc="MTP for PPO; trunk trained by MTP")
MTP_DETACH_SET = PatchSet(
    "megatron-mtp-detached",
    (POSTPROCESS_DETACHED, DETACH_EMBEDDINGS, CHECKPOINTED_FORWARD),
    doc="MTP for PPO; only MTP layers trained by the MTP loss",
)


class MTPReport:
    """What ``mtp_patched`` installed or skipped, and the per-depth MTP losses of the last step."""

    __slots__ = ("_after", "_losses", "_models", "active", "detach_encoder", "report")

    def __init__(self, report: patchreg.Report, detach_encoder: bool, models: list[Any] | None = None) -> None:
        self.report = report
        self.detach_encoder = detach_encoder
        self.active = True
        self._models = models or []  # held while the block is active
        self._after = last_losses.count  # steps numbered after this one belong to the block
        self._losses: tuple[Any, ...] = ()

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
            newest = last_losses.newest(self._models, self._after)
            if newest is not None:
                self._losses = newest[1]
        return self._losses

    def _close(self) -> None:
        """The block ended: keep the losses of its last step, let go of the models."""
        if last_losses.count != self._after:  # a step ran since the block began
            self._losses = self.mtp_loss_tensors
        self.active = False
        self._models = []

    def __str__(self) -> str:
        state = "active" if self.active else "reverted"
        head = f"mtp_patched(detach_encoder={self.detach_encoder}) on megatron-core {mcore_version()} ({state})"
        losses = ", ".join(f"depth {i + 1}: {loss:.4f}" for i, loss in enumerate(self.mtp_losses))
        lines = [
            head,
            f"  patch set {self.report.name!r}: {self.installed} newly installed, {len(self.skipped)} skipped",
        ]
        lines += [f"  held     {e.patch:<24} {e.holder}.{e.attr}" for e in self.entries]
        lines += [f"  skipped  {name:<24} {reason}" for name, reason in self.skipped]
        return "\n".join([*lines, f"  mtp losses (last step): {losses or 'none yet'}"])

    def __repr__(self) -> str:
        return f"<MTPReport detach_encoder={self.detach_encoder} {self.report!r} mtp_losses={self.mtp_losses}>"


_HAS_GPT = has(f"{GPT}:GPTModel")
_GPT_CLASS: list[Any] = []  # GPTModel, once imported


def language_models(model: Any) -> list[Any]:
    """The GPTModels in ``model``: itself, through ``.module``/``.language_model``, or in a list of chunks."""
    gpt_cls = _GPT_CLASS[0] if _GPT_CLASS else _gpt_class()
    if gpt_cls is not None and isinstance(model, gpt_cls):
        return [model]
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    found = [m for m in (_find_gpt(chunk, gpt_cls) for chunk in chunks) if m is not None]
    if not found:
        msg = (
            f"mtp_patched needs a Megatron-Core GPTModel, a wrapper of one (.module, .language_model) or a list of "
            f"model chunks; got {type(model).__qualname__!r} (megatron-core {mcore_version()}). Pass the model "
            "your training step calls."
        )
        raise UnsupportedModelError(msg, target=type(model).__qualname__)
    return found


def _gpt_class() -> Any:
    if not _HAS_GPT.evaluate().ok:
        return None
    from megatron.core.models.gpt.gpt_model import GPTModel

    _GPT_CLASS.append(GPTModel)
    return GPTModel


def _find_gpt(obj: Any, gpt_cls: Any) -> Any:
    seen: list[Any] = []
    while gpt_cls and obj is not None and not any(obj is s for s in seen):
        if isinstance(obj, gpt_cls):
            return obj
        seen.append(obj)
        inner = getattr(obj, "module", None)
        obj = inner if inner is not None else getattr(obj, "language_model", None)
    return None


class mtp_patched(patchreg.Patched[MTPReport]):
    """Context manager (and decorator): the MTP patch set on ``model`` for the duration of a block.

    ``detach_encoder=True``: the MTP loss trains only the MTP layers (zero gradient to the
    embedding, the decoder and the output layer); ``False``: it trains the trunk too, as
    Megatron-Core pretraining does. Yields an :class:`MTPReport`. A :class:`patchreg.Patched` block:
    enters nest and are per thread, and misuse (exit twice, exit without enter) is handled there.
    """

    __slots__ = ("detach_encoder", "model", "patch_set")

    def __init__(
        self,
        model: Any,
        detach_encoder: bool = False,
        *,
        registry: patchreg.Registry | None = None,
        strict: bool = False,
    ) -> None:
        self.model = model
        self.detach_encoder = bool(detach_encoder)
        self.patch_set = MTP_DETACH_SET if self.detach_encoder else MTP_SET
        super().__init__(registry if registry is not None else patchreg.registry, self.patch_set, model, strict)

    def open(self) -> tuple[patchreg.Report, MTPReport]:
        models = language_models(self.model)
        try:  # the GPTModels themselves: what the selectors find through any wrapper, without the walk
            report = self.registry.apply(self.patch_set, models[0] if len(models) == 1 else models, strict=self.strict)
        except PatchConflictError as exc:
            raise self._conflict(exc) from exc
        return report, MTPReport(report, self.detach_encoder, models)

    def close(self, value: MTPReport) -> None:
        value._close()

    def fresh(self) -> mtp_patched:
        return mtp_patched(self.model, self.detach_encoder, registry=self.registry, strict=self.strict)

    def _conflict(self, exc: PatchConflictError) -> MTPConflictError:
        other = not self.detach_encoder
        msg = (
            f"mtp_patched(detach_encoder={self.detach_encoder}) cannot be entered while "
            f"mtp_patched(detach_encoder={other}) (or another replacement of _postprocess) is active on this "
            f"model; exit that block first or use one detach_encoder value. Engine: {exc}"
        )
        return MTPConflictError(msg, patch=exc.patch, target=exc.target)

    def __repr__(self) -> str:
        return f"mtp_patched({type(self.model).__qualname__}, detach_encoder={self.detach_encoder})"
