"""Timing loops: ``time.perf_counter_ns``, gc disabled inside each timed block, medians with min/max.

Variants of one comparison are timed interleaved (the order rotates every repetition), so
a noisy neighbour slows all of them alike; ratios are the median of the per-repetition ratios.
"""

from __future__ import annotations

import collections
import gc
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A variant runs its operation ``n`` times in its own loop.
Loop = Callable[[int], object]


@dataclass(frozen=True)
class Stats:
    """Nanoseconds per operation over the repetitions: median, min, max."""

    median: float
    min: float
    max: float
    samples: int

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        return cls(statistics.median(values), min(values), max(values), len(values))

    def us(self) -> str:
        """``median µs (min-max)``."""
        return f"{self.median / 1e3:.2f} µs ({self.min / 1e3:.2f}-{self.max / 1e3:.2f})"


@dataclass(frozen=True)
class Comparison:
    """Stats per variant and per-repetition samples, so ratios can be taken pair by pair."""

    stats: dict[str, Stats]
    samples: dict[str, list[float]]

    def ratio(self, a: str, b: str) -> Stats:
        """``a / b``: the median, min and max of the per-repetition ratios."""
        return Stats.of([x / y for x, y in zip(self.samples[a], self.samples[b], strict=True)])


def looped(op: Callable[[], object]) -> Loop:
    """A loop calling ``op`` ``n`` times (for operations of a microsecond or more)."""

    def loop(n: int) -> None:
        for _ in range(n):
            op()

    return loop


def timed(loop: Loop, n: int) -> float:
    """Nanoseconds per operation of one block of ``n``, with the garbage collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        loop(n)
        elapsed = time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()
    return elapsed / n


def compare(
    variants: Mapping[str, Loop],
    *,
    number: int | Mapping[str, int],
    repeat: int,
    warmup: int = 1,
    before: Callable[[], object] | None = None,
) -> Comparison:
    """Time every variant ``repeat`` times (blocks of ``number`` operations, or ``number[name]``), interleaved.

    With ``before``, it runs (untimed) ahead of every block: e.g. a training step, so that a block of
    one operation costs what it costs where a program really runs it, with the caches a step leaves.
    """
    names = list(variants)
    numbers = {name: number if isinstance(number, int) else number[name] for name in names}
    for name in names:
        for _ in range(warmup):
            if before is not None:
                before()
            variants[name](max(1, numbers[name] // 4))
    gc.collect()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if before is not None:
                before()
            samples[name].append(timed(variants[name], numbers[name]))
    return Comparison({n: Stats.of(v) for n, v in samples.items()}, samples)


def instructions(op: Callable[[], object], per_function: collections.Counter[str] | None = None) -> int | None:
    """How many bytecode instructions one call of ``op`` executes beyond a call of an empty function, every
    frame included (``sys.monitoring``, Python 3.12+): a count no noise changes, and what a cycle pays
    per instruction when caches are cold. ``per_function``: also counted per function (``"qualname (file)"``).

    None where ``sys.monitoring`` is missing or its tool slot is taken (a debugger, coverage).
    """
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        return None
    tool = monitoring.PROFILER_ID
    try:
        monitoring.use_tool_id(tool, "patchreg-bench")
    except ValueError:
        return None
    try:
        return _count(monitoring, tool, op, per_function) - _count(monitoring, tool, _nothing)
    finally:
        monitoring.free_tool_id(tool)


def _nothing() -> None:
    return None


def _count(monitoring: Any, tool: int, op: Callable[[], object], per: collections.Counter[str] | None = None) -> int:
    count = [0]

    def seen(code: Any, _offset: int) -> None:
        count[0] += 1
        if per is not None and code.co_filename != __file__:  # (this module's own frames: the empty call's share)
            per[f"{code.co_qualname} ({Path(code.co_filename).name})"] += 1

    op()  # once uncounted: caches, plans and specialisations settle as in the timed loops
    monitoring.register_callback(tool, monitoring.events.INSTRUCTION, seen)
    monitoring.set_events(tool, monitoring.events.INSTRUCTION)
    try:
        op()
    finally:
        monitoring.set_events(tool, 0)
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, None)
    return count[0]
