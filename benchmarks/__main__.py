"""``python -m benchmarks [--quick] [--out PATH]``: run every section and write the markdown report."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

from benchmarks import _machine
from benchmarks._report import Section, render, write
from benchmarks._settings import Settings

DEFAULT_OUT = Path(__file__).parent / "RESULTS.md"


def _quiet() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    logging.getLogger("megatron").setLevel(logging.ERROR)


def _run(number: int, title: str, build: Callable[[], Section | list[Section]]) -> list[Section]:
    start = time.perf_counter()
    print(f"[bench] section {number}: {title} ...", file=sys.stderr, flush=True)
    try:
        result = build()
    except Exception as exc:  # one broken section must not lose the others
        traceback.print_exc()
        result = Section(number, title, notes=[f"This section failed: {exc.__class__.__name__}: {exc}"])
    print(f"[bench] section {number} took {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return result if isinstance(result, list) else [result]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few repetitions; for the smoke test (about a minute)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"where to write the report (default {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    _quiet()
    settings = Settings.fast() if args.quick else Settings.full()
    started = time.perf_counter()

    from benchmarks import cycles, engine, models

    sections: list[Section] = []
    sections += _run(1, "enter + exit vs the peers", lambda: cycles.cycles(settings))
    sections += _run(2, "scaling", lambda: models.scaling(settings))
    sections += _run(3, "call overhead", lambda: engine.call_overhead(settings))
    sections += _run(
        4, "predicates", lambda: engine.predicates(settings, *models.mtp_predicates(), models.first_use_ns)
    )
    sections += _run(5, "training step", lambda: models.training_step(settings))
    sections += _run(6, "memory hygiene", lambda: models.hygiene(settings))
    from benchmarks import drafter_sync

    sections += _run(7, drafter_sync.TITLE, lambda: drafter_sync.drafter_sync(0 if args.quick else 15))
    sections.sort(key=lambda s: s.number)
    mode = "quick (`--quick`: few repetitions, figures indicative only)" if args.quick else "full"
    text = render(_machine.describe(), sections, mode=mode, seconds=time.perf_counter() - started)
    write(args.out, text, "bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
