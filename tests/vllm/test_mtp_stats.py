"""spec_decode_stats / rollout_metrics on real vLLM RequestOutput objects carrying real RequestSpecDecodeMetrics."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import pytest

from patches.vllm import SpecDecodeStats, rollout_metrics, spec_decode_stats


@pytest.fixture(scope="module")
def vllm_outputs(vllm: Any) -> Any:
    """vLLM's output classes: (RequestOutput, CompletionOutput, RequestSpecDecodeMetrics)."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    return RequestOutput, CompletionOutput, RequestSpecDecodeMetrics


def observed(metrics_cls: Any, k: int, steps: list[tuple[int, int]], detailed: bool = False) -> Any:
    """A RequestSpecDecodeMetrics fed (drafted, accepted) per verify step, as vLLM's scheduler does."""
    metrics = metrics_cls.new(k)
    for drafted, accepted in steps:
        metrics.observe(num_draft_tokens=drafted, num_accepted=accepted, detailed=detailed)
    return metrics


def request(vllm_outputs: Any, *metrics: Any, finished: bool = True) -> Any:
    """A RequestOutput with one CompletionOutput per metrics value (None: the engine recorded none)."""
    request_cls, completion_cls, _ = vllm_outputs
    completions = [
        completion_cls(
            index=i,
            text="",
            token_ids=[1, 2, 3],
            cumulative_logprob=None,
            logprobs=None,
            finish_reason="length" if finished else None,
            spec_decode_metrics=m,
        )
        for i, m in enumerate(metrics)
    ]
    return request_cls("req-0", None, [0], None, completions, finished=finished)


def test_one_completion_matches_vllms_own_summary(vllm_outputs: Any) -> None:
    """Counts, rate and mean length equal what vLLM's RequestSpecDecodeMetrics.to_dict() reports."""
    metrics = observed(vllm_outputs[2], 3, [(3, 3), (3, 1), (3, 0), (3, 2)])
    stats = spec_decode_stats(request(vllm_outputs, metrics))
    expected = metrics.to_dict()
    assert stats == SpecDecodeStats(12, 6, 4, (1, 1, 1, 1), num_sequences=1)
    assert stats.num_verify_steps == expected["num_spec_steps"]
    assert stats.num_accepted_tokens == expected["num_accepted_draft_tokens"]
    assert stats.acceptance_rate == pytest.approx(expected["draft_acceptance_rate"])
    assert stats.mean_acceptance_length == pytest.approx(expected["mean_acceptance_length"])


@pytest.mark.parametrize(
    ("k", "steps", "accepted", "verify"),
    [
        (1, [(1, 1)] * 5 + [(1, 0)] * 3, 5, 8),
        (2, [(2, 2), (2, 2), (2, 0)], 4, 3),
        (4, [(4, 4), (4, 3), (2, 1), (4, 0), (1, 1)], 9, 5),
    ],
)
def test_histograms_give_verify_steps_and_accepted_tokens(
    vllm_outputs: Any, k: int, steps: list[tuple[int, int]], accepted: int, verify: int
) -> None:
    """Verify steps are the histogram's total and accepted tokens its weighted sum, for several shapes."""
    metrics = observed(vllm_outputs[2], k, steps)
    stats = spec_decode_stats(request(vllm_outputs, metrics))
    assert (stats.num_accepted_tokens, stats.num_verify_steps) == (accepted, verify)
    assert stats.num_draft_tokens == sum(d for d, _ in steps)
    assert stats.acceptance_histogram == tuple(metrics.histogram)


def test_completions_of_one_request_are_summed(vllm_outputs: Any) -> None:
    """With n > 1 completions the counts and histograms are summed (histograms padded to the longest)."""
    cls = vllm_outputs[2]
    a = observed(cls, 2, [(2, 2), (2, 1)])
    b = observed(cls, 3, [(3, 0), (3, 3), (3, 3)])
    c = observed(cls, 2, [])
    stats = spec_decode_stats(request(vllm_outputs, a, b, c))
    assert stats == SpecDecodeStats(13, 9, 5, (1, 1, 1, 2), num_sequences=3)


def test_detailed_level_agrees_with_summary(vllm_outputs: Any) -> None:
    """The 'detailed' level (per-step arrays as well) gives the same stats as 'summary'."""
    steps = [(2, 1), (2, 2), (1, 0)]
    summary = spec_decode_stats(request(vllm_outputs, observed(vllm_outputs[2], 2, steps)))
    detailed = spec_decode_stats(request(vllm_outputs, observed(vllm_outputs[2], 2, steps, detailed=True)))
    assert summary == detailed


