"""Helpers for the real-engine tests: environment, engine start/stop, prompts, vLLM's numbers summed."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LANE_FLAG = "PATCHREG_VLLM_ENGINE"
_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CACHE_ROOT": str(REPO / ".cache" / "vllm-cpu"),
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}
if os.environ.get(LANE_FLAG) == "1":  # set before vLLM is imported; the default lane's env is left alone
    for _key, _value in _ENV.items():
        os.environ.setdefault(_key, _value)

MAX_MODEL_LEN = 128
MAX_TOKENS = 24

#: Prompts (token ids) ending inside each byte range of the known-acceptance checkpoint, far enough from its
#: end that MAX_TOKENS greedy tokens stay inside it (two tokens: the MTP layer ignores position 0's token).
KNOWN_PROMPTS: dict[str, list[int]] = {
    "partial": [0x41, 0x42, 0x43],  # "ABC"
    "full": [0x82, 0x83],
    "never": [0xC3, 0xC4],
}


def shutdown_llm(llm: Any) -> None:
    """Stop an ``LLM``'s engine and free its KV cache before the next engine starts."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


@contextlib.contextmanager
def running_llm(model: Path, **engine_kwargs: Any) -> Iterator[Any]:
    """A real ``vllm.LLM`` on ``model`` (small context, eager mode), shut down on exit."""
    from vllm import LLM

    llm = LLM(model=str(model), max_model_len=MAX_MODEL_LEN, enforce_eager=True, seed=0, **engine_kwargs)
    try:
        yield llm
    finally:
        shutdown_llm(llm)


def greedy(max_tokens: int = MAX_TOKENS) -> Any:
    """Greedy sampling parameters, ignoring ``<|eos|>`` so every request makes ``max_tokens`` tokens."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def sampled_pair(max_tokens: int = MAX_TOKENS) -> Any:
    """``n=2`` sampling parameters (vLLM refuses ``n > 1`` for greedy requests)."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.5, n=2, max_tokens=max_tokens, ignore_eos=True, seed=1)


def token_prompt(ids: list[int]) -> Any:
    """A prompt given as token ids (the byte values of the tiny tokenizer)."""
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(ids))


def summed_to_dict(completions: Any) -> dict[str, Any]:
    """vLLM's own ``RequestSpecDecodeMetrics.to_dict()`` of each completion, counts summed over completions."""
    dicts = [c.spec_decode_metrics.to_dict() for c in completions]
    width = max(len(d["acceptance_histogram"]) for d in dicts)
    return {
        "num_draft_tokens": sum(d["num_draft_tokens"] for d in dicts),
        "num_accepted_draft_tokens": sum(d["num_accepted_draft_tokens"] for d in dicts),
        "num_spec_steps": sum(d["num_spec_steps"] for d in dicts),
        "acceptance_histogram": tuple(
            sum(d["acceptance_histogram"][j] for d in dicts if j < len(d["acceptance_histogram"])) for j in range(width)
        ),
        "num_sequences": len(dicts),
        "single": dicts[0] if len(dicts) == 1 else None,
    }


def ours_as_to_dict(stats: Any) -> dict[str, Any]:
    """Our ``SpecDecodeStats`` under the names of :func:`summed_to_dict`."""
    return {
        "num_draft_tokens": stats.num_draft_tokens,
        "num_accepted_draft_tokens": stats.num_accepted_tokens,
        "num_spec_steps": stats.num_verify_steps,
        "acceptance_histogram": stats.acceptance_histogram,
        "num_sequences": stats.num_sequences,
    }


def run_sync(name: str, root: Path, spec: dict[str, Any], sets: str | None, mp: str) -> dict[str, Any]:
    """One ``tests.vllm_engine.sync_run`` scenario in a fresh process: ``spec`` (its ``out`` set here) under
    ``PATCHREG_PATCHSETS=sets`` (unset for None) and ``VLLM_ENABLE_V1_MULTIPROCESSING=mp``; the result it wrote,
    checked written and not crashed (the log beside it in ``root``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PATCHREG_PATCHSETS", "VLLM_ALLOW_INSECURE_SERIALIZATION")}
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": mp, "PYTHONPATH": str(REPO)})
    if sets is not None:
        env["PATCHREG_PATCHSETS"] = sets
    out = root / f"{name}.json"
    (root / f"{name}.spec.json").write_text(json.dumps({**spec, "out": str(out)}))
    with open(root / f"{name}.log", "w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "tests.vllm_engine.sync_run", str(root / f"{name}.spec.json")],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=1200,
            check=False,
        )
    assert out.exists(), f"{name}: the runner wrote nothing (exit {done.returncode}); see {root / (name + '.log')}"
    result: dict[str, Any] = json.loads(out.read_text())
    assert "crashed" not in result, f"{name}: {result.get('crashed')}"
    return result


def run_all(run: Callable[[str], dict[str, Any]], names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``run(name)`` for every scenario, two at a time (each engine in its own fresh process): results by name."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, name) for name in names}
        return {name: f.result() for name, f in futures.items()}


def by_range(acceptance: dict[str, float]) -> bool:
    """Acceptance that follows the known checkpoint's byte ranges: every draft accepted on the full range, none on
    the never range, some on the partial one (the drafter holds the known weights)."""
    return acceptance["full"] == 1.0 and acceptance["never"] == 0.0 and 0.3 < acceptance["partial"] < 0.7


def one_record(status: Any) -> dict[str, Any]:
    """The one worker's record of a ``collective_rpc`` answer (a list with one entry per worker)."""
    assert isinstance(status, list) and len(status) == 1, status
    record: dict[str, Any] = status[0]
    return record
