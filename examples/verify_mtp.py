"""``verify_mtp`` on the demo's model (``examples/ppo_step.py``): the first thing to run on a new architecture.

One upstream step and one inside ``mtp_patched`` on the same model and batch, for each ``detach_encoder``:
logits against upstream's main head, per-depth MTP losses against upstream's tracker, the trunk's gradient
from the MTP loss (exactly 0 when detached), every MTP parameter trained. The model is left as it was found.
On your own model: build it as your trainer does, take one real batch, and
``print(verify_mtp(model, batch_kwargs, detach_encoder=...))``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import ppo_step
import torch.distributed as dist

from patches.megatron import cpu_patched, verify_mtp


def main() -> int:
    ppo_step.setup()
    with cpu_patched():  # on a GPU leave cpu_patched() out
        model = ppo_step.build_model()
        batch = ppo_step.rollout(0)
        kwargs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask", "labels", "loss_mask")}
        results = [verify_mtp(model, kwargs, detach_encoder=detach) for detach in (True, False)]
    for result in results:
        print(result)
    dist.destroy_process_group()
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
