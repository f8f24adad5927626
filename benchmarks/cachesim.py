"""``python -m benchmarks.cachesim [--cycles N] [--out PATH]``: the after-step cycle, counted instead of timed.

Each like-for-like side's enter + exit runs right after a training step, as in section 1's after-step rows,
under valgrind's cache simulator (callgrind), with the simulated last level set to this machine's L2: what a
step evicts. A process per side runs every side interleaved (the same mix for each) and counts one side's
cycles only. Counts do not depend on the machine's load: where timing right after a step varies by 10 %
between runs of the VM, these move by a few per cent (the layout of memory). Their ratio between two sides is
what the after-step ratio is made of: every line a cycle needs that the step evicted is fetched from the next
level. Slow: valgrind runs the import of torch and Megatron-Core too, about 12 minutes per side, two sides at
a time (about 35 minutes). Not part of ``make bench`` or CI; needs ``valgrind`` on the PATH
(``apt install valgrind``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import operator
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks._report import write
from benchmarks._sides import ENGINE, probe

DEFAULT_OUT = Path(__file__).parent / "CACHESIM.md"
#: the sides, each with its row label (``{n}``: how many patches our block installs, which the peers patch too)
SIDES = {
    "ours": "patchreg mtp_patched",
    "engine": ENGINE,
    "mock": "mock.patch.object x{n} (like for like)",
    "monkeypatch": "MonkeyPatch x{n} + undo (like for like)",
    "wrapt": "wrapt x{n} + manual restore (like for like)",
}


def _sides() -> dict[str, Callable[[], None]]:
    from benchmarks import _model
    from benchmarks._sides import _engine_cycle, _mock_cycle, _monkeypatch_cycle, _patchreg_cycle, _wrapt_cycle

    only = probe()[2]
    return {
        "ours": _patchreg_cycle(_model.build()),
        "engine": _engine_cycle(_model.build()),
        "mock": _mock_cycle(_model.build(), only),
        "monkeypatch": _monkeypatch_cycle(_model.build(), only),
        "wrapt": _wrapt_cycle(_model.build(), only),
    }


def child(side: str, cycles: int) -> None:
    """Every side interleaved with steps; ``side``'s cycles run inside ``operator.call``, the one C function
    the parent tells callgrind to count (nothing else in the process calls it)."""
    import gc
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("megatron").setLevel(logging.ERROR)
    from benchmarks import _step
    from benchmarks._sides import ours

    sides = _sides()
    model, batch = _step.model_and_batch()
    gc.disable()  # a collection inside a counted cycle would count as the cycle's
    with _step.cpu_block(), ours().mtp_patched(model, detach_encoder=True):
        for _ in range(3):  # plans made, caches settled
            for op in sides.values():
                _step.forward_backward(model, batch)
                op()
        for _ in range(cycles):
            for name, op in sides.items():
                _step.forward_backward(model, batch)
                if name == side:
                    operator.call(op)
                else:
                    op()


def l2_cache() -> tuple[int, int, int]:
    """This machine's L2 (size, ways, line) from sysfs; 2 MiB, 16 ways, 64 B where it says nothing."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2" and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip().upper()
                n = int(size.rstrip("KMB"))
                n *= 1024 * 1024 if size.endswith("M") else 1024 if size.endswith("K") else 1
                ways = int((index / "ways_of_associativity").read_text())
                line = int((index / "coherency_line_size").read_text())
                return n, ways, line
        except (OSError, ValueError):
            break
    return 2 * 1024 * 1024, 16, 64


def totals(text: str) -> dict[str, int]:
    """The event totals of a callgrind output file (its ``events:`` and ``summary:`` lines)."""
    events: list[str] = []
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")) and events:
            return dict(zip(events, map(int, line.split()[1:]), strict=False))
    raise ValueError("no 'events:' and 'summary:' lines: not a callgrind output file")


def _measure(side: str, cycles: int, workdir: Path, l2: tuple[int, int, int]) -> dict[str, int]:
    size, ways, line = l2
    out = workdir / f"{side}.callgrind"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=_operator_call*",
        "--cache-sim=yes",
        f"--LL={size},{ways},{line}",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "benchmarks.cachesim",
        "--side",
        side,
        "--cycles",
        str(cycles),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict and set layouts in every run
    root = Path(__file__).parent.parent
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, check=False)
    if done.returncode or not out.exists():
        raise RuntimeError(f"valgrind on side {side!r} failed (rc {done.returncode}): {done.stderr[-2000:]}")
    counts = totals(out.read_text())
    return {k: v // cycles for k, v in counts.items()}


def _l2_misses(counts: dict[str, int]) -> int:
    return counts["ILmr"] + counts["DLmr"] + counts["DLmw"]


def render(found: dict[str, dict[str, int]], cycles: int, l2: tuple[int, int, int], installed: int) -> str:
    """The report: ``found`` per side (counts per cycle), the simulated ``l2``, ``installed`` patches per block."""
    size, ways, line = l2
    rows = [
        "# The after-step cycle under a cache simulator",
        "",
        "Generated by `make bench-cachesim` (`python -m benchmarks.cachesim`); do not edit by hand. Per cycle "
        f"(mean of {cycles}), each cycle right after a training step of another model, every side interleaved. "
        f"Simulated: this machine's L1 caches, and its L2 ({size // 1024} KiB, {ways}-way, {line} B lines) as the "
        "last level: a line missed there is one a step evicted, fetched from L3 or memory. Counts, not times: "
        "they do not depend on the machine's load (between two runs they move by a few per cent: the layout of "
        "memory).",
        "",
        "| side | bytecode + C instructions | L1 misses (instruction / data) | L2 misses (instruction / data) "
        "| L2 misses, ours ÷ side |",
        "| --- | --- | --- | --- | --- |",
    ]
    ours = found.get("ours")
    for side, c in found.items():
        ratio = "-" if side == "ours" or ours is None else f"{_l2_misses(ours) / _l2_misses(c):.3f}x"
        rows.append(
            f"| {SIDES[side].format(n=installed)} | {c['Ir']:,} | {c['I1mr']:,} / {c['D1mr'] + c['D1mw']:,} "
            f"| {c['ILmr']:,} / {c['DLmr'] + c['DLmw']:,} | {ratio} |"
        )
    rows += [
        "",
        "- Instructions are the machine's (the interpreter's C code running the bytecode), not bytecode.",
        "- The engine-alone row is `Registry.patched` with the same set (no `mtp_patched` wrapper, no MTP report): "
        "the difference to ours is the patch set's own per-enter work.",
        "- The ratio of L2 misses is what the after-step rows of RESULTS.md section 1 time: compare it with their "
        "ratios in the run of every side.",
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cachesim", description=__doc__)
    parser.add_argument("--cycles", type=int, default=5, help="counted cycles per side (default 5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the report (default {DEFAULT_OUT})")
    parser.add_argument("--side", choices=sorted(SIDES), help=argparse.SUPPRESS)  # the child, under valgrind
    args = parser.parse_args(argv)
    if args.side:
        child(args.side, args.cycles)
        return 0
    if shutil.which("valgrind") is None:
        print("benchmarks.cachesim needs valgrind on the PATH (e.g. 'apt install valgrind').", file=sys.stderr)
        return 2
    l2 = l2_cache()
    with tempfile.TemporaryDirectory(prefix="cachesim") as tmp:
        workers = max(1, min(len(SIDES), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = {side: pool.submit(_measure, side, args.cycles, Path(tmp), l2) for side in SIDES}
            found = {side: future.result() for side, future in futures.items()}
    write(args.out, render(found, args.cycles, l2, probe()[0]), "cachesim")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
