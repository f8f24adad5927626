"""verl's vLLM rollout call sites under ``VERL_MTP``: the strict speculative config, per-request metrics, stats."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.verl.conftest import needs_verl

pytestmark = [needs_verl, pytest.mark.no_distributed]


@pytest.fixture(scope="module")
def server() -> Any:
    """verl's vllm_async_server module (imports vLLM: once per module)."""
    import verl.workers.rollout.vllm_rollout.vllm_async_server as server

    return server


@pytest.fixture
def applied(server: Any) -> Iterator[Any]:
    """VERL_MTP on the default registry for one test."""
    import patchreg
    from patches.verl import VERL_MTP

    with patchreg.patched(VERL_MTP) as report:
        yield report


def test_overrides_can_no_longer_replace_method_or_token_count(server: Any, applied: Any) -> None:
    """Where verl's builder lets an override replace num_speculative_tokens / method silently, ours refuses."""
    from verl.workers.rollout.vllm_rollout.utils import build_mtp_speculative_config as verls

    assert verls("mtp", 1, {"num_speculative_tokens": 3})["num_speculative_tokens"] == 3  # verl: silently 3
    with pytest.raises(ValueError, match=r"num_speculative_tokens=3, which contradicts num_speculative_tokens=1"):
        server.build_mtp_speculative_config("mtp", 1, {"num_speculative_tokens": 3})
    with pytest.raises(ValueError, match=r"rollout\.engine_kwargs\.vllm\.speculative_config sets method='ngram'"):
        server.build_mtp_speculative_config("mtp", 1, '{"method": "ngram"}')
    assert server.build_mtp_speculative_config("mtp", 2, {"num_speculative_tokens": 2, "max_model_len": None}) == {
        "method": "mtp",
        "num_speculative_tokens": 2,
    }


def test_mtp_server_args_ask_vllm_for_per_request_metrics(server: Any, applied: Any) -> None:
    """verl's build_cli_args_from_config gets per_request_spec_decode_metrics, and vLLM's own parser reads it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    spec = server.build_mtp_speculative_config("mtp", 1, None)
    cli = server.build_cli_args_from_config({"dtype": "bfloat16", "speculative_config": spec})
    assert cli[cli.index("--per_request_spec_decode_metrics") + 1] == "summary"
    parsed = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(cli)
    assert parsed.per_request_spec_decode_metrics == "summary"
    explicit = server.build_cli_args_from_config(
        {"speculative_config": spec, "per_request_spec_decode_metrics": "detailed"}
    )
    assert explicit.count("--per_request_spec_decode_metrics") == 1 and "detailed" in explicit
    assert "--per_request_spec_decode_metrics" not in server.build_cli_args_from_config({"dtype": "bfloat16"})


def _finished(metrics: Any) -> Any:
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.metrics.stats import RequestStateStats

    completion = CompletionOutput(0, "ab", [1, 2], None, None, finish_reason="stop", spec_decode_metrics=metrics)
    return RequestOutput("r", None, [0], None, [completion], finished=True, metrics=RequestStateStats())


def test_spec_decode_stats_arrive_where_verl_reads_them(server: Any, applied: Any) -> None:
    """After verl's extract_prompt_logprobs(output=final_res), final_res.metrics.request_spec_decode_stats is ours."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    from patches.vllm import spec_decode_stats

    recorded = RequestSpecDecodeMetrics.new(2)
    recorded.observe(num_draft_tokens=2, num_accepted=1)
    recorded.observe(num_draft_tokens=2, num_accepted=2)
    final_res = _finished(recorded)
    server.extract_prompt_logprobs(output=final_res, num_prompt_logprobs=None, result_dict={})
    stats = final_res.metrics.request_spec_decode_stats
    assert stats == spec_decode_stats(final_res)
    assert (stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_verify_steps) == (4, 3, 2)
    plain = _finished(None)  # no speculative decoding: nothing attached, verl skips its stats as before
    server.extract_prompt_logprobs(output=plain, num_prompt_logprobs=None, result_dict={})
    assert not hasattr(plain.metrics, "request_spec_decode_stats")


def test_without_the_set_verl_reads_nothing(server: Any) -> None:
    """Unpatched, verl's call path leaves request_spec_decode_stats absent: the stats never arrive (the bug)."""
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    recorded = RequestSpecDecodeMetrics.new(1)
    recorded.observe(num_draft_tokens=1, num_accepted=1)
    final_res = _finished(recorded)
    server.extract_prompt_logprobs(output=final_res, num_prompt_logprobs=None, result_dict={})
    assert getattr(final_res.metrics, "request_spec_decode_stats", None) is None
