"""``verify_mtp(model, batch)``: does ``mtp_patched`` do on *this* model what it promises? The first thing to run
on a new architecture.

One forward and backward of the upstream model and one inside ``mtp_patched``, on the user's real model and
batch (GPU or CPU), in training mode, from the same RNG state. The report says whether:

- the logits equal upstream's main head (bit-equal, or the max diff);
- the per-depth MTP losses equal upstream's (read from upstream's own MTP tracker);
- with ``detach_encoder=True``, the trunk's gradient from the MTP loss is exactly 0;
- every MTP parameter got a finite, non-zero gradient from the MTP loss (the bugs of this kind: gradient
  leaks into the trunk, MTP parameters without gradient under recompute).

Gradients are taken with ``torch.autograd.grad`` (the main output x0, so only the MTP loss and any router
aux loss reach the parameters; the aux loss's share is taken out by a second patched step, from the same RNG
state, with the MTP loss scaled by 0): no ``.grad`` or ``main_grad`` is written, and no parameter (no optimizer step). Afterwards the model
is as it was found: parameters, buffers (a forward may update some, e.g. MoE routing statistics: restored in
place), ``.grad``, every module's training flag, the torch (and CUDA) RNG states and Megatron's RNG
tracker, upstream's MTP tracker and ``MTPLossAutoScaler``'s scale. Other global trackers a training forward
writes to (MoE aux-loss logging) are not restored. Call it outside ``mtp_patched``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import attrs

import patchreg
from patches.megatron._compat import MTP, mcore_version, upstream
from patches.megatron._loss import tracked_losses
from patches.megatron._models import language_models
from patches.megatron.errors import MTPPatchError

__all__ = ["MTPVerification", "verify_mtp"]


@attrs.frozen
class MTPVerification:
    """What :func:`verify_mtp` found; ``ok`` when every check holds. ``str()`` is the report."""

    model_class: str
    release: str
    detach_encoder: bool
    tolerance: float
    logits_max_diff: float  #: max |ours - upstream's| over the logits (0.0: bit-equal)
    mtp_losses: tuple[float, ...]  #: per depth, inside mtp_patched (report.mtp_losses)
    upstream_losses: tuple[float, ...]  #: per depth, as upstream logged them to its MTP tracker
    trunk_grad_max: float  #: max |gradient| the MTP loss gave any trunk parameter
    trunk_params: int
    mtp_params: int
    mtp_without_grad: tuple[str, ...]  #: MTP parameters whose MTP-loss gradient is all zero (or absent)
    mtp_not_finite: tuple[str, ...]  #: MTP parameters with a non-finite gradient
    mtp_grads_vs_upstream: float  #: max |ours - upstream's| over the MTP parameters' gradients
    upstream_error: str = ""  #: set when upstream's own step raised (then only ours was checked)

    @property
    def logits_equal(self) -> bool:
        """The logits equal upstream's within the tolerance (relative to their largest magnitude)."""
        return self.logits_max_diff <= self.tolerance

    @property
    def losses_equal(self) -> bool:
        """Each depth's MTP loss equals upstream's within the tolerance (relative)."""
        if self.upstream_error or len(self.mtp_losses) != len(self.upstream_losses) or not self.mtp_losses:
            return False
        return all(
            abs(a - b) <= self.tolerance * max(1.0, abs(b))
            for a, b in zip(self.mtp_losses, self.upstream_losses, strict=True)
        )

    @property
    def trunk_detached(self) -> bool:
        """With ``detach_encoder=True``: the MTP loss gave the trunk exactly zero gradient (True when False)."""
        return not self.detach_encoder or self.trunk_grad_max == 0.0

    @property
    def mtp_trained(self) -> bool:
        """Every MTP parameter got a finite, non-zero gradient from the MTP loss."""
        return not self.mtp_without_grad and not self.mtp_not_finite and self.mtp_params > 0

    @property
    def ok(self) -> bool:
        """Every check holds."""
        return self.logits_equal and self.losses_equal and self.trunk_detached and self.mtp_trained

    def __str__(self) -> str:
        def mark(good: bool) -> str:
            return "[ok]  " if good else "[FAIL]"

        depth = len(self.mtp_losses)
        lines = [
            f"verify_mtp: {self.model_class}, megatron-core {self.release}, detach_encoder={self.detach_encoder}, "
            f"{depth} MTP depth(s), training mode, tolerance {self.tolerance:g}"
        ]
        if self.upstream_error:
            lines.append(f"  [FAIL] upstream's own step raised: {self.upstream_error}")
        diff = "bit-equal" if self.logits_max_diff == 0.0 else f"max diff {self.logits_max_diff:.3g} (relative)"
        lines.append(f"  {mark(self.logits_equal)} logits equal upstream's main head: {diff}")
        pairs = ", ".join(
            f"depth {i + 1}: {a:.6f} vs {b:.6f} (diff {abs(a - b):.2g})"
            for i, (a, b) in enumerate(zip(self.mtp_losses, self.upstream_losses, strict=False))
        )
        lines.append(f"  {mark(self.losses_equal)} per-depth MTP loss equals upstream's: {pairs or 'none'}")
        if self.detach_encoder:
            lines.append(
                f"  {mark(self.trunk_detached)} trunk gradient from the MTP loss: max {self.trunk_grad_max:.3g} "
                f"over {self.trunk_params} parameters (must be exactly 0)"
            )
        else:
            lines.append(
                f"  [info] trunk gradient from the MTP loss: max {self.trunk_grad_max:.3g} over "
                f"{self.trunk_params} parameters (detach_encoder=False: the MTP loss trains the trunk)"
            )
        bad = [*(f"{n} (zero)" for n in self.mtp_without_grad), *(f"{n} (not finite)" for n in self.mtp_not_finite)]
        trained = self.mtp_params - len(set(self.mtp_without_grad) | set(self.mtp_not_finite))
        lines.append(
            f"  {mark(self.mtp_trained)} every MTP parameter got a finite, non-zero gradient: "
            f"{trained} of {self.mtp_params}" + (f"; not: {', '.join(bad)}" if bad else "")
        )
        if not self.upstream_error:
            lines.append(f"  [info] MTP gradients vs upstream's: max diff {self.mtp_grads_vs_upstream:.3g}")
        lines.append("  model restored: parameters, buffers, .grad, training mode, RNG states, MTP tracker")
        return "\n".join(lines)


