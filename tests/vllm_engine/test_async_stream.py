"""A streamed AsyncLLM request with n=2: spec_decode_stats on each streamed output counts every finished completion."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from patches.vllm import SpecDecodeStats, mtp_engine_kwargs, rollout_metrics, spec_decode_stats
from tests.vllm_engine.engines import MAX_MODEL_LEN, ours_as_to_dict, sampled_pair, summed_to_dict, token_prompt


async def _stream(model: Path) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model),
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        seed=0,
        **mtp_engine_kwargs(num_speculative_tokens=3, per_request_metrics="detailed"),
    )
    engine = AsyncLLM.from_engine_args(args)
    params = sampled_pair()
    params.output_kind = RequestOutputKind.DELTA
    streamed, finished_completions = [], []
    try:
        async for output in engine.generate(token_prompt([0x41, 0x42, 0x43]), params, request_id="stream-n2"):
            streamed.append(spec_decode_stats(output))
            finished_completions += [c for c in output.outputs if c.finish_reason is not None]
    finally:
        engine.shutdown()
        del engine
        gc.collect()  # before interpreter exit, where AsyncLLM.__del__ would shut it down again
    return {"streamed": streamed, "finished": finished_completions}


@pytest.fixture(scope="module")
def stream(checkpoints: dict[str, Path]) -> dict[str, Any]:
    """One streamed (DELTA) n=2 request on an AsyncLLM engine (k=3, detailed) over the random-weight checkpoint."""
    return asyncio.run(_stream(checkpoints["random"]))


def test_every_finished_completion_is_counted(stream: dict[str, Any]) -> None:
    """Summing the stats of every streamed output gives both completions, equal to vLLM's to_dict() summed."""
    found = [s for s in stream["streamed"] if s is not None]
    assert len(stream["finished"]) == 2 and {c.index for c in stream["finished"]} == {0, 1}
    assert sum(s.num_sequences for s in found) == 2
    total = SpecDecodeStats(
        sum(s.num_draft_tokens for s in found),
        sum(s.num_accepted_tokens for s in found),
        sum(s.num_verify_steps for s in found),
        [sum(col) for col in zip(*(s.acceptance_histogram for s in found), strict=True)],
        num_sequences=2,
    )
    theirs = summed_to_dict(stream["finished"])
    theirs.pop("single")
    print(f"\nAsyncLLM k=3 detailed n=2 streamed: ours {ours_as_to_dict(total)} | vLLM to_dict() summed {theirs}")
    assert ours_as_to_dict(total) == theirs
    metrics = rollout_metrics(found)
    assert metrics["rollout/spec_num_draft_tokens"] == theirs["num_draft_tokens"]
    assert metrics["rollout/spec_num_requests_missing"] == 0


def test_unfinished_outputs_give_none_quietly(stream: dict[str, Any]) -> None:
    """Streamed outputs before a completion finishes give None: vLLM attaches the stats to the final output."""
    assert len(stream["streamed"]) > 2
    assert stream["streamed"][0] is None
