"""The MTP drafter around vLLM's own weight-update sessions and its level 2 sleep.

**Sessions.** vLLM's weight-transfer API (``start_weight_update`` / ``update_weights`` /
``finish_weight_update``) writes one model per session; ``start_draft_weight_update`` (vLLM 0.26+)
opens a session that writes the drafter. Inside a session the drafter sync of
:mod:`patches.vllm.drafter` steps aside: the target's ``load_weights`` passes through (the tensors it
shares with the drafter are noted), the drafter is never written by it. After a target session the
worker's ledger lists the drafter's own tensors as stale until a draft session finishes; a finished
draft session is credited there (``source="draft weight transfer"``, one more ``drafter_syncs``).
A target sync the set would otherwise follow with the drafter (``reload_weights``, a target
``load_weights``) leaves the drafter to vLLM's session too when the previous target sync was followed
by a draft session: the caller syncs the drafter that way, so it is written once.

**Level 2 sleep.** ``sleep(level=2)`` discards the weights, the drafter's included, except those
``--sleep-preserve-parameter-names`` keeps (the drafter's own under ``draft.<name>``, the tensors it
shares with the target under the target's names); ``reload_weights`` restores the target only
(vLLM #52479; 0.34 warns "Level 2 sleep discards draft model weights"). The wrap of ``Worker.sleep``
marks the discarded drafter tensors stale in the ledger until a sync writes them again: the drafter
sync's ``reload_weights`` (from a path, or an iterator carrying the MTP layer) or a draft session. The
CPU worker has no sleep mode (``CPUWorker.sleep`` does nothing and is not wrapped).

Nothing here imports vLLM or torch at module import.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any, Final

__all__ = [
    "discarded_by_sleep",
    "in_session",
    "note_discarded",
    "note_session_end",
    "note_session_failure",
    "note_session_load",
    "note_sleep",
    "open_session",
]

logger = logging.getLogger("patchreg.vllm")

_TARGET_ONLY: Final = (
    "a weight-transfer session wrote the target only: the drafter is stale until a session opened with "
    "start_draft_weight_update (collective_rpc('start_draft_weight_update')) sends its tensors"
)


def open_session(model: str) -> Any:
    """The wrap of ``Worker.start_weight_update`` (``model="target"``) or ``start_draft_weight_update``
    (``"drafter"``): once vLLM opened the session, note it in the worker's ledger."""

    def wrap(wrapped: Any, worker: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        from patches.vllm import drafter

        if drafter._draft_of(worker) is None:
            return result
        ledger = drafter._ledger(worker)
        with ledger.lock:
            if model == "target":
                evidence = ledger.target_syncs > 0 and not ledger.session_follows
                drafter._begin_target_sync(ledger)
                ledger.written, ledger.source = set(), "weight transfer"
            ledger.session, ledger.session_loaded, ledger.session_observed = model, set(), False
            ledger.failed, ledger.error = model, f"the {model}'s weight-transfer session did not finish"
        if model == "target":
            _say_target_session(evidence)
        return result

    return wrap


def _say_target_session(evidence: bool) -> None:
    """A target session leaves the drafter to a draft session: a warning once the previous sync showed that the
    caller does not send one (a target sync not followed by a draft session), else a debug line."""
    if evidence:
        logger.warning(
            "vLLM's weight-transfer session writes the target only, and the previous one was not followed by a "
            "draft session: the MTP drafter stays stale. After finish_weight_update, send the drafter's tensors "
            "in a second session opened with start_draft_weight_update (collective_rpc('start_draft_weight_update'))."
        )
    else:
        logger.debug("A target weight-transfer session: the MTP drafter follows in a start_draft_weight_update one.")


def note_session_end(wrapped: Any, worker: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``Worker.finish_weight_update``: count the session in the worker's ledger (a draft session is credited
    with the drafter tensors its ``load_weights`` reported, or all of them where that call is not seen)."""
    from patches.vllm import drafter

    draft = drafter._draft_of(worker)
    if draft is None:
        return wrapped(*args, **kwargs)
    ledger = drafter._ledger(worker)
    try:
        result = wrapped(*args, **kwargs)
    except Exception as exc:
        _failed(ledger, exc)
        raise
    shared = drafter._shared_written(worker.get_model(), draft, None)
    with ledger.lock:
        model, ledger.session = ledger.session, None
        if model == "target":  # where its load_weights was not seen, the target's tensors count as written
            ledger.written |= set() if ledger.session_observed else shared
            ledger.target_syncs += 1
            ledger.failed, ledger.error = "drafter", _TARGET_ONLY
        elif model == "drafter":  # what its load_weights reported, else every tensor of the drafter's own
            own = {n for n, _ in draft.named_parameters()} - shared
            ledger.written |= ledger.session_loaded | drafter._derived(draft) if ledger.session_observed else own
            ledger.drafter_syncs += 1
            ledger.session_follows = True
            ledger.source = "draft weight transfer"
            ledger.failed, ledger.error = None, ""
    return result


def note_session_failure(wrapped: Any, worker: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``Worker.update_weights``: vLLM ends the session when a chunk fails; the ledger names the model left
    stale and the error."""
    try:
        return wrapped(*args, **kwargs)
    except Exception as exc:
        from patches.vllm import drafter

        if drafter._draft_of(worker) is not None:
            _failed(drafter._ledger(worker), exc)
        raise


def _failed(ledger: Any, exc: Exception) -> None:
    with ledger.lock:
        model, ledger.session = ledger.session, None
        if model is not None:
            ledger.failed, ledger.error = model, f"{type(exc).__name__}: {exc}"


def in_session(worker: Any) -> bool:
    """True while one of vLLM's weight-transfer sessions is open on ``worker`` (the drafter sync steps aside)."""
    from patches.vllm import drafter

    ledger = drafter._ledger(worker)
    with ledger.lock:
        return ledger.session is not None


def note_session_load(worker: Any, model: str, loaded: set[str], target: Any = None) -> None:
    """Inside a session: a ``load_weights`` of the drafter (``model="drafter"``) or of the target (``target``, the
    model) reported ``loaded``; note it for the session's end (the drafter's) or now (the target's shared tensors)."""
    from patches.vllm import drafter

    ledger = drafter._ledger(worker)
    shared = drafter._shared_written(target, drafter._draft_of(worker), loaded) if target is not None else set()
    with ledger.lock:
        ledger.session_observed = True
        if model == "drafter":
            ledger.session_loaded |= loaded
        else:
            ledger.written |= shared


# --------------------------------------------------------------------------- level 2 sleep


def _sleep_level(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return int(args[0] if args else kwargs.get("level", 1))


def discarded_by_sleep(worker: Any, draft: Any) -> set[str]:
    """The drafter's parameter names a level 2 sleep of ``worker`` discards: all but those matching the model
    config's ``sleep_preserve_parameter_names`` (absent before vLLM 0.33: none kept), the drafter's own tensors
    named ``draft.<name>`` and the ones it shares with the target by the target's name, as vLLM names them."""
    patterns = list(getattr(worker.vllm_config.model_config, "sleep_preserve_parameter_names", None) or ())
    target_names: dict[int, str] = {}
    for name, param in worker.get_model().named_parameters():
        target_names.setdefault(id(param), name)
    return {
        name
        for name, param in draft.named_parameters()
        if not any(fnmatch.fnmatchcase(target_names.get(id(param), f"draft.{name}"), p) for p in patterns)
    }


def note_sleep(wrapped: Any, worker: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``Worker.sleep``: after a level 2 sleep, the drafter tensors it discarded are stale until a sync."""
    result = wrapped(*args, **kwargs)
    from patches.vllm import drafter

    draft = drafter._draft_of(worker)
    if draft is None or _sleep_level(args, kwargs) < 2:
        return result
    discarded = discarded_by_sleep(worker, draft)
    note_discarded(worker, draft, discarded)
    return result


def note_discarded(worker: Any, draft: Any, discarded: set[str]) -> None:
    """The ledger after a level 2 sleep discarded ``discarded`` (drafter parameter names): they are stale."""
    from patches.vllm import drafter

    ledger = drafter._ledger(worker)
    every = {n for n, _ in draft.named_parameters()}
    with ledger.lock:
        tracked = ledger.target_syncs or ledger.sleeps
        ledger.written = (ledger.written if tracked else every) - discarded
        ledger.sleeps += 1
        if discarded:
            ledger.failed = "drafter"
            ledger.error = (
                f"a level 2 sleep discarded {len(discarded)} of the drafter's {len(every)} tensors and vLLM's "
                "reload_weights restores the target only (vLLM #52479): sync the drafter (reload_weights with "
                "vllm-mtp-drafter-sync, or a start_draft_weight_update session), or keep it asleep with "
                "--sleep-preserve-parameter-names 'draft.*'"
            )
    if discarded:
        logger.warning("A level 2 sleep discarded the MTP drafter's weights: %s.", ledger.error)