def verify_mtp(
    model: Any,
    batch: Mapping[str, Any],
    detach_encoder: bool = False,
    *,
    tolerance: float = 1e-5,
    registry: patchreg.Registry | None = None,
) -> MTPVerification:
    """Check ``mtp_patched(model, detach_encoder)`` against upstream on ``model`` and ``batch``; restore the model.

    ``model``: a GPTModel or HybridModel (MambaModel 0.17), bare or under ``.module`` wrappers (one model,
    not a list of pipeline chunks; on the stage that holds the MTP layers and the output layer).
    ``batch``: the keyword arguments of the model's forward (``input_ids``, ``position_ids``,
    ``attention_mask``, ``labels``, ``loss_mask``, ``packed_seq_params``, ...), as the training step passes
    them. Returns an :class:`MTPVerification`; ``print()`` it.
    """
    models = language_models(model)
    if len(models) != 1 or isinstance(model, (list, tuple)):
        msg = "verify_mtp checks one model: pass the chunk that holds the MTP layers, not a list of chunks."
        raise MTPPatchError(msg, target=type(model).__name__)
    inner = models[0]
    if getattr(inner, "mtp", None) is None or not getattr(inner, "post_process", True):
        msg = (
            f"verify_mtp needs the {type(inner).__name__} with the MTP layers and the output layer "
            "(mtp_num_layers set, the last pipeline stage); this one has no MTP block here."
        )
        raise MTPPatchError(msg, target=type(inner).__name__)
    if {"_postprocess", "forward"} & vars(inner).keys():
        msg = (
            f"verify_mtp found {type(inner).__name__} patched (an instance-level _postprocess or forward): call it "
            "outside mtp_patched, so that its upstream step is upstream's."
        )
        raise MTPPatchError(msg, target=type(inner).__name__)
    state = _State(model, inner)
    try:
        return _verify(model, inner, dict(batch), bool(detach_encoder), tolerance, registry, state)
    finally:
        state.restore()


