"""``python -m benchmarks._worker SIDE STEPS``: run one side's training steps alone and print its peak RSS as JSON.

Each side runs in its own fresh process so its peak resident set is its own (imports included).
``python -m benchmarks._worker predicates``: the first evaluation of the MTP set's predicates in a fresh
process (Megatron-Core imported, nothing evaluated yet), in ns, as JSON.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import warnings
from pathlib import Path


def _status_kib(field: str) -> int | None:
    """``VmRSS`` / ``VmHWM`` of this process from /proc/self/status, in KiB (None where unreadable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) so the steps' own peak can be read; Linux >= 4.0."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def first_use() -> int:
    """Import what a model needs, then time the first evaluation of every MTP predicate (ns)."""
    import gc
    import importlib

    for module in ("megatron.core.models.gpt.gpt_model", "megatron.core.transformer.multi_token_prediction"):
        importlib.import_module(module)  # as once a model exists; no patch set has evaluated anything yet
    from benchmarks.models import mtp_predicates

    preds, _ = mtp_predicates()
    gc.disable()
    start = time.perf_counter_ns()
    for pred in preds:
        pred.evaluate()
    elapsed = time.perf_counter_ns() - start
    gc.enable()
    print(json.dumps({"first_predicates_ns": elapsed}))
    return 0


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    if argv[0] == "predicates":
        return first_use()
    side, steps = argv[0], int(argv[1])
    from benchmarks import _step

    model, batch = _step.model_and_batch()
    times: list[int] = []
    with _step.cpu_block():
        if side == "patchreg":
            step = _step.ours_step(model, batch)
            before, reset = _status_kib("VmRSS"), _reset_peak()
            for _ in range(steps):
                start = time.perf_counter_ns()
                step()
                times.append(time.perf_counter_ns() - start)
        else:
            from benchmarks._peers import load_verl

            verl, _ = load_verl()
            with _step.verl_applied(verl, model):
                step = _step.verl_step(model, batch)
                before, reset = _status_kib("VmRSS"), _reset_peak()
                for _ in range(steps):
                    start = time.perf_counter_ns()
                    step()
                    times.append(time.perf_counter_ns() - start)
    steps_peak = _status_kib("VmHWM") if reset else None
    result = {
        "side": side,
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "rss_before_steps_kib": before,
        "steps_peak_kib": steps_peak,
        "median_step_ns": sorted(times)[len(times) // 2],
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
