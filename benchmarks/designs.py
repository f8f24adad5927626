"""``python -m benchmarks.designs [--runs N] [--out PATH]``: designs of the MTP block that were not taken, timed
right after a training step in section 1's run of every side, each one in place of ``mtp_patched``.

Issue 17 asks for at most 1.0x every like-for-like peer there. These prototypes measure what that would take.
The block prototypes keep the engine's apply and release (the plan, its guard, the layers, the lock) and change
only the block around them; the leaner-engine ones also replace the engine's clean path (a layer per install and
no ledger; a tuple per install), to show where the engine's own cost is. They are measurement code and not
candidates as written: each drops something the real block or engine guarantees, named in :data:`DESIGNS`. The
process runs every design ``--runs`` times, in turn. It writes ``benchmarks/DESIGNS.md``, about two and a half
minutes on the project's VM. It is not part of ``make bench`` or CI.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import patchreg
from benchmarks import _machine, _model
from benchmarks._peers import PeerUnavailable, load_verl
from benchmarks._report import table, write
from benchmarks._settings import Settings
from benchmarks._sides import SITES, _apply_revert, _patchreg_cycle, ours, probe
from benchmarks._timing import looped
from patchreg._clean import apply_planned as _apply_planned
from patchreg._clean import release as _release_ledger
from patchreg._layers import Layer
from patchreg._namespace import ABSENT as _ABSENT
from patchreg._store import LOCK, Ledger
from patchreg._targets import identity

try:
    from patches.megatron._loss import last_losses
except ImportError:  # no megatron-core: nothing here runs
    last_losses = None

DEFAULT_OUT = Path(__file__).parent / "DESIGNS.md"
_thread = threading.get_ident
_acquire, _release = LOCK.acquire, LOCK.release
_new = object.__new__
_MethodType = types.MethodType
_time_ns = time.time_ns
_SET: Any = None  # the MTP set the prototypes apply


class _Report:
    """A prototype's per-enter report: the engine's report, the block, the state and the losses' mark (five
    fields where ``MTPReport`` has eight; no note, model class or models of its own)."""

    __slots__ = ("_after", "_losses", "active", "block", "report")


class _OneFrame:
    """Enter and exit in one frame each: no ``open()`` / ``close()`` hooks and no ``__init__`` frame. Drops: the
    handling of an exit on another thread or without an enter, wrapped models and chunks, the note of a model
    without MTP layers; and it writes the block's private fields from the patch set."""

    __slots__ = ("_entered", "_open", "detach_encoder", "obj", "registry", "strict", "target")

    def __enter__(self) -> _Report:
        report = self.registry.apply(self.target, self.obj, strict=self.strict)
        made = _Report()
        made.report = report
        made.block = self
        made.active = True
        made._after = last_losses.count
        made._losses = ()
        self._entered = True
        self._open.append((_thread(), report, made))
        return made

    def __exit__(self, *exc: object) -> None:
        entered = self._open
        entry = entered[-1]
        report, registry = entry[1], self.registry
        if type(report) is Ledger and report.owner is registry:
            _acquire()
            try:
                _release_ledger(registry._installs, report)  # the engine's release, as the real block's exit
            finally:
                _release()
        entered.remove(entry)
        made = entry[2]
        if last_losses.count != made._after:
            made._losses = ()  # (the real block reads the losses here)
        made.active = False


class _InFields(_OneFrame):
    """As :class:`_OneFrame`, with the enter held in three fields instead of a tuple in a list made per block.
    Drops also: nested enters and a second thread's enter (no list to hold them, no lock on the fields)."""

    __slots__ = ("_by", "_report", "_value")

    def __enter__(self) -> _Report:  # (the report is built here again, not in a helper: a frame is what it saves)
        report = self.registry.apply(self.target, self.obj, strict=self.strict)
        made = _Report()
        made.report = report
        made.block = self
        made.active = True
        made._after = last_losses.count
        made._losses = ()
        self._by, self._report, self._value = _thread(), report, made
        return made

    def __exit__(self, *exc: object) -> None:
        report, registry = self._report, self.registry
        if self._by == _thread() and type(report) is Ledger and report.owner is registry:
            _acquire()
            try:
                _release_ledger(registry._installs, report)  # the engine's release, as the real block's exit
            finally:
                _release()
        made = self._value
        self._by, self._report, self._value = 0, None, None
        if last_losses.count != made._after:
            made._losses = ()
        made.active = False


def _block(kind: type[_OneFrame], model: Any) -> _OneFrame:
    """A prototype block on ``model`` (a bare GPTModel), built as ``mtp_patched`` builds one, without a frame."""
    block = _new(kind)
    block.detach_encoder = True
    block.target = _SET
    block.registry = patchreg.registry
    block.obj = model
    block.strict = False
    block._open = []
    block._entered = False
    return block


def _made_once(model: Any) -> Callable[[], None]:
    block = ours().mtp_patched(model, detach_encoder=True)

    def op() -> None:
        with block:
            pass

    return op