def _verify(
    model: Any,
    inner: Any,
    batch: dict[str, Any],
    detach: bool,
    tolerance: float,
    registry: patchreg.Registry | None,
    state: _State,
) -> MTPVerification:
    import torch

    named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    is_mtp = [n.startswith("mtp.") for n, _ in named]
    model.train()
    error, up_logits, up_losses, up_grads = "", None, (), None
    state.reset_rng()
    try:
        up_logits, up_losses, up_grads = _upstream_step(model, inner, batch, params)
    except Exception as exc:  # upstream's own step may be broken on this release (that is what we patch)
        error = f"{type(exc).__name__}: {exc}"
    with_mtp, logits, losses = _our_step(model, batch, params, detach, registry, state, 1.0)
    without = _our_step(model, batch, params, detach, registry, state, 0.0)[0]  # what a router aux loss gives alone
    mtp_grads = [a - b for a, b in zip(with_mtp, without, strict=True)]
    trunk = [g for g, m in zip(mtp_grads, is_mtp, strict=True) if not m]
    zero = tuple(n for (n, _), g, m in zip(named, mtp_grads, is_mtp, strict=True) if m and not torch.any(g != 0))
    nonfinite = tuple(n for (n, _), g, m in zip(named, with_mtp, is_mtp, strict=True) if m and not g.isfinite().all())
    vs_upstream = math.nan
    if up_grads is not None:
        diffs = [float((a - b).abs().max()) for a, b, m in zip(with_mtp, up_grads, is_mtp, strict=True) if m]
        vs_upstream = max(diffs, default=0.0)
    return MTPVerification(
        model_class=type(inner).__name__,
        release=mcore_version(),
        detach_encoder=detach,
        tolerance=tolerance,
        logits_max_diff=_relative(logits, up_logits) if up_logits is not None else math.inf,
        mtp_losses=losses,
        upstream_losses=up_losses,
        trunk_grad_max=max((float(g.abs().max()) for g in trunk), default=0.0),
        trunk_params=len(trunk),
        mtp_params=sum(is_mtp),
        mtp_without_grad=zero,
        mtp_not_finite=nonfinite,
        mtp_grads_vs_upstream=vs_upstream,
        upstream_error=error,
    )


def _our_step(
    model: Any,
    batch: dict[str, Any],
    params: list[Any],
    detach: bool,
    registry: patchreg.Registry | None,
    state: _State,
    scale: float,
) -> tuple[list[Any], Any, tuple[float, ...]]:
    """One step inside ``mtp_patched`` from the RNG state found, the MTP loss scaled by ``scale``: (gradients,
    logits, per-depth losses)."""
    from patches.megatron.mtp import mtp_patched

    state.reset_rng()
    _scale(scale)
    with mtp_patched(model, detach_encoder=detach, registry=registry) as report:
        logits = model(**batch)
        grads = _grads(logits, params)
    return grads, logits, report.mtp_losses


