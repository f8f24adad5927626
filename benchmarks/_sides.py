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
#: the patches of MTP_DETACH_SET that replace the methods at SITES (what verl's hand patches replace), in order
SITE_PATCHES = ("postprocess_detached", "detach_embeddings", "checkpointed_forward")


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

    All three (``only=None``), or those of the patches named in ``only`` (what our block installs); where our block
    installs others (0.19.2: upstream's RL mode, a config value and two wraps), what it installs, found by
    :func:`installed_sites`.
    """
    if only is not None and not set(only) <= set(SITE_PATCHES):
        return targets_at(model, installed_sites(model))
    by_name = {patch.name: patch for patch in ours().MTP_DETACH_SET}
    found = []
    for name, (path, attr) in zip(SITE_PATCHES, SITES, strict=True):
        patch = by_name[name]
        if only is None or patch.name in only:
            holder = _holder(model, path)
            found.append((holder, attr, patch.replacement.__get__(holder, type(holder))))
    return found


# -- the cycles -----------------------------------------------------------------------------


def _namespaces(model: Any) -> list[Any]:
    """The model's modules (the model first), its config (0.19.2's native route sets a value there), then the Python
    modules our sets' import-path patches target."""
    import sys

    named = {
        str(p.where).split(":")[0] for s in (ours().MTP_DETACH_SET, *_hybrid_sets()) for p in s if ":" in str(p.where)
    }
    config = [model.config] if hasattr(model, "config") else []
    return [*model.modules(), *config, *(sys.modules[n] for n in sorted(named) if n in sys.modules)]


def _hybrid_sets() -> list[Any]:
    return [v for v in vars(ours()).values() if isinstance(v, patchreg.PatchSet)]


def installed_sites(model: Any) -> list[tuple[int, str, Any]]:
    """``(position in the model's namespaces, attribute, what is installed)`` of every attribute ``mtp_patched`` sets
    on ``model``, its submodules and the Python modules its sets target (found by comparing ``__dict__`` inside the
    block with outside; for a method, its function): where and what the like-for-like peers install, on a model of the
    same shape, whatever the shape."""
    holders = _namespaces(model)
    before = [dict(vars(h)) for h in holders]
    with ours().mtp_patched(model, detach_encoder=True):
        return [
            (i, attr, getattr(value, "__func__", value))
            for i, (holder, was) in enumerate(zip(holders, before, strict=True))
            for attr, value in vars(holder).items()
            if was.get(attr, _MISSING) is not value
        ]


def targets_at(model: Any, sites: list[tuple[int, str, Any]]) -> Targets:
    """``(holder, attribute, replacement)`` on ``model`` at ``sites``: a function bound to its (instance) holder as
    an installer by hand would bind it, anything else as it is."""
    import types

    holders = _namespaces(model)
    return [
        (
            holders[i],
            attr,
            value.__get__(holders[i], type(holders[i]))
            if isinstance(value, types.FunctionType) and not isinstance(holders[i], types.ModuleType)
            else value,
        )
        for i, attr, value in sites
    ]


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


Targets = list[tuple[Any, str, Any]]


def _mock_cycle(model: Any, only: tuple[str, ...] | None = None, targets: Targets | None = None) -> Callable[[], None]:
    targets = _targets(model, only) if targets is None else targets

    def op() -> None:
        patchers = [mock.patch.object(holder, attr, new) for holder, attr, new in targets]
        for p in patchers:
            p.start()
        for p in reversed(patchers):
            p.stop()

    return op


def _monkeypatch_cycle(
    model: Any, only: tuple[str, ...] | None = None, targets: Targets | None = None
) -> Callable[[], None]:
    targets = _targets(model, only) if targets is None else targets

    def op() -> None:
        mp = pytest.MonkeyPatch()
        for holder, attr, new in targets:
            mp.setattr(holder, attr, new)
        mp.undo()

    return op


def _wrapt_cycle(model: Any, only: tuple[str, ...] | None = None, targets: Targets | None = None) -> Callable[[], None]:
    wrapped = []
    for holder, attr, new in _targets(model, only) if targets is None else targets:

        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any, new: Any = new) -> Any:
            return new(*args, **kwargs)

        wrapped.append((holder, attr, wrapper))

    def op() -> None:
        saved = []
        for holder, attr, wrapper in wrapped:
            saved.append((holder, attr, vars(holder).get(attr, _MISSING)))
            wrapt.wrap_function_wrapper(holder, attr, wrapper)
        for holder, attr, before in reversed(saved):
            if before is _MISSING:
                delattr(holder, attr)
            else:
                setattr(holder, attr, before)

    return op


_MISSING = object()


FLOOR = "floor: lock, own dicts, ownership checked"


def _floor_cycle(model: Any, only: tuple[str, ...] | None = None, targets: Targets | None = None) -> Callable[[], None]:
    """The floor of an exact block (issue 43): the same objects on the same attributes, written into the holders'
    own dicts under a lock, and every attribute checked to hold its object before any is put back (no counts, no
    records, no plans, no second registry: what a block that restores exactly cannot do without)."""
    import threading

    lock = threading.RLock()
    spaces = [
        (vars(holder), attr, new) for holder, attr, new in (_targets(model, only) if targets is None else targets)
    ]

    def op() -> None:
        with lock:
            saved = [(ns, attr, ns.get(attr, _MISSING), new) for ns, attr, new in spaces]
            for ns, attr, _old, new in saved:
                ns[attr] = new
        with lock:
            for ns, attr, _old, new in saved:
                if ns.get(attr, _MISSING) is not new:
                    raise RuntimeError(f"{attr} no longer holds what the floor installed")
            for ns, attr, old, _new in reversed(saved):
                if old is _MISSING:
                    del ns[attr]
                else:
                    ns[attr] = old

    return op


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
