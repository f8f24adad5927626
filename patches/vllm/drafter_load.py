"""The MTP drafter follows a target ``load_weights`` call, the way RL frameworks sync a rollout engine.

RL frameworks (verl's worker extension, ``llm.apply_model``) write the rollout's weights with the
target model's own ``load_weights``, bucket by bucket, not with ``Worker.reload_weights``. On vLLM
0.32 that works on a loaded engine only inside vLLM's layerwise reload
(``initialize_layerwise_reload(model)``, ``model.load_weights(...)``,
``finalize_layerwise_reload(model, model_config)``): a bare second ``load_weights`` finds the processed
weights freed (size 0) on MLA models everywhere and on every model on the CPU backend, whose linear
layers keep only their packed copy. Either way the drafter is left out and keeps its old MTP layer.

With :data:`patches.vllm.DRAFTER_SYNC` active, the target's ``load_weights`` (wrapped on the model
classes of MTP targets, per release) keeps the drafter's tensors as the caller's stream passes
through it (one read, never a second pass over the iterator). The drafter is reloaded in place with
vLLM's own ``reload_weights`` from those tensors: after the target's ``finalize_layerwise_reload``
when the call ran inside one (the drafter shares the target's embedding and LM head, which must be
final first), else right after the call. The worker's ledger counts the sync, so
``drafter_status(llm)`` reports it like a ``reload_weights`` sync; with only the channel set it counts
the target's sync and lists the drafter's tensors it left stale. Nothing here imports vLLM or torch
at module import.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Final

__all__ = [
    "DRAFT_CLASSES",
    "MODEL_CLASSES",
    "finish_layerwise",
    "note_drafter_load",
    "note_target",
    "reloading",
    "sync_target_load",
]

MODEL_CLASSES: Final = (
    "vllm.model_executor.models.mimo:MiMoForCausalLM",
    "vllm.model_executor.models.glm4_moe:Glm4MoeForCausalLM",
    "vllm.model_executor.models.deepseek_v2:DeepseekV2ForCausalLM",
)
"""Target classes of MTP drafters whose ``load_weights`` is wrapped (DeepSeek-V2's covers V3's, an MLA model)."""

DRAFT_CLASSES: Final = (
    "vllm.model_executor.models.mimo_mtp:MiMoMTP",
    "vllm.model_executor.models.glm4_moe_mtp:Glm4MoeMTP",
    "vllm.model_executor.models.deepseek_mtp:DeepSeekMTP",
)
"""Their drafters: a ``load_weights`` a framework calls on the drafter itself (verl does) is noted, not repeated."""

LAYERWISE: Final = "vllm.model_executor.model_loader.reload.layerwise"

_TARGETS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # target model -> weakref(worker)
_DRAFTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # drafter model -> weakref(worker)
_PENDING: weakref.WeakKeyDictionary[Any, _Pending] = weakref.WeakKeyDictionary()  # target model -> its open sync
_LOCK = threading.Lock()
_LOCAL = threading.local()  # .depth > 0 inside Worker.reload_weights: that wrapper syncs the drafter itself


class _Pending:
    """A target sync inside a layerwise reload: the drafter's tensors kept so far, the target's names loaded."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, Any]] = []
        self.loaded: set[str] = set()


@contextlib.contextmanager
def reloading() -> Iterator[None]:
    """Mark the thread as inside ``Worker.reload_weights`` (whose wrapper syncs the drafter): the wraps here pass."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


def note_target(wrapped: Any, worker: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``Worker.load_model``: remember which worker a target model belongs to (weakly)."""
    result = wrapped(*args, **kwargs)
    from patches.vllm.drafter import _draft_of

    model, draft = worker.get_model(), _draft_of(worker)
    with _LOCK:
        _TARGETS[model] = weakref.ref(worker)
        if draft is not None:
            _DRAFTS[draft] = weakref.ref(worker)
    return result


def _worker_of(model: Any, table: weakref.WeakKeyDictionary[Any, Any] = _TARGETS) -> Any:
    with _LOCK:
        try:
            ref = table.get(model)
        except TypeError:  # not weakly referable: no worker loaded it
            return None
    worker = ref() if ref is not None else None
    if worker is None or getattr(_LOCAL, "depth", 0):
        return None
    from patches.vllm.drafter import _draft_of

    return worker if _draft_of(worker) is not None else None