def _fresh(kind: type[_OneFrame]) -> Callable[[Any], Callable[[], None]]:
    def build(model: Any) -> Callable[[], None]:
        global _SET
        _SET = ours().MTP_DETACH_SET  # (read once: ours() imports)

        def op() -> None:
            with _block(kind, model):
                pass

        return op

    return build


def _one_frame_made_once(model: Any) -> Callable[[], None]:
    global _SET
    _SET = ours().MTP_DETACH_SET
    block = _block(_OneFrame, model)

    def op() -> None:
        with block:
            pass

    return op


class _Lean(_OneFrame):
    """One frame per enter and exit over a leaner engine: the plan and its guard, the class checks and the lock kept,
    but per install one ``(namespace, attribute, method)`` tuple in the enter's list instead of a layer on the
    attribute's stack, a weak reference and the ledger. What a redesign of the engine's records might reach at
    most. Drops also: sharing and counting between blocks, conflicts with other registries, ``explain``, holding
    the model weakly while patched."""

    __slots__ = ("plan",)

    def __enter__(self) -> _Report:
        plan = self.plan
        obj = self.obj
        if not plan.holds(obj):
            raise RuntimeError("the plan is stale")
        done = []
        _acquire()
        try:
            for stack, cls, view, raw, attr, replacement, _patch, layers_on in plan.bound:
                holder = stack.ref()
                if type(holder) is not cls or view.get(attr, _ABSENT) is not raw:
                    raise RuntimeError("the plan is stale")
                ns = holder.__dict__
                if layers_on or attr in ns:
                    raise RuntimeError("not a clean install")
                value = ns[attr] = _MethodType(replacement, holder)
                done.append((ns, attr, value))
        finally:
            _release()
        made = _Report()
        made.report = done
        made.block = self
        made.active = True
        made._after = last_losses.count
        made._losses = ()
        self._entered = True
        self._open.append((_thread(), done, made))
        return made

    def __exit__(self, *exc: object) -> None:
        entered = self._open
        entry = entered[-1]
        _acquire()
        try:
            for ns, attr, value in reversed(entry[1]):
                if ns.get(attr) is value:
                    del ns[attr]
        finally:
            _release()
        entered.remove(entry)
        made = entry[2]
        if last_losses.count != made._after:
            made._losses = ()
        made.active = False


class _Direct(_OneFrame):
    """As :class:`_OneFrame`, calling the remembered plan's apply (``patchreg._clean.apply_planned``) itself:
    no ``Registry.apply`` frame and no look-up of the plan by the set and the object. Drops also: a plan made
    stale by ``refresh()`` or a new object is not noticed."""

    __slots__ = ("plan",)

    def __enter__(self) -> _Report:
        registry = self.registry
        report = _apply_planned(registry, registry._installs, self.plan, self.obj, False, None)
        made = _Report()
        made.report = report
        made.block = self
        made.active = True
        made._after = last_losses.count
        made._losses = ()
        self._entered = True
        self._open.append((_thread(), report, made))
        return made


class _LeanLayers(_Lean):
    """As :class:`_Lean`, with the engine's layer record per install, on the attribute's stack (what sharing,
    conflicts and ``explain`` read), holding what it installed by weak reference; no ledger, no checks of the
    layers at release but that the attribute still holds what was installed."""

    __slots__ = ()

    def __enter__(self) -> _Report:
        plan = self.plan
        obj = self.obj
        if not plan.holds(obj):
            raise RuntimeError("the plan is stale")
        done = []
        _acquire()
        try:
            now = _time_ns()
            for stack, cls, view, raw, attr, replacement, patch, layers_on in plan.bound:
                holder = stack.ref()
                if type(holder) is not cls or view.get(attr, _ABSENT) is not raw:
                    raise RuntimeError("the plan is stale")
                ns = holder.__dict__
                if layers_on or attr in ns:
                    raise RuntimeError("not a clean install")
                value = ns[attr] = _MethodType(replacement, holder)
                layer = Layer()
                layer.patch = patch
                layer.stack = stack
                layer.count = 1
                layer.since = now
                layer.seq = 0
                layer.original = _ABSENT
                layer.installed = weakref.ref(value)
                layers_on.append(layer)
                done.append(layer)
        finally:
            _release()
        made = _Report()
        made.report = done
        made.block = self
        made.active = True
        made._after = last_losses.count
        made._losses = ()
        self._entered = True
        self._open.append((_thread(), done, made))
        return made

    def __exit__(self, *exc: object) -> None:
        entered = self._open
        entry = entered[-1]
        _acquire()
        try:
            for layer in reversed(entry[1]):
                stack = layer.stack
                mine = layer.installed()
                ns = mine.__self__.__dict__
                if ns.get(stack.attr) is mine:
                    del ns[stack.attr]
                stack.layers.pop()
                layer.count = 0
        finally:
            _release()
        entered.remove(entry)
        made = entry[2]
        if last_losses.count != made._after:
            made._losses = ()
        made.active = False


