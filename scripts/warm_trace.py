"""``python scripts/warm_trace.py``: the Python calls, and the modules they are in, of one ``mtp_patched`` enter +
exit on the benchmarks' tiny GPTModel and HybridModel, one and three MTP layers, CPU: the first on a fresh model
(cold: it resolves and keeps the plan) and the fifth on the same model (warm: it re-uses it).

Traced with ``sys.setprofile``; per model two lines, cold and warm: the calls and their modules, then the warm
calls in order. Both run the same install loop (``take``) and release loop (``release``); the cold one resolves
first (``make_plan``). The architecture guide quotes it.
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
