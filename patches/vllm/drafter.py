"""The MTP drafter follows the target through a weight sync, in vLLM's own worker processes.

With MTP speculative decoding a vLLM worker holds two models: the target and the MTP
drafter (``worker.get_draft_model()``, e.g. a ``DeepSeekMTP``). vLLM's in-place
``reload_weights`` (``llm.collective_rpc("reload_weights", kwargs=...)``) writes the target
only: the drafter keeps its old MTP layer (only the tensors it shares with the target, the
embedding and the LM head, follow) and acceptance collapses, silently.

Two patch sets, for ``PATCHREG_PATCHSETS`` (the ``patchreg`` vLLM general plugin applies them
in every process vLLM starts: main, engine core, workers):

- :data:`DRAFTER_SYNC` (``vllm-mtp-drafter-sync``): after the target's ``reload_weights``, the
  drafter is reloaded in place from the same source with vLLM's own
  ``model_loader.reload.inplace.reload_weights``, from the drafter's tensors kept as the target's
  weight stream passed (from the path's loader or the caller's iterator): one read of the source,
  never a second pass over an iterator. A sync by the target's own ``load_weights`` (as RL frameworks
  write a rollout) is covered by :mod:`patches.vllm.drafter_load`, whose wraps this set holds too.
  vLLM's weight-transfer session (``start_weight_update``) writes one model per session: a
  session without ``start_draft_weight_update`` logs a warning naming it. Every worker also
  answers ``collective_rpc("patchreg_drafter_status")`` and ``collective_rpc("patchreg_fingerprint")``.
- :data:`WORKER_CHANNEL` (``vllm-worker-channel``): only those two worker methods and the
  bookkeeping of syncs (no drafter sync): what ``drafter_status(llm, require_sync=False)`` and
  ``patchreg.distributed`` read where the drafter is left alone.

A drafter tensor counts as written by a sync when the model's ``load_weights`` reported it
(the target's for the tensors the drafter shares with it), or when vLLM derives it after
loading (e.g. MLA's ``W_UV`` / ``W_UK_T``) and the drafter's reload ran. Nothing here imports
vLLM or torch at module import.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Final

import attrs

import patchreg
from patches.vllm.drafter_load import (
    DRAFT_CLASSES,
    LAYERWISE,
    MODEL_CLASSES,
    finish_layerwise,
    note_drafter_load,
    note_target,
    reloading,
    sync_target_load,
)
from patches.vllm.drafter_sessions import note_session_end, note_session_failure, note_sleep, open_session
from patchreg import Patch, PatchError, PatchSet, check, has, not_needed_when, requires

__all__ = [
    "DRAFTER_SYNC",
    "RUNNERS",
    "WORKER_CHANNEL",
    "active_sets",
    "drafter_owns",
    "set_fingerprint",
]

logger = logging.getLogger("patchreg.vllm")

_WORKER: Final = "vllm.v1.worker.gpu_worker:Worker"
_CORE: Final = "vllm.v1.engine.core:EngineCore"
RUNNERS: Final = (
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner",  # 0.34's only runner (0.33's second)
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner",  # up to 0.33 (gone in 0.34)
)
"""The model runners a vLLM worker may build, newest first: the probe runs on each one the installed release has."""
_INPLACE: Final = "vllm.model_executor.model_loader.reload.inplace:reload_weights"

SYNC_DRAFTER: bool = False
"""Whether the reload wrapper also reloads the drafter: set to True by :data:`DRAFTER_SYNC` (a value patch)."""


# --------------------------------------------------------------------------- the per-worker ledger


@attrs.define
class _Ledger:
    """What the syncs of one worker did: counts, the drafter tensors the last sync wrote, a failure."""

    target_syncs: int = 0
    drafter_syncs: int = 0
    written: set[str] = attrs.Factory(set)  # drafter parameter names written by the last sync
    failed: str | None = None  # "target" or "drafter" when the last sync raised there
    error: str = ""
    source: str = ""  # "path <p>", "iterator", "weight transfer", "draft weight transfer", "target load_weights"
    session: str | None = None  # "target" or "drafter" while one of vLLM's weight-transfer sessions is open
    session_loaded: set[str] = attrs.Factory(set)  # drafter names the open draft session's load_weights reported
    session_observed: bool = False  # the open draft session's load_weights was seen
    session_follows: bool = False  # the last target sync was followed by a finished draft session
    aside: bool = False  # this target sync leaves the drafter to vLLM's draft session
    sleeps: int = 0  # level 2 sleeps (each discards the drafter's tensors but those kept)
    lock: threading.Lock = attrs.Factory(threading.Lock)


_LEDGERS: weakref.WeakKeyDictionary[Any, _Ledger] = weakref.WeakKeyDictionary()
_LEDGERS_LOCK = threading.Lock()


def _ledger(worker: Any) -> _Ledger:
    with _LEDGERS_LOCK:
        found = _LEDGERS.get(worker)
        if found is None:
            found = _LEDGERS[worker] = _Ledger()
        return found


def _begin_target_sync(ledger: _Ledger) -> bool:
    """A target sync starts (the ledger's lock held): True, and noted, when it leaves the drafter to vLLM's draft
    weight-update session, i.e. the previous target sync was followed by one (the caller syncs the drafter so)."""
    ledger.aside, ledger.session_follows = ledger.session_follows, False
    return ledger.aside


def _leave_to_session(ledger: _Ledger) -> None:
    """The drafter is left to the caller's draft session (the ledger's lock held): stale until it finishes."""
    ledger.failed = "drafter"
    ledger.error = (
        "left to vLLM's draft weight-update session (start_draft_weight_update), which followed the previous sync; "
        "none has finished since this one"
    )


# --------------------------------------------------------------------------- which tensors are the drafter's

_LAYER: Final = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MTP: Final = re.compile(r"(?:^|\.)mtp(?:[._]|$)")


def drafter_owns(name: str, num_hidden_layers: int) -> bool:
    """True for a checkpoint tensor name of the MTP layers: ``*.layers.{i}.*`` with ``i >= num_hidden_layers``
    (DeepSeek-V3, GLM-4 MoE, ...) or an ``mtp`` segment (``mtp.*``, ``model.mtp_layers.*``)."""
    found = _LAYER.search(name)
    if found is not None and int(found.group(1)) >= num_hidden_layers:
        return True
    return _MTP.search(name) is not None


def _num_hidden_layers(worker: Any) -> int:
    hf = worker.vllm_config.model_config.hf_config
    text = getattr(hf, "get_text_config", None)
    config = text() if callable(text) else hf
    return int(config.num_hidden_layers)


class _Keep:
    """Keep a copy of the drafter's tensors as a weight stream passes through to the target (read once)."""

    def __init__(self, num_hidden_layers: int, *, copy: bool) -> None:
        self._layers = num_hidden_layers
        self._copy = copy
        self.kept: list[tuple[str, Any]] = []

    def through(self, source: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Yield ``source`` unchanged, keeping the drafter's tensors on the way.

        With ``copy`` (a caller's iterator, which may hand out views of a buffer it reuses for the
        next bucket) a copy is kept; vLLM's own loader (a path) yields fresh tensors: kept as they are.
        """
        for name, tensor in source:
            if drafter_owns(name, self._layers):
                self.kept.append((name, tensor.detach().clone() if self._copy else tensor))
            yield name, tensor


# --------------------------------------------------------------------------- capture what load_weights wrote


_CAPTURED: dict[int, set[str]] = {}
_KEEPERS: dict[int, _Keep] = {}
_CAPTURED_LOCK = threading.Lock()


def _record_loaded(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap a model's ``load_weights`` for one sync: remember the parameter names it reports loaded.

    For the target, the stream it loads (from the path's loader or the caller's iterator) passes
    through a :class:`_Keep`, so the drafter loads from the same read.
    """
    keep = _KEEPERS.get(id(instance))
    if keep is not None and args:
        args = (keep.through(args[0]), *args[1:])
    elif keep is not None and "weights" in kwargs:
        kwargs = {**kwargs, "weights": keep.through(kwargs["weights"])}
    loaded = wrapped(*args, **kwargs)
    with _CAPTURED_LOCK:
        _CAPTURED.setdefault(id(instance), set()).update(loaded or ())
    return loaded


# held in a tuple, not bound as a module-level PatchSet: it is applied to one model for one sync, never listed
_CAPTURE: Final = (
    PatchSet(
        "vllm-drafter-sync-capture",
        [Patch("vllm.drafter-sync.record-loaded", "load_weights", _record_loaded, kind="wrap")],
        "for one sync: the names a model's load_weights reports loaded",
    ),
)


def _loaded_by(model: Any, run: Any, keep: _Keep | None = None) -> set[str]:
    """Run ``run()`` with ``model.load_weights`` recorded (its stream through ``keep``); the names it loaded."""
    with _CAPTURED_LOCK:
        _CAPTURED.pop(id(model), None)
        if keep is not None:
            _KEEPERS[id(model)] = keep
    try:
        with patchreg.patched(_CAPTURE[0], model):
            run()
    finally:
        with _CAPTURED_LOCK:
            loaded = _CAPTURED.pop(id(model), set())
            _KEEPERS.pop(id(model), None)
    return loaded


def _derived(draft: Any) -> set[str]:
    """Drafter parameters vLLM derives after loading (the attention layers it re-processes on every reload)."""
    try:
        from vllm.model_executor.layers.attention import is_deferred_attention_layer
    except ImportError:  # older releases: no deferred attention processing
        return set()
    names: set[str] = set()
    for prefix, module in draft.named_modules():
        if is_deferred_attention_layer(module):
            names.update(f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters())
    return names


# --------------------------------------------------------------------------- the reload wrapper


@attrs.frozen
class _Call:
    iterator: Iterable[tuple[str, Any]] | None
    path: str | None
    checkpoint_format: bool


def _bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
    names = ("weights_iterator", "weights_path", "is_checkpoint_format")
    given = dict(zip(names, args, strict=False))
    unknown = set(kwargs) - set(names)
    if unknown or len(args) > len(names) or set(given) & set(kwargs):
        msg = f"reload_weights() got arguments the drafter sync cannot read: {sorted(unknown) or args!r}."
        raise PatchError(msg)
    given.update(kwargs)
    return _Call(given.get("weights_iterator"), given.get("weights_path"), given.get("is_checkpoint_format", True))


def _draft_of(worker: Any) -> Any:
    get = getattr(worker, "get_draft_model", None)
    spec = getattr(worker.vllm_config, "speculative_config", None)
    if get is None or spec is None or getattr(spec, "method", None) != "mtp":
        return None
    return get()


def sync_reload(wrapped: Any, worker: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap ``Worker.reload_weights``: reload the target, then (with the drafter sync on) the MTP drafter."""
    draft = _draft_of(worker)
    ledger = _ledger(worker)
    if draft is None:
        return wrapped(*args, **kwargs)
    call = _bind(args, kwargs)
    with ledger.lock, reloading():
        aside = _begin_target_sync(ledger)
        sync = SYNC_DRAFTER and not aside
        keep = _Keep(_num_hidden_layers(worker), copy=call.iterator is not None) if sync else None
        iterator = call.iterator
        if keep is not None and iterator is not None and not call.checkpoint_format:
            iterator = keep.through(iterator)  # kernel format: vLLM copies tensor by tensor, no load_weights call
        target_kwargs = {
            "weights_iterator": iterator,
            "weights_path": call.path,
            "is_checkpoint_format": call.checkpoint_format,
        }
        ledger.written, ledger.failed, ledger.error = set(), "target", "the target's reload did not finish"
        ledger.source = "iterator" if call.iterator is not None else f"path {call.path or '(the current model)'}"
        result: list[Any] = []
        run = lambda: result.append(wrapped(**target_kwargs))  # noqa: E731
        loaded = _loaded_by(worker.get_model(), run, keep if call.checkpoint_format else None)
        ledger.target_syncs += 1
        ledger.written = _shared_written(worker.get_model(), draft, loaded)
        ledger.failed, ledger.error = None, ""
        if sync:
            _reload_drafter(worker, draft, call, keep, ledger)
        elif aside:
            _leave_to_session(ledger)
    return result[0]


def _shared_written(target: Any, draft: Any, target_loaded: set[str] | None) -> set[str]:
    """The drafter's names of the tensors it shares with the target that the target's load wrote (``None``: all
    of them, the drafter's tensors shared with the target)."""
    params = target.named_parameters(remove_duplicate=False)
    written = {id(p) for n, p in params if target_loaded is None or n in target_loaded}
    return {n for n, p in draft.named_parameters() if id(p) in written}  # the names drafter_status lists


def _reload_drafter(worker: Any, draft: Any, call: _Call, keep: _Keep | None, ledger: _Ledger) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    if keep is None or not keep.kept:
        ledger.failed, ledger.error = "drafter", "the weights held no tensor of the MTP drafter"
        logger.warning(
            "reload_weights got no tensor of the MTP drafter (names *.layers.{i}.* with i >= num_hidden_layers, "
            "or mtp.*): the drafter keeps its old weights. Send the MTP layer's tensors with the target's."
        )
        return
    ledger.failed, ledger.error = "drafter", "the drafter's reload did not finish"
    config, kept = worker.vllm_config, keep.kept

    def run() -> None:
        with set_current_vllm_config(config):
            reload_weights(config, draft, kept, None, call.checkpoint_format)

    try:
        loaded = _loaded_by(draft, run)
    except Exception as exc:
        _put_back(draft, config)
        ledger.error = f"{type(exc).__name__}: {exc}"
        msg = (
            f"The MTP drafter's reload failed after the target was written ({ledger.error}): the drafter is stale "
            "and speculative decoding will accept few drafts. drafter_status(llm) lists its stale tensors; fix the "
            "weights and sync again."
        )
        raise PatchError(msg) from exc
    finally:
        keep.kept.clear()
    ledger.written |= loaded | _derived(draft)
    ledger.drafter_syncs += 1
    ledger.failed, ledger.error = None, ""


def _put_back(draft: Any, config: Any) -> None:
    """After a failed in-place reload: finish it as vLLM does (layers not loaded get their tensors back).

    vLLM's reload first moves every layer to the meta device; a load that raises midway would
    leave them there and the next forward pass fails. ``finalize_layerwise_reload`` places the
    kept tensors back (the drafter stays stale, as its status says, but the engine runs).
    """
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    try:
        with set_current_vllm_config(config):
            finalize_layerwise_reload(draft, config.model_config)
    except Exception:  # the original failure is the one to report
        logger.exception("Putting the MTP drafter's tensors back after its failed reload failed too.")


# --------------------------------------------------------------------------- worker methods (by name)


def patchreg_fingerprint(self: Any) -> dict[str, Any]:
    """This process's pid and patchreg fingerprint: a method of vLLM's worker (``collective_rpc("patchreg_fingerprint")``)
    and of its engine core (``engine_core.call_utility("patchreg_fingerprint")``)."""
    registry = patchreg.registry
    return {"pid": os.getpid(), "fingerprint": registry.fingerprint(), "lines": registry.fingerprint_lines()}


def patchreg_drafter_status(self: Any) -> dict[str, Any]:
    """Worker method: what the last weight sync did to the MTP drafter (``collective_rpc`` by name)."""
    draft = _draft_of(self)
    ledger = _ledger(self)
    names = [n for n, _ in draft.named_parameters()] if draft is not None else []
    with ledger.lock:
        stale = sorted(set(names) - ledger.written) if ledger.target_syncs or ledger.sleeps else []
        if ledger.failed == "target":
            stale = sorted(names)
        record = {
            "pid": os.getpid(),
            "has_drafter": draft is not None,
            "drafter_tensors": len(names),
            "stale": stale,
            "stale_model": ledger.failed,
            "error": ledger.error,
            "target_syncs": ledger.target_syncs,
            "drafter_syncs": ledger.drafter_syncs,
            "source": ledger.source,
        }
    record["sync_active"] = SYNC_DRAFTER
    record["sets"] = active_sets()
    record["fingerprint"] = patchreg.registry.fingerprint()
    return record


# --------------------------------------------------------------------------- sets active in a process


def set_fingerprint(patch_set: PatchSet) -> str:
    """A digest of a set's patches, targets, kinds and predicate answers: equal where the same set applies alike."""
    import hashlib

    lines = []
    for p in patch_set:
        answer = p.when.evaluate()
        lines.append(f"{p.name}|{p.where}|{p.kind}|{answer.ok}|{answer.reason}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]


def active_sets() -> dict[str, str]:
    """The vLLM sets active in this process (every patch that applies here is installed), with their fingerprints."""
    out = {}
    for patch_set in (DRAFTER_SYNC, WORKER_CHANNEL):
        applicable = [p for p in patch_set if p.when.evaluate().ok]
        if applicable and all(patchreg.registry.is_active(p) for p in applicable):
            out[patch_set.name] = set_fingerprint(patch_set)
    return out


# --------------------------------------------------------------------------- the sets


def _native_drafter_sync() -> tuple[bool, str]:
    """Behavioural probe: does vLLM's own runner ``reload_weights`` write the draft model too?

    Calls ``reload_weights`` of each model runner class in :data:`RUNNERS` the installed release has
    (0.34 has only ``vllm.v1.worker.gpu.model_runner``; 0.33 both) on a stand-in runner whose target and
    draft are two one-tensor modules, with one tensor named as both have it, in kernel format (no loader,
    no config). True only if every runner wrote the draft's tensor; a runner the probe cannot run on, or
    none found, answers False (the patch stays) and the reason says why.
    """
    import importlib

    found: list[str] = []
    for path in RUNNERS:
        module, _, name = path.partition(":")
        try:
            runner_class = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        try:
            synced = _runner_writes_draft(runner_class)
        except Exception as exc:  # a release the probe does not fit: keep the patch
            return False, f"the probe of {module}'s reload_weights did not run ({type(exc).__name__}: {exc})"
        if not synced:
            return False, f"vLLM's reload_weights does not write the draft model ({module})"
        found.append(module)
    if not found:
        return False, f"the probe found no model runner of vLLM's ({', '.join(RUNNERS)}): the patch stays"
    return True, f"vLLM's reload_weights writes the draft model ({', '.join(found)})"


def _runner_writes_draft(runner_class: Any) -> bool:
    """Run ``runner_class.reload_weights`` on a stand-in runner (target and draft: one zero tensor each, named
    alike), with a kernel-format iterator of ones; True when the draft's tensor became ones."""
    from types import SimpleNamespace

    import torch

    target, draft = (torch.nn.Linear(2, 2, bias=False).requires_grad_(False) for _ in range(2))
    target.weight.zero_()
    draft.weight.zero_()
    config = SimpleNamespace(model_config=SimpleNamespace(quantization=None), load_config=None, lora_config=None)
    runner = SimpleNamespace(
        vllm_config=config,
        get_model=lambda: target,
        get_draft_model=lambda: draft,
        reset_lora_state=lambda: None,
        reset_encoder_cache=lambda: None,
        reset_mm_cache=lambda: None,
    )
    runner_class.reload_weights(runner, weights_iterator=[("weight", torch.ones(2, 2))], is_checkpoint_format=False)
    if not bool(target.weight.eq(1).all()):
        msg = "the target's tensor was not written either: the stand-in runner no longer fits reload_weights"
        raise RuntimeError(msg)
    return bool(draft.weight.eq(1).all())


def _load_weights_wraps(classes: tuple[str, ...], suffix: str, wrapper: Any, what: str) -> list[Patch]:
    """A wrap of ``load_weights`` on each of ``classes`` (``module:Class``), where the release has it (vLLM 0.20+);
    its doc is the method's name followed by ``what``."""
    return [
        Patch(
            f"vllm.{where.rpartition(':')[2]}.load-weights-{suffix}",
            f"{where}.load_weights",
            wrapper,
            kind="wrap",
            when=requires("vllm>=0.20") & has(f"{where}.load_weights"),
            doc=f"{where.rpartition(':')[2]}.load_weights{what}",
        )
        for where in classes
    ]


def _session_wraps() -> list[Patch]:
    """The wraps of vLLM's weight-transfer session methods on the worker, where the release has them (the draft
    session from 0.26): the drafter sync steps aside inside a session, and the ledger counts each one."""
    wraps = (
        ("start_weight_update", "target-session-noted", open_session("target"),
         "a target session: the drafter follows in a draft session, not by the drafter sync"),
        ("start_draft_weight_update", "draft-session-noted", open_session("drafter"),
         "a draft session (vLLM 0.26+): it writes the drafter; the drafter sync steps aside"),
        ("update_weights", "session-failure-noted", note_session_failure,
         "a failed chunk ends the session: the ledger names the model left stale"),
        ("finish_weight_update", "session-credited", note_session_end,
         "the session is counted; a draft session is credited as the drafter's sync"),
    )
    return [
        Patch(f"vllm.worker.{name}", f"{_WORKER}.{method}", wrapper, kind="wrap",
              when=requires("vllm") & has(f"{_WORKER}.{method}"), doc=f"Worker.{method}: {doc}.")
        for method, name, wrapper, doc in wraps
    ]  # fmt: skip


_HAS_RELOAD: Final = (
    requires("vllm>=0.20") & has(f"{_WORKER}.reload_weights") & has(f"{_WORKER}.get_draft_model") & has(_INPLACE)
)
_NATIVE: Final = not_needed_when(check(_native_drafter_sync, "vLLM's reload_weights writes the drafter"))
# The wraps of the layerwise reload and of the model classes install when vLLM imports those modules (lazily,
# maybe while vllm.model_executor.model_loader is half imported): their predicates read their own module only.
# Worker.load_model's wrap is the switch: without it no target is known and they pass every call through.
_HAS_LOAD: Final = _HAS_RELOAD & has(f"{_WORKER}.load_model")
_LAYERWISE: Final = requires("vllm>=0.20") & has(f"{LAYERWISE}:finalize_layerwise_processing")
_WORKER_METHODS = [
    Patch(
        "vllm.worker.patchreg-fingerprint",
        f"{_WORKER}.patchreg_fingerprint",
        patchreg_fingerprint,
        create=True,
        when=requires("vllm") & has(_WORKER),
        doc="collective_rpc('patchreg_fingerprint'): this worker's pid and patchreg fingerprint.",
    ),
    Patch(
        "vllm.engine-core.patchreg-fingerprint",
        f"{_CORE}.patchreg_fingerprint",
        patchreg_fingerprint,
        create=True,
        when=requires("vllm") & has(_CORE),
        doc="EngineCore utility 'patchreg_fingerprint' (engine_core.call_utility): the engine core's fingerprint.",
    ),
    Patch(
        "vllm.worker.patchreg-drafter-status",
        f"{_WORKER}.patchreg_drafter_status",
        patchreg_drafter_status,
        create=True,
        when=requires("vllm") & has(_WORKER),
        doc="collective_rpc('patchreg_drafter_status'): what the last weight sync did to the MTP drafter.",
    ),
    Patch(
        "vllm.worker.reload-weights-syncs-drafter",
        f"{_WORKER}.reload_weights",
        sync_reload,
        kind="wrap",
        when=_HAS_RELOAD & _NATIVE,
        doc="Worker.reload_weights: note the sync; with the drafter sync on, reload the MTP drafter too.",
    ),
    Patch(
        "vllm.worker.load-model-notes-target",
        f"{_WORKER}.load_model",
        note_target,
        kind="wrap",
        when=_HAS_LOAD & _NATIVE,
        doc="Worker.load_model: remember the worker of the target model (for its load_weights wraps).",
    ),
    Patch(
        "vllm.layerwise-reload.finalize-syncs-drafter",
        f"{LAYERWISE}:finalize_layerwise_processing",
        finish_layerwise,
        kind="wrap",
        when=_LAYERWISE,
        doc="After a target's layerwise reload: note the sync; with the drafter sync on, reload the drafter.",
    ),
    *_session_wraps(),
    Patch(
        "vllm.worker.sleep-notes-discarded-drafter",
        f"{_WORKER}.sleep",
        note_sleep,
        kind="wrap",
        when=requires("vllm") & has(f"{_WORKER}.sleep"),
        doc="Worker.sleep: after level 2, the drafter tensors it discarded are stale until a sync (vLLM #52479).",
    ),
    *_load_weights_wraps(MODEL_CLASSES, "syncs-drafter", sync_target_load,
                         ": keep the drafter's tensors as they pass; sync it after."),
    *_load_weights_wraps(DRAFT_CLASSES, "noted", note_drafter_load,
                         " called by a framework: note the drafter tensors it wrote."),
]  # fmt: skip

WORKER_CHANNEL = PatchSet(
    "vllm-worker-channel",
    _WORKER_METHODS,
    "vLLM workers answer collective_rpc('patchreg_fingerprint') and ('patchreg_drafter_status'); no drafter sync",
)
"""Worker methods and sync bookkeeping only: for ``drafter_status(llm, require_sync=False)`` and fingerprints."""

DRAFTER_SYNC = PatchSet(
    "vllm-mtp-drafter-sync",
    [
        *_WORKER_METHODS,
        Patch(
            "vllm.drafter-sync.on",
            "patches.vllm.drafter:SYNC_DRAFTER",
            True,
            kind="value",
            when=_HAS_RELOAD,
            doc="Switches the reload wrapper's drafter reload on.",
        ),
    ],
    "MTP speculative decoding: reload_weights also reloads the drafter (path or iterator); workers report it",
)
"""Name it in ``PATCHREG_PATCHSETS`` (``vllm-mtp-drafter-sync``): the ``patchreg`` vLLM plugin applies it everywhere."""
