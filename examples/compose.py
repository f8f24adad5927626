"""Compose three patch sets in one ExitStack on a tiny real Megatron-Core GPTModel, on CPU.

- ``cpu_patched()``: the CPU shims (Megatron-Core's CUDA RNG tracker and buffers on CPU);
- ``mtp_patched(model)``: Multi-Token Prediction for PPO (replaces the model's ``_postprocess``; on
  megatron-core 0.19.2 it sets ``config.mtp_detach_heads`` and rides upstream's RL mode instead);
- a user's own small patch set: two wraps, one of them on ``_postprocess``
  (wraps stack over the MTP replacement; a second *replace* of what the block replaced, or another
  value of its config flag, raises ``PatchConflictError`` naming both patches).

It prints the registry summary inside the block, then shows that every touched
namespace is exactly what it was before. Run: ``python examples/compose.py``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

warnings.filterwarnings("ignore", module=r"megatron\..*")  # "Apex is not installed" and friends

import torch.distributed as dist  # noqa: E402
from _tiny import batch, init_single_process, tiny_gpt  # noqa: E402  (examples/_tiny.py)

import patchreg  # noqa: E402
from patches.megatron import cpu_patched, mtp_patched  # noqa: E402
from patchreg import Patch, PatchSet  # noqa: E402

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
        if any(entry.patch == "rl_mode_forward" for entry in mtp.entries):  # 0.19.2: upstream's RL mode, our flag
            rival = Patch("rival-detach-heads", "config.mtp_detach_heads", True, kind="value")
        else:  # today's patches: our replacement of _postprocess
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
