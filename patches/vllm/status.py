"""``drafter_status(llm)``: each vLLM worker says whether its MTP drafter followed the last weight sync.

Acceptance numbers cannot tell a stale drafter from a hard batch; this asks the workers. It
reaches them by vLLM's own channel, ``collective_rpc`` with a method NAME
(``patchreg_drafter_status``, added to vLLM's worker class by the patch sets of
:mod:`patches.vllm.drafter`), so it needs no ``VLLM_ALLOW_INSECURE_SERIALIZATION``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Sequence
from typing import Any, Final

import attrs

from patches.vllm.drafter import DRAFTER_SYNC, WORKER_CHANNEL, active_sets
from patchreg import PatchError

__all__ = ["DrafterStatus", "drafter_status"]

_METHOD: Final = "patchreg_drafter_status"
_ENV: Final = "PATCHREG_PATCHSETS"


@attrs.frozen
class DrafterStatus:
    """One vLLM worker's answer: did its MTP drafter follow the last weight sync?"""

    pid: int
    in_sync: bool
    """The last sync wrote every drafter tensor (or nothing was synced yet), and none failed."""
    stale: tuple[str, ...]
    """Drafter parameter names the last sync did not write."""
    stale_model: str | None
    """``"target"`` or ``"drafter"`` when the last sync failed (or stopped) there, else None."""
    error: str
    target_syncs: int
    drafter_syncs: int
    drafter_tensors: int
    source: str
    """Where the last sync read from: ``path ...``, ``iterator``, ``target load_weights``, ``weight transfer`` (a
    target session) or ``draft weight transfer`` (a ``start_draft_weight_update`` session)."""
    sync_active: bool
    """The drafter sync (``vllm-mtp-drafter-sync``) is on in that worker."""
    sets: dict[str, str]
    """The vLLM patch sets active in that worker, with their fingerprints."""
    caller_sets: dict[str, str]
    """The same, in the calling process."""
    fingerprint: str
    """The worker's ``patchreg.registry.fingerprint()``."""

    @property
    def matches_caller(self) -> bool:
        """The worker has the sets the caller has, with equal fingerprints (none of them are missing there)."""
        return all(self.sets.get(name) == fp for name, fp in self.caller_sets.items())


def drafter_status(llm: Any, *, require_sync: bool = True) -> list[DrafterStatus] | Awaitable[list[DrafterStatus]]:
    """One :class:`DrafterStatus` per worker of ``llm`` (a ``vllm.LLM``; for an ``AsyncLLM`` await the result).

    Raises :class:`~patchreg.PatchError` naming ``PATCHREG_PATCHSETS`` when a worker cannot answer
    (no patch set of ours in it), or, with ``require_sync`` (the default), when the drafter sync
    is not on in a worker; ``require_sync=False`` reports what a worker saw without it
    (``vllm-worker-channel``).
    """
    rpc = _rpc_of(llm)
    caller = active_sets()
    if inspect.iscoroutinefunction(rpc):
        return _gather_async(rpc, caller, require_sync)
    try:
        answers = rpc(_METHOD)
    except Exception as exc:
        found = _unreachable(exc)
        if found is exc:
            raise
        raise found from exc
    return _records(answers, caller, require_sync)


async def _gather_async(rpc: Any, caller: dict[str, str], require_sync: bool) -> list[DrafterStatus]:
    try:
        answers = await rpc(_METHOD)
    except Exception as exc:
        found = _unreachable(exc)
        if found is exc:
            raise
        raise found from exc
    return _records(answers, caller, require_sync)


def _rpc_of(llm: Any) -> Any:
    rpc = getattr(llm, "collective_rpc", None)
    if rpc is None:
        msg = f"drafter_status() takes a vllm.LLM or AsyncLLM (something with collective_rpc), got {llm!r}."
        raise TypeError(msg)
    return rpc


def _unreachable(exc: Exception) -> Exception:
    """A missing method is our PatchError naming the variable; anything else (a dead engine) passes as it is."""
    if _METHOD not in str(exc):
        return exc
    msg = (
        f"The vLLM workers cannot answer collective_rpc({_METHOD!r}) ({type(exc).__name__}: {exc}). Set "
        f"{_ENV}={DRAFTER_SYNC.name} in the environment before the engine starts (the patchreg vLLM plugin then "
        f"applies it in every vLLM process; check VLLM_PLUGINS lets 'patchreg' load), or {WORKER_CHANNEL.name} "
        "for the report without the sync."
    )
    return PatchError(msg)


def _records(answers: Sequence[dict[str, Any]], caller: dict[str, str], require_sync: bool) -> list[DrafterStatus]:
    out = [_record(a, caller) for a in answers]
    off = [r.pid for r in out if not r.sync_active]
    if require_sync and off:
        msg = (
            f"The MTP drafter sync is not active in the vLLM worker(s) with pid {off} (caller pid {os.getpid()}): "
            f"reload_weights leaves their drafter stale. Set {_ENV}={DRAFTER_SYNC.name} in the environment "
            "before the engine starts, or call drafter_status(llm, require_sync=False) for the report without it."
        )
        raise PatchError(msg)
    return out


def _record(answer: dict[str, Any], caller: dict[str, str]) -> DrafterStatus:
    stale = tuple(answer["stale"])
    return DrafterStatus(
        pid=answer["pid"],
        in_sync=not stale and answer["stale_model"] is None,
        stale=stale,
        stale_model=answer["stale_model"],
        error=answer["error"],
        target_syncs=answer["target_syncs"],
        drafter_syncs=answer["drafter_syncs"],
        drafter_tensors=answer["drafter_tensors"],
        source=answer["source"],
        sync_active=answer["sync_active"],
        sets=dict(answer["sets"]),
        caller_sets=dict(caller),
        fingerprint=answer["fingerprint"],
    )
