"""Compose three patch sets in one ExitStack on a tiny real Megatron-Core GPTModel, on CPU.

- ``cpu_patched()``: the CPU shims (Megatron-Core's CUDA RNG tracker and buffers on CPU);
- ``mtp_patched(model)``: Multi-Token Prediction for PPO (replaces the model's ``_postprocess``);
- a user's own small patch set: two wraps, one of them on the same ``_postprocess``
  (wraps stack over the MTP replacement; a second *replace* there would raise
  ``PatchConflictError`` naming both patches).

It prints the registry summary inside the block, then shows that every touched
namespace is exactly what it was before. Run: ``python examples/compose.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
import warnings
from pathlib import Path
from typing import Any

if importlib.util.find_spec("patches") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore", module=r"megatron\..*")  # "Apex is not installed" and friends

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import patchreg  # noqa: E402
from patches.megatron import cpu_patched, mtp_patched  # noqa: E402
from patchreg import Patch, PatchSet  # noqa: E402

VOCAB, SEQ, BATCH = 64, 8, 2
calls: list[str] = []


def count_decoder(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Count decoder forwards (a user's instrumentation)."""
    calls.append("decoder")
    return wrapped(*args, **kwargs)


def log_postprocess(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Record the shape of what the (MTP-patched) _postprocess returns."""
    out = wrapped(*args, **kwargs)
    calls.append(f"postprocess -> {tuple(out.shape)}")
    return out


MINE = PatchSet(
    "my-instrumentation",
    [
        Patch("count-decoder", "decoder.forward", count_decoder, kind="wrap"),
        Patch("log-postprocess", "_postprocess", log_postprocess, kind="wrap"),
    ],
    doc="A user's own wraps, stacked over whatever else is installed.",
)


def init_single_process() -> None:
    """torch.distributed on gloo with one rank, and Megatron-Core's parallel state for TP=PP=1."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def tiny_gpt() -> Any:
    """A one-layer GPTModel with one MTP layer, fp32, initialised on CPU."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as tp_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        mtp_num_layers=1,
        mtp_loss_scaling_factor=0.3,
    )
    spec = get_gpt_layer_local_spec()
    torch.manual_seed(0)
    tp_random.model_parallel_cuda_manual_seed(0)
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=2 * SEQ,
        mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
    )


def batch() -> dict[str, Any]:
    """Token ids, positions, a causal mask, labels and a loss mask."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {
        "input_ids": ids,
        "position_ids": torch.arange(SEQ).expand(BATCH, SEQ).contiguous(),
        "attention_mask": torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None],
        "labels": torch.roll(ids, -1, dims=1),
        "loss_mask": torch.ones(BATCH, SEQ),
    }


def namespaces(model: Any) -> list[tuple[str, Any, dict[str, Any]]]:
    """Every namespace the three sets touch, with a copy of it: (label, object, vars copy)."""
    from megatron.core import utils
    from megatron.core.tensor_parallel import random

    objects = [("GPTModel instance", model), ("decoder instance", model.decoder)]
    objects += [(f"mtp.layers[{i}] instance", layer) for i, layer in enumerate(model.mtp.layers)]
    objects += [("megatron.core.tensor_parallel.random", random), ("megatron.core.utils", utils)]
    objects += [("CudaRNGStatesTracker", random.CudaRNGStatesTracker), ("GlobalMemoryBuffer", utils.GlobalMemoryBuffer)]
    return [(label, obj, dict(vars(obj))) for label, obj in objects]


def unchanged(label: str, obj: Any, before: dict[str, Any]) -> bool:
    """True when vars(obj) holds the same keys bound to the same objects as before."""
    after = vars(obj)
    same = after.keys() == before.keys() and all(after[k] is v for k, v in before.items())
    print(f"  {label:<40} {'restored exactly' if same else 'CHANGED'}")
    return same


def main() -> int:
    """Apply the three sets, run one step, print the summary; then check everything is restored."""
    init_single_process()
    with cpu_patched():  # building the model needs the CPU RNG shims too
        model = tiny_gpt()
    before = namespaces(model)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cpu_patched())
        mtp = stack.enter_context(mtp_patched(model))
        rival = Patch("rival-postprocess", "_postprocess", lambda self, *args, **kwargs: None)
        try:  # another library's *replace* of the same attribute is refused, naming both patches
            patchreg.apply(rival, model)
        except patchreg.PatchConflictError as exc:
            print(f"refused: {exc}")
        mine = stack.enter_context(patchreg.patched(MINE, model))
        print(f"my set: {mine.installed} installed, skipped {list(mine.skipped)}")
        logits = model(**batch())
        print(f"logits {tuple(logits.shape)}; MTP losses per depth {[round(x, 3) for x in mtp.mtp_losses]}")
        print(f"calls seen by my wraps: {calls}")
        print(patchreg.registry)
        print(patchreg.registry.summary())
    print("\nafter the ExitStack:")
    print(patchreg.registry.summary())
    restored = all([unchanged(label, obj, snap) for label, obj, snap in before])
    with cpu_patched():  # CPU shims only: the model is upstream Megatron-Core again
        out = model(**batch())
    print(f"upstream model again: forward with labels returns the LM loss {tuple(out.shape)}, not logits")
    dist.destroy_process_group()
    return 0 if restored and not patchreg.registry.active() else 1


if __name__ == "__main__":
    raise SystemExit(main())
