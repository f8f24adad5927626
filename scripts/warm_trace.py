"""``python scripts/warm_trace.py``: the Python calls, and the modules they are in, of one ``mtp_patched`` enter +
exit on the benchmarks' tiny GPTModel and HybridModel, one and three MTP layers, CPU: the first on a fresh model
(cold: it resolves and keeps the plan) and the fifth on the same model (warm: it re-uses it).

Traced with ``sys.setprofile``; per model two lines, cold and warm: the calls and their modules, then the warm
calls in order. Both run the same install loop (``take``) and release loop (``release``); the cold one resolves
first (``make_plan``). Then where a warm cycle's work goes, counted (``sys.monitoring``: the bytecode instructions
each function executes, deterministic on a busy machine), beside MonkeyPatch's on the same attributes and the
bench's floor, and the same cycle timed in pieces (the block, the engine's apply + revert, the install loop, the
ownership check, the release loop). The architecture and performance guides quote it.
"""

from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _traced(model: Any) -> list[tuple[str, str]]:
    from patches.megatron import mtp_patched

    calls: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append((Path(frame.f_code.co_filename).name, frame.f_code.co_name))

    sys.setprofile(profile)
    with mtp_patched(model, detach_encoder=True):
        pass
    sys.setprofile(None)
    return calls


def trace(model: Any, label: str) -> None:
    from patches.megatron import mtp_patched

    cold = _traced(model)
    for _ in range(3):
        with mtp_patched(model, detach_encoder=True):
            pass
    warm = _traced(model)
    for name, calls in (("cold", cold), ("warm", warm)):
        modules = collections.Counter(module for module, _f in calls)
        engine = [f for module, f in calls if module in ("_registry.py", "_state.py", "_plans.py")]
        print(f"{label}, {name}: {len(calls)} calls in {len(modules)} modules {dict(modules)}")
        print("    engine:", " ".join(dict.fromkeys(engine)))
    print("    warm, in order:", " ".join(f for _m, f in warm))


def bytecodes(op: Any) -> tuple[int, list[tuple[str, int]]]:
    """Bytecode instructions one call of ``op`` executes, and per function (most first): the bench's count."""
    from benchmarks._timing import instructions

    per: collections.Counter[str] = collections.Counter()
    return instructions(op, per) or 0, per.most_common()


def where_it_goes(model: Any, label: str) -> None:
    from benchmarks._sides import _floor_cycle, _monkeypatch_cycle, _patchreg_cycle, installed_sites, targets_at

    sites = installed_sites(model)
    sides = {
        "mtp_patched": _patchreg_cycle(model),
        "MonkeyPatch": _monkeypatch_cycle(model, targets=targets_at(model, sites)),
        "floor": _floor_cycle(model, targets=targets_at(model, sites)),
    }
    for op in sides.values():
        for _ in range(3):
            op()
    found = {name: bytecodes(op) for name, op in sides.items()}
    print(f"{label}, a warm cycle's bytecode instructions: " + ", ".join(f"{n} {t}" for n, (t, _f) in found.items()))
    print("    ours per function:", "; ".join(f"{f} {n}" for f, n in found["mtp_patched"][1][:12]))


def _median_ns(op: Any, number: int = 3000, repeat: int = 9) -> float:
    import statistics
    import timeit

    return statistics.median(timeit.repeat(op, number=number, repeat=repeat)) / number * 1e9


def where_the_time_goes(model: Any, label: str) -> None:
    """The warm cycle timed in pieces (medians, tight loop): the whole block, the block made but not entered, the
    engine's apply + revert, and inside it the install loop, the ownership check and the release loop (which runs the
    check again), each timed alone around one call on the block's own steps."""
    import time

    import patchreg
    from benchmarks._sides import _floor_cycle, _monkeypatch_cycle, _patchreg_cycle, installed_sites, targets_at
    from patches.megatron.mtp import MTPBlock
    from patchreg._ledger import Report
    from patchreg._plans import work
    from patchreg._state import LOCK, check_release, release, take

    registry, block = patchreg.registry, MTPBlock(model, True)
    patch_set = block.patch_set

    def engine() -> None:
        registry.revert(registry.apply(patch_set, model))

    sites = installed_sites(model)
    sides = {
        "mtp_patched": _patchreg_cycle(model),
        "MTPBlock(model) made, not entered": lambda: MTPBlock(model, True),
        "registry.apply + revert": engine,
        "MonkeyPatch, like for like": _monkeypatch_cycle(model, targets=targets_at(model, sites)),
        "floor": _floor_cycle(model, targets=targets_at(model, sites)),
    }
    for op in sides.values():
        for _ in range(200):
            op()
    found = {name: _median_ns(op) / 1000 for name, op in sides.items()}
    book = registry._book
    plan = book.plan_for(patch_set, model)
    steps, skipped = work(book, plan, model, None)
    clock, n = time.perf_counter_ns, 20000
    spent = [0, 0, 0]
    for _ in range(n):
        report = Report(registry, plan.name, skipped)
        with LOCK:
            t0 = clock()
            take(book, steps, report)
            t1 = clock()
            check_release(report.layers[::-1], False)
            t2 = clock()
            release(report)
            t3 = clock()
        spent[0], spent[1], spent[2] = spent[0] + t1 - t0, spent[1] + t2 - t1, spent[2] + t3 - t2
    loops = {"install loop (take)": spent[0], "ownership check (check_release)": spent[1]}
    loops["release loop (release, check included)"] = spent[2]
    print(f"{label}, a warm cycle in pieces (µs, medians, tight loop):")
    print("    " + "; ".join(f"{name} {us:.2f}" for name, us in found.items()))
    print("    " + "; ".join(f"{name} {total / n / 1000:.2f}" for name, total in loops.items()))


def main() -> int:
    warnings.filterwarnings("ignore")
    from benchmarks import _hybrid, _model

    for layers in (1, 3):
        trace(_model.build(layers), f"GPTModel, {layers} MTP layer(s)")
    if sys.version_info >= (3, 12):
        where_it_goes(_model.build(1), "GPTModel, 1 MTP layer")
        where_the_time_goes(_model.build(1), "GPTModel, 1 MTP layer")
    if _hybrid.available():
        for layers in (1, 3):
            trace(_hybrid.build(layers), f"HybridModel, {layers} MTP layer(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
