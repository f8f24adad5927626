"""Measurements on a tiny real Megatron-Core GPTModel: 1 (enter + exit vs the peers), 5 (training step), 6 (hygiene)."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import wrapt

import patchreg
from benchmarks import _model
from benchmarks._peers import PeerUnavailable, Sink, load_verl
from benchmarks._report import Check, Section
from benchmarks._settings import Settings
from benchmarks._timing import compare, looped

#: (holder path from the model, attribute) of the three MTP patches, as mock/monkeypatch/wrapt see them.
SITES = (("", "_postprocess"), ("mtp.layers.0", "_get_embeddings"), ("mtp.layers.0", "_checkpointed_forward"))


def ours() -> Any:
    """``patches.megatron.mtp`` (the module), or raise ImportError naming what is missing."""
    from patches.megatron import mtp

    return mtp


def mtp_predicates() -> tuple[list[patchreg.Predicate], str]:
    """The predicates of the MTP set (detach_encoder=True), for section 4."""
    mtp = ours()
    preds = [p.when for p in mtp.MTP_DETACH_SET]
    return (
        preds,
        f"the {len(preds)} `when=` predicates of `{mtp.MTP_DETACH_SET.name}` (what `mtp_patched(model, detach_encoder=True)` evaluates)",
    )


def _holder(model: Any, path: str) -> Any:
    holder = model
    for part in filter(None, path.split(".")):
        holder = holder[int(part)] if part.isdigit() else getattr(holder, part)
    return holder


def _replacements(model: Any) -> list[Any]:
    """The three replacements of our set, bound to their holders as an installer by hand would bind them."""
    funcs = [p.replacement for p in ours().MTP_DETACH_SET]
    return [
        f.__get__(_holder(model, path), type(_holder(model, path)))
        for f, (path, _attr) in zip(funcs, SITES, strict=True)
    ]


# -- the cycles -----------------------------------------------------------------------------


def _patchreg_cycle(model: Any) -> Callable[[], None]:
    mtp_patched = ours().mtp_patched

    def op() -> None:
        with mtp_patched(model, detach_encoder=True):
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


def _mock_cycle(model: Any) -> Callable[[], None]:
    targets = [(_holder(model, path), attr, new) for (path, attr), new in zip(SITES, _replacements(model), strict=True)]

    def op() -> None:
        patchers = [mock.patch.object(holder, attr, new) for holder, attr, new in targets]
        for p in patchers:
            p.start()
        for p in reversed(patchers):
            p.stop()

    return op


def _monkeypatch_cycle(model: Any) -> Callable[[], None]:
    targets = [(_holder(model, path), attr, new) for (path, attr), new in zip(SITES, _replacements(model), strict=True)]

    def op() -> None:
        mp = pytest.MonkeyPatch()
        for holder, attr, new in targets:
            mp.setattr(holder, attr, new)
        mp.undo()

    return op


def _wrapt_cycle(model: Any) -> Callable[[], None]:
    targets = []
    for (path, attr), new in zip(SITES, _replacements(model), strict=True):

        def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any, new: Any = new) -> Any:
            return new(*args, **kwargs)

        targets.append((_holder(model, path), attr, wrapper))

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


def cycles(settings: Settings) -> Section:
    """Section 1: enter + exit of mtp_patched vs verl's patch/unpatch, mock x3, monkeypatch x3, raw wrapt."""
    section = Section(
        1,
        "Enter + exit: `mtp_patched(model, detach_encoder=True)` vs the peers",
        ("side", "per cycle", "patchreg ÷ side"),
    )
    mtp = ours()
    variants: dict[str, Callable[[int], object]] = {}
    models = {}
    notes = []
    try:
        verl, provenance = load_verl()
        notes.append(f"verl: {provenance}; its `print` calls go to a discarding stdout during timing.")
    except PeerUnavailable as exc:
        verl = None
        notes.append(f"verl could not be measured: {exc}.")
    names = [
        "patchreg mtp_patched",
        "verl 0.9.1 patch+unpatch",
        "mock.patch.object x3",
        "MonkeyPatch x3 + undo",
        "wrapt x3 + manual restore",
    ]
    builders = [
        lambda m: _patchreg_cycle(m),
        (lambda m: _verl_cycle(verl, m)) if verl is not None else None,
        _mock_cycle,
        _monkeypatch_cycle,
        _wrapt_cycle,
    ]
    for name, builder in zip(names, builders, strict=True):
        if builder is None:
            continue
        models[name] = _model.build()
        variants[name] = looped(builder(models[name]))
    with patchreg.Registry("bench-probe").patched(mtp.MTP_DETACH_SET, models[names[0]]) as report:
        installed = report.installed
        skipped = [n for n, _ in report.skipped]
    with _quiet_stdout():
        cmp = compare(variants, number=settings.cycle_ops, repeat=settings.repeat, warmup=2)
    ours_name = names[0]
    for name in variants:
        ratio = cmp.ratio(ours_name, name)
        section.rows.append((name, cmp.stats[name].us(), "-" if name == ours_name else f"{ratio.median:.3f}x"))
    ours_us = cmp.stats[ours_name].median / 1e3
    section.checks.append(Check("enter + exit, mtp_patched", f"{ours_us:.2f} µs", "<= 10 µs", ours_us <= 10))
    for peer, bar in (("verl 0.9.1 patch+unpatch", 0.1), ("mock.patch.object x3", 0.3)):
        if peer in variants:
            r = cmp.ratio(ours_name, peer).median
            section.checks.append(
                Check(f"enter + exit vs {peer.split(' patch')[0]}", f"{r:.3f}x", f"<= {bar}x", r <= bar)
            )
        else:
            section.checks.append(Check(f"enter + exit vs {peer}", "-", f"<= {bar}x", None))
    section.notes = [
        f"Our block installs {installed} patch(es) on this megatron-core"
        + (f" (skipped by predicate: {', '.join(skipped)})" if skipped else "")
        + "; each side runs on its own freshly built model of the same configuration (so leftovers of one side, "
        "e.g. verl's `_postprocess_backup`, cannot change another's path).",
        "mock, MonkeyPatch and wrapt install the same three replacements on the same three attributes "
        "(the model's `_postprocess`, MTP layer 0's `_get_embeddings` and `_checkpointed_forward`).",
        *notes,
    ]
    return section


