"""``python scripts/warm_trace.py``: the Python calls, and the modules they are in, of one warm ``mtp_patched`` enter +
exit (the fifth on the same model) on the benchmarks' tiny GPTModel and HybridModel, one and three MTP layers, CPU.

Traced with ``sys.setprofile``; a line per model: whether the block took the one-pass way (``clean``), the calls and
their modules, then the calls in order. The architecture guide's "The warm block" quotes it.
"""

from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def trace(model: Any, label: str) -> None:
    from patches.megatron import mtp_patched

    for _ in range(4):
        with mtp_patched(model, detach_encoder=True):
            pass
    calls: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append((Path(frame.f_code.co_filename).name, frame.f_code.co_name))

    sys.setprofile(profile)
    with mtp_patched(model, detach_encoder=True) as report:
        pass
    sys.setprofile(None)
    modules = collections.Counter(name for name, _f in calls)
    way = "one pass" if report.report.clean else "general way"
    print(f"{label}: {way}, {len(calls)} calls in {len(modules)} modules {dict(modules)}")
    print("   ", " ".join(f for _n, f in calls))


def main() -> int:
    warnings.filterwarnings("ignore")
    from benchmarks import _hybrid, _model

    for layers in (1, 3):
        trace(_model.build(layers), f"GPTModel, {layers} MTP layer(s)")
    if _hybrid.available():
        for layers in (1, 3):
            trace(_hybrid.build(layers), f"HybridModel, {layers} MTP layer(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