def test_per_step_arrays_stand_in_for_a_missing_histogram(vllm_outputs: Any) -> None:
    """Metrics without a histogram (only the per-step arrays) still give steps and accepted tokens."""
    metrics = vllm_outputs[2](
        num_spec_tokens=2, num_draft_tokens=6, per_step_accepted=[2, 0, 1], per_step_drafted=[2, 2, 2]
    )
    stats = spec_decode_stats(request(vllm_outputs, metrics))
    assert (stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_verify_steps) == (6, 3, 3)


def test_no_verify_steps_gives_vllms_neutral_values(vllm_outputs: Any) -> None:
    """A request that never speculated has rate 0.0 and mean length 1.0, as vLLM reports it."""
    stats = spec_decode_stats(request(vllm_outputs, observed(vllm_outputs[2], 2, [])))
    assert stats == SpecDecodeStats(0, 0, 0, (0, 0, 0))
    assert (stats.acceptance_rate, stats.mean_acceptance_length) == (0.0, 1.0)


def test_absent_metrics_warn_once_then_stay_silent(
    vllm_outputs: Any, fresh_missing_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Without per-request metrics: None, one warning naming the remedy, then silence."""
    caplog.set_level(logging.WARNING, logger="patchreg.vllm")
    assert spec_decode_stats(request(vllm_outputs, None)) is None
    assert spec_decode_stats(request(vllm_outputs, None, None)) is None
    warnings = [r for r in caplog.records if r.name == "patchreg.vllm"]
    assert len(warnings) == 1
    assert "per_request_spec_decode_metrics='summary'" in warnings[0].getMessage()


def test_unfinished_output_returns_none_without_warning(
    vllm_outputs: Any, fresh_missing_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A streamed, unfinished output has no metrics yet: None and no warning."""
    caplog.set_level(logging.WARNING, logger="patchreg.vllm")
    assert spec_decode_stats(request(vllm_outputs, None, finished=False)) is None
    assert not caplog.records


def test_unfinished_request_with_some_finished_completions_counts_those(
    vllm_outputs: Any, fresh_missing_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    """An unfinished output (n > 1) counts its finished completions with metrics and skips running ones, quietly."""
    caplog.set_level(logging.WARNING, logger="patchreg.vllm")
    request_cls, completion_cls, metrics_cls = vllm_outputs
    done = request(vllm_outputs, observed(metrics_cls, 1, [(1, 1)])).outputs[0]
    running = completion_cls(
        index=1, text="", token_ids=[1], cumulative_logprob=None, logprobs=None, finish_reason=None
    )
    partial = request_cls("req-0", None, [0], None, [done, running], finished=False)
    assert spec_decode_stats(partial) == SpecDecodeStats(1, 1, 1, (0, 1), num_sequences=1)
    assert not caplog.records


def test_streamed_n2_request_reports_every_childs_final_completion(
    vllm_outputs: Any, fresh_missing_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Streamed with n=2, vLLM's ParentRequest sends each child's final completion in its own output (only the
    last finished=True); the stats over the stream cover both children."""
    import types

    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.parallel_sampling import ParentRequest

    caplog.set_level(logging.WARNING, logger="patchreg.vllm")
    request_cls, completion_cls, metrics_cls = vllm_outputs
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        params = SamplingParams(n=2, output_kind=kind)
        parent = ParentRequest(types.SimpleNamespace(request_id="r", external_req_id="r", params=params))
        children = [parent.get_child_info(i)[0] for i in range(2)]
        steps = {0: [(2, 2), (2, 1)], 1: [(2, 0)]}
        stream = []
        for index, child in enumerate(children):
            running = completion_cls(
                index=index, text="", token_ids=[1], cumulative_logprob=None, logprobs=None, finish_reason=None
            )
            final = completion_cls(
                index=index, text="", token_ids=[1], cumulative_logprob=None, logprobs=None,
                finish_reason="length", spec_decode_metrics=observed(metrics_cls, 2, steps[index]),
            )  # fmt: skip
            for completion in (running, final):
                outputs, finished = parent.get_outputs(child, completion)  # what vLLM's OutputProcessor calls
                stream.append(request_cls("r", None, [0], None, outputs, finished=finished))
        assert [o.finished for o in stream] == [False, False, False, True]
        stats = [spec_decode_stats(o) for o in stream]
        assert stats[0] is None and stats[2] is None  # still generating
        assert stats[1] == SpecDecodeStats(4, 3, 2, (0, 1, 1))
        assert stats[3] == SpecDecodeStats(2, 0, 1, (1, 0, 0))
        done = [spec_decode_stats(o) for o in stream if any(c.finish_reason for c in o.outputs)]
        metrics = rollout_metrics(done)
        assert (metrics["rollout/spec_num_draft_tokens"], metrics["rollout/spec_num_accepted_tokens"]) == (6, 3)
        assert metrics["rollout/spec_num_requests_missing"] == 0
    assert not caplog.records


def test_unfinished_output_with_a_finished_completion_without_metrics_warns(
    vllm_outputs: Any, fresh_missing_warning: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that finished without metrics means the engine records none, even before the request finishes."""
    caplog.set_level(logging.WARNING, logger="patchreg.vllm")
    partial = request(vllm_outputs, None)
    partial.finished = False
    assert spec_decode_stats(partial) is None
    assert "per_request_spec_decode_metrics" in caplog.text


def test_a_batch_is_a_type_error(vllm_outputs: Any) -> None:
    """Passing the list of outputs instead of one output raises TypeError with the fix."""
    with pytest.raises(TypeError, match=r"for a batch use \[spec_decode_stats\(o\) for o in outputs\]"):
        spec_decode_stats([request(vllm_outputs, observed(vllm_outputs[2], 1, [(1, 1)]))])


def test_a_finished_completion_without_metrics_makes_the_request_incomplete(
    vllm_outputs: Any, fresh_missing_warning: None
) -> None:
    """If one finished completion lacks metrics while another has them, the sum would undercount: None."""
    assert spec_decode_stats(request(vllm_outputs, observed(vllm_outputs[2], 1, [(1, 1)]), None)) is None


@pytest.mark.parametrize("thing", [None, object(), "text", {"outputs": []}])
def test_objects_without_outputs_never_raise(thing: Any, fresh_missing_warning: None) -> None:
    """Anything without completion outputs gives None instead of raising."""
    assert spec_decode_stats(thing) is None


def test_stats_record_is_frozen_and_validated() -> None:
    """SpecDecodeStats is immutable and rejects negative or non-int counts."""
    stats = SpecDecodeStats(4, 2, 2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.num_draft_tokens = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="num_verify_steps must be an int >= 0"):
        SpecDecodeStats(4, 2, -1)
    assert stats.as_extra_fields() == {
        "spec_num_draft_tokens": 4,
        "spec_num_accepted_tokens": 2,
        "spec_num_verify_steps": 2,
    }


def test_rollout_metrics_aggregates_a_batch() -> None:
    """Per-request means skip requests that never drafted; pooled ratios divide totals; None counts as missing."""
    batch = [SpecDecodeStats(10, 5, 5), SpecDecodeStats(2, 2, 1), SpecDecodeStats(0, 0, 0), None]
    metrics = rollout_metrics(batch)
    assert metrics["rollout/spec_num_requests"] == 3
    assert metrics["rollout/spec_num_requests_missing"] == 1
    assert metrics["rollout/spec_num_draft_tokens"] == 12
    assert metrics["rollout/spec_num_accepted_tokens"] == 7
    assert metrics["rollout/spec_num_verify_steps"] == 6
    assert metrics["rollout/spec_accept_rate"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["rollout/spec_accept_length"] == pytest.approx((2.0 + 3.0) / 2)
    assert metrics["rollout/spec_accept_rate_pooled"] == pytest.approx(7 / 12)
    assert metrics["rollout/spec_accept_length_pooled"] == pytest.approx(1 + 7 / 6)


def test_rollout_metrics_of_real_outputs(vllm_outputs: Any, fresh_missing_warning: None) -> None:
    """The batch path end to end: real RequestOutputs -> spec_decode_stats -> rollout_metrics."""
    cls = vllm_outputs[2]
    outs = [
        request(vllm_outputs, observed(cls, 2, [(2, 2), (2, 0)])),
        request(vllm_outputs, observed(cls, 2, [(2, 1)])),
    ]
    metrics = rollout_metrics((spec_decode_stats(o) for o in outs), prefix="mtp/")
    assert metrics["mtp/spec_accept_rate_pooled"] == pytest.approx(3 / 6)
    assert metrics["mtp/spec_accept_length"] == pytest.approx((2.0 + 2.0) / 2)


def test_rollout_metrics_without_stats_has_counts_only() -> None:
    """An empty or all-missing batch gives counts and no ratios (nothing to average)."""
    assert rollout_metrics([None, None]) == {
        "rollout/spec_num_requests": 0,
        "rollout/spec_num_requests_missing": 2,
        "rollout/spec_num_draft_tokens": 0,
        "rollout/spec_num_accepted_tokens": 0,
        "rollout/spec_num_verify_steps": 0,
    }
    assert "rollout/spec_accept_rate" not in rollout_metrics([])


def test_rollout_metrics_rejects_foreign_entries() -> None:
    """A raw vLLM metrics object or dict in the batch is a TypeError, not a silent zero."""
    with pytest.raises(TypeError, match="SpecDecodeStats or None"):
        rollout_metrics([{"num_draft_tokens": 3}])  # type: ignore[list-item]
