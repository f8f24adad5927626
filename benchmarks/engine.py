"""Engine-only measurements: 2 (scaling), 3 (call overhead), 4 (predicates cold and warm)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import wrapt

import patchreg
from benchmarks import _trees
from benchmarks._report import Check, Section
from benchmarks._settings import Settings
from benchmarks._timing import Loop, Stats, compare, looped
from patchreg import Patch, PatchSet, Predicate, Registry, Selector

SIZES = (1, 8, 64, 512)


# -- 2. scaling -------------------------------------------------------------------------


SCALE_SET = PatchSet(
    "bench.scale", [Patch("bench.scale.embeddings", "mtp.layers[*]._get_embeddings", _trees.leaf_embeddings)]
)


def per_target(
    label: str, cycles: dict[int, tuple[Callable[[], object], int]], settings: Settings
) -> tuple[list[tuple[str, ...]], float, float]:
    """Time every ``(cycle, targets)`` of a series, interleaved: rows, the max/min of the per-target medians, and
    the max/min of the cost per further target (issue 6 as decided in issue 17: flat within 1.5x)."""
    variants = {str(n): looped(op) for n, (op, _targets) in cycles.items()}
    numbers = {str(n): max(2, settings.scale_ops // targets) for n, (_op, targets) in cycles.items()}
    stats = compare(variants, number=numbers, repeat=settings.repeat).stats
    rows, medians, further = [], [], []
    first_n, first_targets = next(iter(cycles)), next(iter(cycles.values()))[1]
    for n, (_op, targets) in cycles.items():
        cycle = stats[str(n)]
        per = Stats(cycle.median / targets, cycle.min / targets, cycle.max / targets, cycle.samples)
        medians.append(per.median)
        extra = targets - first_targets  # each further target's cost: the block's fixed cost taken out
        cost = (cycle.median - stats[str(first_n)].median) / extra if extra else None
        if cost is not None and cost > 0:
            further.append(cost)
        rows.append(
            (label, str(n), str(targets), cycle.us(), per.us(), "-" if cost is None else f"{cost / 1e3:.2f} µs")
        )
    flat = max(further) / min(further) if further else float("nan")
    return rows, max(medians) / min(medians), flat


def tree_scaling(settings: Settings) -> tuple[list[tuple[str, ...]], float, float]:
    """Apply + revert of one selector patch on nn.Module trees of 1 to 512 leaves."""
    registry = Registry("bench-scaling")
    cycles: dict[int, tuple[Callable[[], object], int]] = {}
    for n in SIZES:
        tree = _trees.Tree(n)

        def op(tree: _trees.Tree = tree) -> None:
            registry.revert(registry.apply(SCALE_SET, tree))

        cycles[n] = (op, n)
    rows, spread, flat = per_target("nn.Module tree, one selector patch", cycles, settings)
    assert not registry.active(), "the scaling benchmark left patches installed"
    return rows, spread, flat


# -- 3. call overhead -------------------------------------------------------------------


def _calls(obj: Any) -> Loop:
    def loop(n: int) -> None:
        step = 1
        for _ in range(n):
            obj.step(step)

    return loop


def call_overhead(settings: Settings) -> Section:
    """Calls through registry installs vs the same object installed by hand or by wrapt."""
    registry = Registry("bench-calls")
    mod = "benchmarks._trees"
    replace_cls = Patch("bench.replace-class", f"{mod}:ReplaceByRegistry.step", _trees.fast_step)
    wrap_cls = Patch("bench.wrap-class", f"{mod}:WrapByRegistry.step", _trees.passthrough, kind="wrap")
    replace_obj = Patch("bench.replace-instance", Selector("step"), _trees.fast_step)
    wrap_obj = Patch("bench.wrap-instance", Selector("step"), _trees.passthrough, kind="wrap")
    objs = {k: _trees.Plain() for k in ("replace-reg", "replace-hand", "wrap-reg", "wrap-wrapt")}

    reports = [registry.apply(replace_cls), registry.apply(wrap_cls)]
    reports.append(registry.apply(replace_obj, objs["replace-reg"]))
    reports.append(registry.apply(wrap_obj, objs["wrap-reg"]))
    hand = objs["replace-hand"]
    vars(hand)["step"] = _trees.fast_step.__get__(hand, type(hand))
    raw = objs["wrap-wrapt"]
    vars(raw)["step"] = wrapt.FunctionWrapper(raw.step, _trees.passthrough)
    original_hand_step = vars(_trees.ReplaceByHand)["step"]
    _trees.ReplaceByHand.step = _trees.fast_step  # type: ignore[method-assign]
    wrapt.wrap_function_wrapper(mod, "WrapByWrapt.step", _trees.passthrough)
    try:
        pairs = [
            ("replace, class attribute", "registry", _trees.ReplaceByRegistry(), "by hand", _trees.ReplaceByHand()),
            ("replace, instance (bound)", "registry", objs["replace-reg"], "by hand", hand),
            (
                "wrap, class attribute",
                "registry",
                _trees.WrapByRegistry(),
                "wrapt.wrap_function_wrapper",
                _trees.WrapByWrapt(),
            ),
            ("wrap, instance", "registry", objs["wrap-reg"], "wrapt.FunctionWrapper", raw),
        ]
        rows, checks = [], []
        for label, ours_name, ours, theirs_name, theirs in pairs:
            cmp = compare(
                {"ours": _calls(ours), "theirs": _calls(theirs)}, number=settings.call_ops, repeat=settings.repeat
            )
            ratio = cmp.ratio("ours", "theirs")
            ns = lambda s: f"{s.median:.0f} ns ({s.min:.0f}-{s.max:.0f})"  # noqa: E731
            rows.append(
                (
                    label,
                    f"{ours_name}: {ns(cmp.stats['ours'])}",
                    f"{theirs_name}: {ns(cmp.stats['theirs'])}",
                    f"{ratio.median:.3f}x",
                )
            )
            checks.append(
                Check(f"call, {label}, vs {theirs_name}", f"{ratio.median:.3f}x", "<= 1.1x", ratio.median <= 1.1)
            )
    finally:
        for report in reversed(reports):
            registry.revert(report)
        _trees.ReplaceByHand.step = original_hand_step  # type: ignore[method-assign]
        _trees.WrapByWrapt.step = vars(_trees.WrapByWrapt)["step"].__wrapped__  # type: ignore[attr-defined]
    return Section(
        3,
        "Call overhead of an installed patch",
        ("install", "patchreg", "peer", "ratio"),
        rows,
        checks,
        [
            "Per call of `obj.step(1)` in a Python loop (loop cost included on both sides).",
            "The registry installs the same kind of object a careful hand would: a plain function on the class, "
            "a bound method in `vars(instance)`, a `wrapt.FunctionWrapper`; the ratio shows no hidden indirection.",
        ],
    )


# -- 4. predicates ----------------------------------------------------------------------


def predicates(
    settings: Settings, preds: Sequence[Predicate], source: str, first_use: Callable[[], float] | None = None
) -> Section:
    """Evaluate every predicate at first use in fresh processes (``first_use``: one run, in ns), cold
    (after ``refresh()``) and warm (cached)."""
    cold: list[float] = []
    for _ in range(settings.cold_repeat):
        patchreg.refresh()
        gc.disable()
        start = time.perf_counter_ns()
        for pred in preds:
            pred.evaluate()
        cold.append(time.perf_counter_ns() - start)
        gc.enable()
    cold_stats = Stats.of(cold)

    def warm(n: int) -> None:
        for _ in range(n):
            for pred in preds:
                pred.evaluate()

    w = compare({"warm": warm}, number=settings.warm_ops, repeat=settings.repeat).stats["warm"]
    per = Stats(w.median / len(preds), w.min / len(preds), w.max / len(preds), w.samples)
    reasons = [pred.evaluate().reason for pred in preds]
    cold_ms = cold_stats.median / 1e6
    first = Stats.of([first_use() for _ in range(settings.first_use_runs)]) if first_use is not None else None
    first_ms = first.median / 1e6 if first is not None else None
    checked_ms = first_ms if first_ms is not None else cold_ms
    return Section(
        4,
        "First use: predicates cold and warm",
        ("predicates", "first use, all (ms)", "cold after refresh(), all (ms)", "warm, per predicate"),
        [
            (
                str(len(preds)),
                "-" if first is None else f"{first_ms:.3f} ({first.min / 1e6:.3f}-{first.max / 1e6:.3f})",
                f"{cold_ms:.3f} ({cold_stats.min / 1e6:.3f}-{cold_stats.max / 1e6:.3f})",
                f"{per.median:.0f} ns ({per.min:.0f}-{per.max:.0f})",
            )
        ],
        [
            Check(
                "predicates at first use, whole MTP set" if first is not None else "predicates cold, whole MTP set",
                f"{checked_ms:.3f} ms",
                "<= 5 ms",
                checked_ms <= 5.0,
            ),
            Check("predicate warm, per predicate", f"{per.median:.0f} ns", "<= 1 µs", per.median <= 1000),
        ],
        [
            f"Predicates: {source}.",
            f"First use = the first evaluation in a fresh process ({settings.first_use_runs} processes; "
            "Megatron-Core's modules imported, as they are once a model exists, and nothing evaluated yet): what "
            "the target is checked on. Cold after `refresh()` = the same in this process, with the answers and "
            "importlib's caches dropped but the interpreter's other caches warm.",
            *(f"`{pred.describe()}` → {reason}" for pred, reason in zip(preds, reasons, strict=True)),
        ],
    )