def _upstream_step(model: Any, inner: Any, batch: dict[str, Any], params: list[Any]) -> tuple[Any, Any, Any]:
    """Upstream's own forward and backward: main-head logits (from the decoder's output), the per-depth MTP losses
    upstream logged, every parameter's gradient (main output x0)."""
    import torch

    helper = upstream(MTP, "MTPLossLoggingHelper")
    helper.tracker.clear()
    captured: list[Any] = []
    hook = inner.decoder.register_forward_hook(lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
    _scale(1.0)
    try:
        out = model(**batch)
    finally:
        hook.remove()
    grads = _grads(out, params)
    values = tracked_losses(helper.tracker)
    losses = tuple(float(v) for v in values) if values is not None else ()
    weight = inner.shared_embedding_or_output_weight() if inner.share_embeddings_and_output_weights else None
    with torch.no_grad():
        logits, _ = inner.output_layer(captured[0], weight=weight)
        if hasattr(inner, "_scale_logits"):
            logits = inner._scale_logits(logits)
    return logits.transpose(0, 1), losses, grads


def _grads(out: Any, params: list[Any]) -> list[Any]:
    """Each parameter's gradient of ``out * 0`` (the MTP loss alone rides on it), zeros where none reached it."""
    import torch

    found = torch.autograd.grad((out * 0).sum(), params, allow_unused=True)
    return [g if g is not None else torch.zeros_like(p) for g, p in zip(found, params, strict=True)]


def _relative(got: Any, want: Any) -> float:
    """max |got - want| / max |want| in fp32 (0.0 exactly when bit-equal)."""
    got, want = got.detach().float(), want.detach().float()
    diff = float((got - want).abs().max())
    return diff / max(float(want.abs().max()), 1e-30) if diff else 0.0


def _scale(value: float) -> None:
    import torch

    upstream(MTP, "MTPLossAutoScaler").set_loss_scale(torch.tensor(value))


class _State:
    """What verify_mtp may change and puts back: modes, buffers, ``.grad``, RNG states, trackers, the scale."""

    def __init__(self, model: Any, inner: Any) -> None:
        import torch

        self.modes = [(m, m.training) for m in model.modules()]
        self.buffers = [(b, b.detach().clone()) for b in inner.buffers()]
        self.grads = [(p, p.grad) for p in inner.parameters()]
        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.python_rng = random.getstate()
        self.tracker = _rng_tracker()
        self.tracker_states = _tracker_states(self.tracker)
        helper = upstream(MTP, "MTPLossLoggingHelper")
        self.mtp_tracker = dict(helper.tracker)
        self.mtp_values = {k: v.detach().clone() for k, v in self.mtp_tracker.items() if torch.is_tensor(v)}
        self.scaler = upstream(MTP, "MTPLossAutoScaler")
        self.scale = vars(self.scaler).get("main_loss_backward_scale")

    def reset_rng(self) -> None:
        """The RNG states as found, so that upstream's step and ours draw the same numbers."""
        import torch

        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        if self.tracker is not None and self.tracker_states is not None:
            self.tracker.set_states(self.tracker_states)

    def restore(self) -> None:
        import torch

        self.reset_rng()
        with torch.no_grad():
            for tensor, saved in self.buffers:  # (parameters are never written: no copy of them is kept)
                tensor.copy_(saved)
        for param, grad in self.grads:
            if param.grad is not grad:
                param.grad = grad
        for module, training in self.modes:
            module.training = training
        helper = upstream(MTP, "MTPLossLoggingHelper")
        for key, value in self.mtp_values.items():
            self.mtp_tracker[key].copy_(value)
        helper.tracker.clear()
        helper.tracker.update(self.mtp_tracker)
        if self.scale is not None:
            self.scaler.main_loss_backward_scale = self.scale


def _rng_tracker() -> Any:
    try:
        return upstream("megatron.core.tensor_parallel.random", "get_cuda_rng_tracker")()
    except Exception:  # no tracker on this setup (e.g. CPU without cpu_patched): nothing to keep
        return None


def _tracker_states(tracker: Any) -> Any:
    if tracker is None:
        return None
    try:
        return tracker.get_states()
    except Exception:  # CUDA-only states on a machine without a GPU: nothing to keep
        return None
