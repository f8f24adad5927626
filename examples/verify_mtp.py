"""``verify_mtp`` on the demo's model: the first thing to run on a new architecture.

One upstream step and one inside ``mtp_patched`` on the same model and batch, for each ``detach_encoder``:
logits against upstream's main head, per-depth MTP losses against upstream's tracker, the trunk's gradient
from the MTP loss (exactly 0 when detached), every MTP parameter trained. The model is left as it was found.
On your own model: build it as your trainer does, take one real batch, and
``print(verify_mtp(model, batch_kwargs, detach_encoder=...))``. The same as ``python -m patches.megatron.demo
--verify`` (``patches/megatron/demo.py``: ``run_verify``).
"""

from __future__ import annotations

from patches.megatron.demo import main

if __name__ == "__main__":
    raise SystemExit(main(["--verify"]))