def _planned(kind: type[_OneFrame]) -> Callable[[Any], Callable[[], None]]:
    """Cycles of a prototype that is handed the registry's plan of the MTP set on the model."""

    def build(model: Any) -> Callable[[], None]:
        global _SET
        _SET = ours().MTP_DETACH_SET
        registry = patchreg.registry
        for _ in range(2):  # the second apply makes the plan
            registry.revert(registry.apply(_SET, model))
        plan = registry._plans[(identity(_SET), identity(model))]
        assert plan.bound is not None, "the MTP set's plan installs bound methods"

        def op() -> None:
            block = _block(kind, model)
            block.plan = plan  # type: ignore[attr-defined]
            with block:
                pass

        return op

    return build


#: label -> (builder of one cycle on a model, what it keeps and drops of the real block)
DESIGNS: dict[str, tuple[Callable[[Any], Callable[[], None]], str]] = {
    "today: `with mtp_patched(model):` per step": (_patchreg_cycle, "the real block: what section 1 checks"),
    "the real block made once, entered per step": (
        _made_once,
        "keeps every guarantee: a way to use `mtp_patched` today (the block is reusable and nests)",
    ),
    "one frame per enter and exit, a block per step": (
        _fresh(_OneFrame),
        "drops misuse handling, wrappers, chunks and the no-MTP note; writes the engine's private fields",
    ),
    "as above, the enter in three fields (no list, no tuple)": (
        _fresh(_InFields),
        "drops also nested enters and thread safety of two threads' enters",
    ),
    "one frame per enter and exit, the block made once": (
        _one_frame_made_once,
        "as the one-frame block; made once, as in the second row",
    ),
    "one frame per enter and exit calling the plan's apply itself, a block per step": (
        _planned(_Direct),
        "as the one-frame block, and the plan's look-up: a plan made stale by `refresh()` goes unnoticed",
    ),
    "one frame over a leaner engine: a layer per install, no ledger, a block per step": (
        _planned(_LeanLayers),
        "as the one-frame block; installs only clean ones (refuses what the engine would share, count or "
        "stack), no ledger (reports, checkpoints), at release checks only that the attribute holds what it installed",
    ),
    "one frame over a leaner engine: a tuple per install, a block per step": (
        _planned(_Lean),
        "as the row above, and no layer records: sharing, conflicts, explain, holding the model weakly",
    ),
    "the engine alone: `registry.apply` + `registry.revert`, no block": (
        _apply_revert,
        "no block at all: the floor of any design on this engine",
    ),
}

#: peer -> its row in section 1: like for like where our block installs fewer than the three attributes, else the
#: x3 row (the same work then, as section 1 checks it)
PEERS = {
    "MonkeyPatch": ("MonkeyPatch x{n} + undo (like for like)", "MonkeyPatch x3 + undo"),
    "wrapt": ("wrapt x{n} + manual restore (like for like)", "wrapt x3 + manual restore"),
}
PEERS["mock"] = ("mock.patch.object x{n} (like for like)", "mock.patch.object x3")


def measure(runs: int) -> dict[str, dict[str, list[float]]]:
    """Per design and peer, the after-step ratio (design / peer, medians of one run) of each run."""
    from benchmarks import cycles

    try:
        verl: Any = load_verl()[0]
    except PeerUnavailable:
        verl = None
    installed, _skipped, only = probe()
    settings = Settings.full()
    found: dict[str, dict[str, list[float]]] = {label: {peer: [] for peer in PEERS} for label in DESIGNS}
    for run in range(runs):
        for label, (build, _what) in DESIGNS.items():
            names, builders = cycles.every_side(verl, installed, only, ours=build)
            variants = {n: looped(b(_model.build())) for n, b in zip(names, builders, strict=True) if b is not None}
            gc.collect()  # the models of the design before
            after = cycles._after_a_step(variants, settings)
            for peer, (like, every) in PEERS.items():
                row = like.format(n=installed) if installed < len(SITES) else every
                found[label][peer].append(after.ratio(names[0], row).median)
        print(f"[designs] run {run + 1} of {runs} done", flush=True)
    return found


def render(found: dict[str, dict[str, list[float]]], runs: int, seconds: float) -> str:
    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.3f}x ({min(values):.3f}-{max(values):.3f})"

    rows = [(label, *(cell(found[label][p]) for p in PEERS), DESIGNS[label][1]) for label in DESIGNS]
    lines = [
        "# Designs of the MTP block, right after a training step",
        "",
        "Written by `python -m benchmarks.designs` (`make bench-designs`). Do not edit by hand.",
        "",
        table(("what", "value"), _machine.describe()),
        "",
        f"Each design takes the place of `mtp_patched` in section 1's run of every side (verl, mock, MonkeyPatch "
        f"and wrapt x3 and like for like, the engine alone, the lock), its cycle timed right after a training step "
        f"as there; {runs} runs, the designs in turn. A cell: the median over the runs of each run's ratio of "
        f"medians (the lowest and highest run in brackets). Issue 17's target: at most 1.0x every peer. "
        f"{seconds:.0f} s.",
        "",
        table(("design", *(f"÷ {p} (like for like)" for p in PEERS), "keeps / drops"), rows),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.designs", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs of every design (default 3)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the report (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    from benchmarks.__main__ import _quiet

    _quiet()
    started = time.perf_counter()
    found = measure(args.runs)
    write(args.out, render(found, args.runs, time.perf_counter() - started), "designs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
