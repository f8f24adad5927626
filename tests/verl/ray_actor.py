"""A trainer-like Ray actor for tests/verl/test_ray.py: one process, gloo world of 1, a tiny GPTModel under MTP.

It is a plain class (the test wraps it with ``ray.remote``) in an importable module, so Ray's workers import it
by name. Nothing here applies a patch set: what is active comes from the bootstrap Ray's setup hook ran.
"""

from __future__ import annotations

import os
import socket
from typing import Any


class Trainer:
    """Holds a tiny GPTModel and an ``mtp_patched`` block entered across calls (as a training step would)."""

    def __init__(self) -> None:
        import patchreg._bootstrap

        # what the setup hook did before this __init__ ran
        self.held_at_init = sorted(patchreg._bootstrap._held)
        self.block: Any = None

    def enter(self) -> dict[str, Any]:
        """Start gloo (world of one) and parallel_state, build the model, enter mtp_patched, run one forward."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        import patchreg
        from patches.megatron import mtp_patched
        from patches.megatron._native import native  # 0.19.2: upstream's RL mode, no _postprocess install
        from tests.megatron.conftest import build_gpt, make_batch

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        model, batch = build_gpt(), make_batch()
        self.block = mtp_patched(model)
        report = self.block.__enter__()
        logits = model(*batch.args(), **batch.kwargs())
        return {
            "pid": os.getpid(),
            "held_at_init": self.held_at_init,
            "disable": os.environ.get("PATCHREG_DISABLE", ""),
            "active": patchreg.registry.is_active("rl_mode_forward" if native() else "postprocess", model),
            "installed": report.installed,
            "shape": list(logits.shape),
        }

    def leave(self) -> None:
        """Exit the block and tear down the process group."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        self.block.__exit__(None, None, None)
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
