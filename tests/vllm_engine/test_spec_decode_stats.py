"""spec_decode_stats and rollout_metrics on a running engine agree with vLLM's own numbers and mean what they say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patches.vllm import mtp_engine_kwargs, rollout_metrics, spec_decode_stats
from patches.vllm.checkpoints import greedy_chain
from tests.vllm_engine.engines import (
    KNOWN_PROMPTS,
    MAX_TOKENS,
    greedy,
    ours_as_to_dict,
    running_llm,
    sampled_pair,
    summed_to_dict,
    token_prompt,
)

#: (num_speculative_tokens, per_request_spec_decode_metrics) of the engines this module starts, one at a time.
ENGINES = [(1, "summary"), (2, "detailed"), (3, "summary")]


@pytest.fixture(scope="module", params=ENGINES, ids=[f"k{k}-{level}" for k, level in ENGINES])
def run(request: pytest.FixtureRequest, checkpoints: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """One engine on the known-acceptance checkpoint: its config, a greedy batch and an n=2 request."""
    k, level = request.param
    with running_llm(
        checkpoints["known"], **mtp_engine_kwargs(num_speculative_tokens=k, per_request_metrics=level)
    ) as llm:
        config = llm.llm_engine.vllm_config
        kinds = list(KNOWN_PROMPTS)
        greedy_outputs = llm.generate([token_prompt(KNOWN_PROMPTS[kind]) for kind in kinds], greedy(), use_tqdm=False)
        pair = llm.generate([token_prompt(KNOWN_PROMPTS["partial"])], sampled_pair(), use_tqdm=False)[0]
        yield {
            "k": k,
            "level": level,
            "speculative_config": config.speculative_config,
            "metrics_level": config.observability_config.per_request_spec_decode_metrics,
            "greedy": dict(zip(kinds, greedy_outputs, strict=True)),
            "pair": pair,
        }


def test_engine_kwargs_drive_llm_unchanged(run: dict[str, Any]) -> None:
    """LLM(**mtp_engine_kwargs(...)) starts an MTP engine with our k and metrics level, no key rewritten."""
    spec = run["speculative_config"]
    assert (spec.method, spec.num_speculative_tokens) == ("mtp", run["k"])
    assert run["metrics_level"] == run["level"]


def test_stats_equal_vllm_to_dict(run: dict[str, Any]) -> None:
    """For each greedy request, our stats are vLLM's RequestSpecDecodeMetrics.to_dict() numbers."""
    for kind, output in run["greedy"].items():
        ours, theirs = spec_decode_stats(output), summed_to_dict(output.outputs)
        assert ours is not None
        single = theirs.pop("single")
        print(f"\nk={run['k']} {run['level']} {kind}: ours {ours_as_to_dict(ours)} | vLLM to_dict() {single}")
        assert ours_as_to_dict(ours) == theirs
        assert ours.acceptance_rate == single["draft_acceptance_rate"]
        assert ours.mean_acceptance_length == single["mean_acceptance_length"]
        assert len(ours.acceptance_histogram) == run["k"] + 1 == single["num_spec_tokens"] + 1
        assert ("per_step_accepted" in single) == (run["level"] == "detailed")


def test_stats_sum_both_completions_of_an_n2_request(run: dict[str, Any]) -> None:
    """An n=2 request's stats are the sum of vLLM's to_dict() over its two completions."""
    output = run["pair"]
    assert len(output.outputs) == 2
    ours, theirs = spec_decode_stats(output), summed_to_dict(output.outputs)
    theirs.pop("single")
    assert ours is not None
    print(f"\nk={run['k']} {run['level']} n=2: ours {ours_as_to_dict(ours)} | vLLM to_dict() summed {theirs}")
    assert ours_as_to_dict(ours) == theirs
    assert ours.num_sequences == 2


def test_acceptance_is_known_by_construction(run: dict[str, Any]) -> None:
    """The known checkpoint accepts every draft, some drafts, or none, by the prompt's byte range."""
    stats = {kind: spec_decode_stats(out) for kind, out in run["greedy"].items()}
    k = run["k"]
    full, never, partial = stats["full"], stats["never"], stats["partial"]
    assert full is not None and never is not None and partial is not None
    assert full.acceptance_rate == 1.0 and full.acceptance_histogram[:k] == (0,) * k
    assert never.acceptance_rate == 0.0 and never.acceptance_histogram[1:] == (0,) * k
    assert 0.0 < partial.acceptance_rate < 1.0
    if k == 1:  # drafts are accepted and rejected in turn: half of them, give or take the first and last step
        assert abs(2 * partial.num_accepted_tokens - partial.num_verify_steps) <= 2


def test_speculative_greedy_output_is_the_targets_greedy_output(run: dict[str, Any]) -> None:
    """Spec-decoded greedy tokens are the target's own greedy chain (token + 1), whatever the acceptance."""
    for kind, output in run["greedy"].items():
        assert list(output.outputs[0].token_ids) == greedy_chain(KNOWN_PROMPTS[kind], MAX_TOKENS), kind


def test_rollout_metrics_equal_totals_from_vllm(run: dict[str, Any]) -> None:
    """rollout_metrics over the batch equals the totals and means computed from vLLM's to_dict() numbers."""
    outputs = [*run["greedy"].values(), run["pair"]]
    metrics = rollout_metrics([spec_decode_stats(o) for o in outputs])
    per_request = [summed_to_dict(o.outputs) for o in outputs]
    drafted = sum(r["num_draft_tokens"] for r in per_request)
    accepted = sum(r["num_accepted_draft_tokens"] for r in per_request)
    steps = sum(r["num_spec_steps"] for r in per_request)
    rates = [r["num_accepted_draft_tokens"] / r["num_draft_tokens"] for r in per_request]
    lengths = [1 + r["num_accepted_draft_tokens"] / r["num_spec_steps"] for r in per_request]
    assert metrics == pytest.approx(
        {
            "rollout/spec_num_requests": 4,
            "rollout/spec_num_requests_missing": 0,
            "rollout/spec_num_draft_tokens": drafted,
            "rollout/spec_num_accepted_tokens": accepted,
            "rollout/spec_num_verify_steps": steps,
            "rollout/spec_accept_rate": sum(rates) / 4,
            "rollout/spec_accept_length": sum(lengths) / 4,
            "rollout/spec_accept_rate_pooled": accepted / drafted,
            "rollout/spec_accept_length_pooled": 1 + accepted / steps,
        },
        rel=1e-12,
    )
