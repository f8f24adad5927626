"""``python -m benchmarks._worker SIDE STEPS``: run one side's training steps alone and print its peak RSS as JSON.

Each side runs in its own fresh process so its peak resident set is its own (imports included).
"""

from __future__ import annotations

import json
import resource
import sys
import time
import warnings


def main(argv: list[str]) -> int:
    side, steps = argv[0], int(argv[1])
    warnings.filterwarnings("ignore")
    from benchmarks import _step

    model, batch = _step.model_and_batch()
    times = []
    with _step.cpu_block():
        if side == "patchreg":
            step = _step.ours_step(model, batch)
            for _ in range(steps):
                start = time.perf_counter_ns()
                step()
                times.append(time.perf_counter_ns() - start)
        else:
            from benchmarks._peers import load_verl

            verl, _ = load_verl()
            with _step.verl_applied(verl, model):
                step = _step.verl_step(model, batch)
                for _ in range(steps):
                    start = time.perf_counter_ns()
                    step()
                    times.append(time.perf_counter_ns() - start)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times.sort()
    print(json.dumps({"side": side, "peak_rss_kib": peak_kib, "median_step_ns": times[len(times) // 2]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