def _in_layerwise(model: Any) -> bool:
    """True while ``model`` is inside vLLM's layerwise reload (between initialize and finalize)."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return False
    info = LAYERWISE_INFO.get(model)
    return info is not None and info.can_load()


def sync_target_load(wrapped: Any, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap a target model's ``load_weights``: keep the drafter's tensors as the stream passes; sync it after."""
    worker = _worker_of(model)
    if worker is None:
        return wrapped(*args, **kwargs)
    from patches.vllm import drafter, drafter_sessions

    if drafter_sessions.in_session(worker):  # vLLM's weight-transfer session: the drafter has a session of its own
        loaded = set(wrapped(*args, **kwargs) or ())
        drafter_sessions.note_session_load(worker, "target", loaded, target=model)
        return loaded
    layerwise = _in_layerwise(model)
    # inside a layerwise reload the drafter loads at the finalize, after the caller may have reused its buffers
    keep = drafter._Keep(drafter._num_hidden_layers(worker), copy=layerwise)
    if args:
        args = (keep.through(args[0]), *args[1:])
    else:
        kwargs = {**kwargs, "weights": keep.through(kwargs["weights"])}
    with _LOCK:
        first = layerwise and model not in _PENDING
        if first:
            _PENDING[model] = _Pending()
    if first:  # a new sync: the drafter's tensors count as written only once this sync writes them
        _start(worker)
    loaded = set(wrapped(*args, **kwargs) or ())
    if layerwise:  # the drafter follows at the target's finalize_layerwise_reload
        with _LOCK:
            pending = _PENDING[model]
            pending.kept.extend(keep.kept)
            pending.loaded |= loaded
        return loaded
    # a bare call is a sync of its own where it carried the drafter's tensors (a bucket without them is not)
    pending = _Pending()
    pending.kept, pending.loaded = keep.kept, loaded
    if keep.kept:  # it owes the drafter its own tensors; the ones shared with the target keep their state
        _start(worker, keep_shared=model)
        _sync_drafter(worker, model, pending)
    else:
        ledger = drafter._ledger(worker)
        with ledger.lock:
            ledger.written |= drafter._shared_written(model, drafter._draft_of(worker), loaded)
    return loaded


def _start(worker: Any, keep_shared: Any = None) -> None:
    """A sync starts: nothing of the drafter counts as written (``keep_shared``, the target model: but the
    tensors it shares with the target, which this sync may not carry)."""
    from patches.vllm import drafter

    ledger = drafter._ledger(worker)
    shared = set() if keep_shared is None else drafter._shared_written(keep_shared, drafter._draft_of(worker), None)
    with ledger.lock:
        drafter._begin_target_sync(ledger)
        ledger.written, ledger.failed = ledger.written & shared, "target"
        ledger.error = "the target's load_weights sync did not finish"


def finish_layerwise(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``finalize_layerwise_processing``: after a target's, reload the drafter from the tensors kept."""
    result = wrapped(*args, **kwargs)
    model = args[0] if args else kwargs.get("model")
    with _LOCK:
        pending = _PENDING.pop(model, None) if model is not None else None
    worker = _worker_of(model) if pending is not None else None
    if worker is not None and pending is not None:
        _sync_drafter(worker, model, pending)
    return result


def _sync_drafter(worker: Any, model: Any, pending: _Pending) -> None:
    """Count the target's sync in the worker's ledger; with the drafter sync on, reload the drafter."""
    from patches.vllm import drafter

    draft = drafter._draft_of(worker)
    ledger = drafter._ledger(worker)
    keep = drafter._Keep(0, copy=False)
    keep.kept = pending.kept
    call = drafter._Call(None, None, True)
    with ledger.lock:
        ledger.target_syncs += 1
        ledger.source = "target load_weights"
        ledger.written |= drafter._shared_written(model, draft, pending.loaded)
        ledger.failed, ledger.error = None, ""
        if drafter.SYNC_DRAFTER and not ledger.aside:
            with reloading():
                drafter._reload_drafter(worker, draft, call, keep, ledger)
        elif ledger.aside:
            drafter._leave_to_session(ledger)


def note_drafter_load(wrapped: Any, draft: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap an MTP drafter's ``load_weights`` called by a framework (verl syncs the drafter itself): note what it
    wrote in the worker's ledger, so the status does not call those tensors stale."""
    worker = _worker_of(draft, _DRAFTS)
    loaded = wrapped(*args, **kwargs)
    if worker is not None:
        from patches.vllm import drafter, drafter_sessions

        if drafter_sessions.in_session(worker):  # a draft session: credited as a whole when it finishes
            drafter_sessions.note_session_load(worker, "drafter", set(loaded or ()))
            return loaded
        ledger = drafter._ledger(worker)
        with ledger.lock:
            ledger.written |= set(loaded or ())
            ledger.drafter_syncs += 1
    return loaded
