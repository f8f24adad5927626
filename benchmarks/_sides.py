"""The sides the benchmarks time: our block, the engine alone, verl's hand patches, mock, MonkeyPatch, wrapt."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import wrapt

import patchreg
from benchmarks._peers import Sink

SITES = (("", "_postprocess"), ("mtp.layers.0", "_get_embeddings"), ("mtp.layers.0", "_checkpointed_forward"))


def ours() -> Any:
    """``patches.megatron.mtp`` (the module), or raise ImportError naming what is missing."""
    from patches.megatron import mtp

    return mtp


def _holder(model: Any, path: str) -> Any:
    holder = model
    for part in filter(None, path.split(".")):
        holder = holder[int(part)] if part.isdigit() else getattr(holder, part)
    return holder


def _targets(model: Any, only: tuple[str, ...] | None = None) -> list[tuple[Any, str, Any]]:
    """(holder, attribute, replacement bound as an installer by hand would bind it) of our set's patches.

    All three (``only=None``), or those of the patches named in ``only`` (what our block installs).
    """
    found = []
    for patch, (path, attr) in zip(ours().MTP_DETACH_SET, SITES, strict=True):
        if only is None or patch.name in only:
            holder = _holder(model, path)
            found.append((holder, attr, patch.replacement.__get__(holder, type(holder))))
    return found


# -- the cycles -----------------------------------------------------------------------------


def probe() -> tuple[int, list[str], tuple[str, ...]]:
    """What our block installs on a fresh model of this megatron-core: (how many, the patches skipped by
    predicate, the names of those installed: what the like-for-like peers patch)."""
    from benchmarks import _model

    with patchreg.Registry("bench-probe").patched(ours().MTP_DETACH_SET, _model.build()) as report:
        return report.installed, [n for n, _ in report.skipped], tuple(e.patch for e in report.entries)


def _patchreg_cycle(model: Any) -> Callable[[], None]:
    mtp_patched = ours().mtp_patched

    def op() -> None:
        with mtp_patched(model, detach_encoder=True):
            pass

    return op


def _apply_revert(model: Any) -> Callable[[], None]:
    registry, patch_set = patchreg.registry, ours().MTP_DETACH_SET

    def op() -> None:
        registry.revert(registry.apply(patch_set, model))

    return op


def _engine_cycle(model: Any) -> Callable[[], None]:
    block = patchreg.registry.patched(ours().MTP_DETACH_SET, model)

    def op() -> None:
        with block:
            pass

    return op


def _verl_cycle(verl: Any, model: Any) -> Callable[[], None]:
    def op() -> None:
        verl.patch_postprocess(model)
        verl.patch_mtp_layer_get_embeddings(model)
        verl.patch_mtp_layer_checkpointed_forward(model)
        verl.unpatch_postprocess(model)
        verl.unpatch_mtp_layer_get_embeddings(model)
        verl.unpatch_mtp_layer_checkpointed_forward(model)

    return op


def _mock_cycle(model: Any, only: tuple[str, ...] | None = None) -> Callable[[], None]:
    targets = _targets(model, only)

    def op() -> None:
        patchers = [mock.patch.object(holder, attr, new) for holder, attr, new in targets]
        for p in patchers:
            p.start()
        for p in reversed(patchers):
            p.stop()

    return op


def _monkeypatch_cycle(model: Any, only: tuple[str, ...] | None = None) -> Callable[[], None]:
    targets = _targets(model, only)

    def op() -> None:
        mp = pytest.MonkeyPatch()
        for holder, attr, new in targets:
            mp.setattr(holder, attr, new)
        mp.undo()

    return op


def _wrapt_cycle(model: Any, only: tuple[str, ...] | None = None) -> Callable[[], None]:
    targets = []
    for holder, attr, new in _targets(model, only):

        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any, new: Any = new) -> Any:
            return new(*args, **kwargs)

        targets.append((holder, attr, wrapper))

    def op() -> None:
        saved = []
        for holder, attr, wrapper in targets:
            saved.append((holder, attr, vars(holder).get(attr, _MISSING)))
            wrapt.wrap_function_wrapper(holder, attr, wrapper)
        for holder, attr, before in reversed(saved):
            if before is _MISSING:
                delattr(holder, attr)
            else:
                setattr(holder, attr, before)

    return op


_MISSING = object()


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    with contextlib.redirect_stdout(Sink()):  # type: ignore[type-var]
        yield


ENGINE = "(engine alone: registry.patched(MTP_DETACH_SET, model))"
LOCK_FLOOR = "(an RLock as the engine's, acquired and released twice as one enter + exit does: information)"


def _lock_cycle(_model: Any) -> Callable[[], None]:
    import threading

    lock = threading.RLock()  # the engine's lock is private: one of the same kind costs the same
    acquire, release = lock.acquire, lock.release

    def op() -> None:
        acquire()
        release()
        acquire()
        release()

    return op
