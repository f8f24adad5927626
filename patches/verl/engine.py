"""verl's Megatron engine on patchreg's MTP set: one report per engine, released when the engine goes.

verl 0.9's ``MegatronEngine.initialize()`` calls ``patch_engine_mtp(self.module, self.model_config)``
(a name ``transformer_impl`` imported from ``verl.utils.megatron_utils``) once, on the engine's
model chunks, and never unpatches. :func:`patch_engine_mtp` takes its place there: it applies
``MTP_DETACH_SET`` (``model_config.mtp.detach_encoder``) or ``MTP_SET`` to the chunks' GPTModels
and holds that install until the engine is garbage-collected (a ``weakref.finalize`` on the
engine; on the first chunk when it is called outside an engine's ``initialize``). verl's own MTP
patches (``verl.models.mcore.mtp_patch``) are never applied. The registry holds the models weakly,
so nothing here keeps a model alive after its engine.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import patchreg
from patches.megatron.mtp import MTP_DETACH_SET, MTP_SET, language_models

__all__ = ["EngineMTP", "engine_report", "engine_reports", "initializing", "patch_engine_mtp"]

logger = logging.getLogger("patchreg.verl")

#: The engine whose ``initialize()`` is running on this thread / task (set by the ``engine_initialize`` wrap).
_ENGINE: contextvars.ContextVar[Any] = contextvars.ContextVar("patchreg_verl_engine", default=None)
_LOCK = threading.Lock()
_BY_OWNER: weakref.WeakKeyDictionary[Any, list[EngineMTP]] = weakref.WeakKeyDictionary()


class EngineMTP:
    """What :func:`patch_engine_mtp` installed on one engine's chunks, held until the engine goes."""

    __slots__ = ("__weakref__", "chunks", "detach_encoder", "owner", "registry", "released", "report")

    def __init__(self, report: patchreg.Report, detach_encoder: bool, owner: str, chunks: int, registry: Any) -> None:
        self.report = report
        self.detach_encoder = detach_encoder
        self.owner = owner  # a label only: the record never keeps the engine alive
        self.chunks = chunks
        self.registry = registry
        self.released = False

    def release(self) -> int:
        """Revert this engine's installs now (the engine's finalizer does it otherwise); idempotent."""
        with _LOCK:
            if self.released:
                return 0
            self.released = True
        reverted: int = self.registry.revert(self.report)
        logger.info("patchreg: released %s on %s (%d install(s) reverted)", self.report.name, self.owner, reverted)
        return reverted

    @property
    def installed(self) -> int:
        """Installs this engine's apply made (0 when another holder shared them)."""
        return self.report.installed

    @property
    def skipped(self) -> tuple[tuple[str, str], ...]:
        """``(patch, reason)`` for each patch not installed on this release or model."""
        return self.report.skipped

    def __str__(self) -> str:
        state = "released" if self.released else "held"
        lines = [
            f"verl engine {self.owner}: patch set {self.report.name!r} "
            f"(detach_encoder={self.detach_encoder}) on {self.chunks} chunk(s), {state}",
        ]
        lines += [f"  {e.state:<9}{e.patch:<24} {e.holder}.{e.attr}" for e in self.report.entries]
        lines += [f"  skipped  {name:<24} {reason}" for name, reason in self.skipped]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<EngineMTP {self.owner} {self.report.name!r} {'released' if self.released else 'held'}>"


def _label(obj: Any) -> str:
    return f"{type(obj).__name__}@{id(obj):#x}"


def _detach_encoder(model_config: Any) -> bool:
    mtp = getattr(model_config, "mtp", None)
    if mtp is None or not hasattr(mtp, "detach_encoder"):
        msg = (
            f"patch_engine_mtp needs verl's model config with an 'mtp' section (mtp.detach_encoder); got "
            f"{type(model_config).__qualname__!r}. Pass the engine's model_config (HFModelConfig)."
        )
        raise TypeError(msg)
    return bool(mtp.detach_encoder)


def patch_engine_mtp(module: Any, model_config: Any) -> EngineMTP:
    """Replacement of verl's ``patch_engine_mtp``: patchreg's MTP set on the engine's chunks, held for its life.

    ``module`` is the engine's chunk list (or one chunk), ``model_config`` verl's model config
    (``model_config.mtp.detach_encoder`` chooses the set). Returns the engine's :class:`EngineMTP`.
    """
    detach = _detach_encoder(model_config)
    chunks = list(module) if isinstance(module, (list, tuple)) else [module]
    if not chunks:
        msg = "patch_engine_mtp got no model chunks; call it with the engine's module list after it is built."
        raise ValueError(msg)
    models = language_models(chunks)
    registry = patchreg.registry
    report = registry.apply(MTP_DETACH_SET if detach else MTP_SET, models[0] if len(models) == 1 else models)
    engine = _ENGINE.get()
    owner = engine if engine is not None else chunks[0]
    record = EngineMTP(report, detach, _label(owner), len(chunks), registry)
    weakref.finalize(owner, record.release)
    with _LOCK:
        _BY_OWNER.setdefault(owner, []).append(record)
    logger.info("patchreg: %s", str(record).splitlines()[0])
    return record


def initializing(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Wrap of ``MegatronEngine.initialize``: tells :func:`patch_engine_mtp` which engine it patches for."""
    token = _ENGINE.set(instance)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _ENGINE.reset(token)


def engine_report(engine: Any) -> EngineMTP | None:
    """The newest :class:`EngineMTP` of ``engine`` (or of a chunk), or None if it holds none."""
    with _LOCK:
        records = _BY_OWNER.get(engine)
        return records[-1] if records else None


def engine_reports() -> Iterator[EngineMTP]:
    """Every record whose engine (or chunk) is still alive, held or released."""
    with _LOCK:
        found = [r for records in _BY_OWNER.values() for r in records]
    yield from found
