"""``python scripts/route_cost.py``: on megatron-core 0.19.2, the enter + exit of ``mtp_patched(model,
detach_encoder=True)`` on the native route (upstream's RL mode: a config value and two wraps) against today's
patches (forced by answering the route's probe "no"), on the benchmarks' tiny GPTModel, interleaved in one process.

Prints the medians of five alternating rounds (each the best of seven repeats of 3,000 cycles), their ratio, how
many patches each route installs, and what one install more costs.
"""

from __future__ import annotations

import statistics
import sys
import timeit
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    warnings.filterwarnings("ignore")
    import patchreg
    from benchmarks import _model
    from patches.megatron import _native, mtp_patched

    model = _model.build(1)

    def cycle() -> None:
        with mtp_patched(model, detach_encoder=True):
            pass

    def measure() -> float:
        for _ in range(10):
            cycle()
        with mtp_patched(model, detach_encoder=True) as report:
            installs[len(rounds["native route"]) > len(rounds["today's patches"])] = report.installed
        return min(timeit.repeat(cycle, number=3000, repeat=7)) / 3000 * 1e6

    probe = _native._rl_mode_probe
    rounds: dict[str, list[float]] = {"native route": [], "today's patches": []}
    installs = [0, 0]  # the native route's, today's
    try:
        for _ in range(5):
            _native._rl_mode_probe = probe  # type: ignore[attr-defined]
            patchreg.refresh()
            rounds["native route"].append(measure())
            _native._rl_mode_probe = lambda: (False, "forced by scripts/route_cost.py")  # type: ignore[attr-defined]
            patchreg.refresh()
            rounds["today's patches"].append(measure())
    finally:
        _native._rl_mode_probe = probe  # type: ignore[attr-defined]
        patchreg.refresh()
    native, today = (statistics.median(v) for v in rounds.values())
    print(f"native route {native:.2f} µs, today's patches {today:.2f} µs, ratio {native / today:.3f}")
    n, t = installs
    if n != t:  # the routes install different numbers of patches: what one install more costs
        print(f"installs: native route {n}, today's patches {t}; per install more {(native - today) / (n - t):.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
