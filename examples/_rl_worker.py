"""A vLLM worker extension for the RL loop's engine: the MTP drafter's tensors, written to a file on request.

``LLM(worker_extension_cls="examples._rl_worker.DrafterTensors")`` adds the method to each worker;
``llm.collective_rpc("rl_dump_drafter", args=(path,))`` calls it by name (no insecure serialization).
"""

from __future__ import annotations

from typing import Any


class DrafterTensors:
    """Mixed into vLLM's worker class: reads the drafter (``model_runner.get_draft_model()``)."""

    def rl_dump_drafter(self, path: str) -> list[str]:
        """Write every parameter of the MTP drafter (bf16, as held) to the safetensors file ``path``; their names."""
        from safetensors.torch import save_file

        runner: Any = self.model_runner  # type: ignore[attr-defined]
        draft = runner.get_draft_model()
        tensors = {name: p.detach().cpu().contiguous().clone() for name, p in draft.named_parameters() if p.numel()}
        save_file(tensors, path)
        return sorted(tensors)
