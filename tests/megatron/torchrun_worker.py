"""One rank under torchrun: patchreg bootstrapped from the environment, MTP entered, assert_consistent.

torchrun has no initializer hook: a rank calls ``patchreg.bootstrap()`` first thing, and the variables
torchrun passes on reach every rank. ``RANK1_DISABLE`` stands for a node whose environment differs: rank 1
copies it to ``PATCHREG_DISABLE`` before patchreg is imported (the variable is read at import).
"""

from __future__ import annotations

import json
import os
import sys

if os.environ.get("RANK") == "1" and "RANK1_DISABLE" in os.environ:
    os.environ["PATCHREG_DISABLE"] = os.environ["RANK1_DISABLE"]

import patchreg

BOOTSTRAPPED = [r.set_name for r in patchreg.bootstrap()]


def main(out: str) -> None:
    """Enter mtp_patched on a tiny GPTModel, run a forward, and check that the ranks agree."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from patches.megatron import mtp_patched
    from patchreg.distributed import assert_consistent
    from tests.megatron.conftest import build_gpt, make_batch

    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1)
    result: dict[str, object] = {"bootstrapped": BOOTSTRAPPED}
    try:
        model, batch = build_gpt(), make_batch()
        with mtp_patched(model) as report:
            logits = model(*batch.args(), **batch.kwargs())
            result["shape"] = list(logits.shape)
            result["mtp_installed"] = report.installed
            result["cpu_installed"] = sum(1 for i in patchreg.registry.active() if i.state != "pending")
            try:
                result["consistent"] = assert_consistent()
            except patchreg.PatchError as exc:
                result["error"] = str(exc)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