# -- 6. memory hygiene ----------------------------------------------------------------------


def _alive_after(n: int, cycle: Callable[[Any], None] | None) -> int:
    """With gc disabled: build, patch, revert and drop ``n`` models; how many are still alive."""
    refs = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            model = _model.build()
            if cycle is not None:
                cycle(model)
            refs.append(weakref.ref(model))
            del model
        alive = sum(ref() is not None for ref in refs)
    finally:
        gc.enable()
        gc.collect()
    return alive


def hygiene(settings: Settings) -> Section:
    """Section 6: models left alive (with gc off) after patch + revert + drop."""
    mtp = ours()
    n = settings.hygiene_models

    def ours_cycle(model: Any) -> None:
        with mtp.mtp_patched(model, detach_encoder=True) as report:
            assert report.installed > 0, "mtp_patched installed nothing"

    section = Section(
        6,
        f"Memory hygiene: {n} models built, patched, reverted and dropped with gc disabled",
        ("side", "models still alive"),
    )
    baseline = _alive_after(n, None)
    alive = _alive_after(n, ours_cycle)
    section.rows += [("no patch (baseline)", str(baseline)), ("patchreg mtp_patched", str(alive))]
    try:
        verl, _ = load_verl()
    except PeerUnavailable as exc:
        section.rows.append(("verl 0.9.1", f"not measured: {exc}"))
    else:
        with _quiet_stdout():
            verl_alive = _alive_after(n, lambda m: _verl_cycle(verl, m)())
        section.rows.append(("verl 0.9.1 patch+unpatch", str(verl_alive)))
    section.checks.append(Check("models alive after revert + drop (gc off)", f"{alive} of {n}", "0", alive == 0))
    section.notes = [
        "Alive = a weak reference to the model still resolves after the last strong reference is dropped, "
        "with the cyclic garbage collector disabled; only reference cycles keep a dropped model alive.",
        "verl's unpatch leaves `_postprocess` (a bound method of the model) and `_postprocess_backup` in the "
        "model's `__dict__`: a reference cycle, so each model waits for the cyclic collector.",
    ]
    return section


# -- 5. training step -----------------------------------------------------------------------


def training_step(settings: Settings) -> Section:
    """Section 5: placeholder until cpu_patched lands."""
    return Section(5, "Training step", notes=["pending"])
